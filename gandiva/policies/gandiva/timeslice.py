"""Time-slicing on an over-subscribed server: a round of suspends and resumes every quantum.

Each round gives the server's GPUs to its jobs in order: higher priority first (a job is never
suspended for a lower-priority one), then, by default, round-robin: the job that got a GPU
least recently goes first, so newcomers (never run) go first of all, which is what gives every
job early feedback. ``slice_order="las"`` orders by attained service instead (least first),
Tiresias' idea applied inside a server. Packed jobs take their turns like the others (the packing
step packs again after the round). A multi-GPU job is suspended and resumed as a whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gandiva import actions as A
from gandiva.policies.gandiva.placement import gpus_on
from gandiva.state import Cluster, Job, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva

# The paper: suspend+resume takes <100 ms for image models, ~1 s for large ones. Estimated
# from the job's profiled memory, the delay is charged back: the job's turn counts as having
# begun that much earlier, so the time lost to switching does not cost it its share.
SWITCH_FIXED_S, SWITCH_PER_GB_S = 0.05, 0.06


def switch_delay(job: Job) -> float:
    return SWITCH_FIXED_S + SWITCH_PER_GB_S * (job.memory_gb or 0.0)


def order_key(p: Gandiva, job: Job, now: float) -> tuple[float, float, int]:
    if p.slice_order == "las":
        turn = job.attained_at(now)
    else:
        turn = p.book.last_start.get(job.id, float("-inf"))
    return (-job.priority, turn, job.seq)


def free_elsewhere(p: Gandiva, cluster: Cluster, server: int, count: int) -> int | None:
    """A server other than ``server`` with ``count`` free GPUs and no job waiting for them."""
    for node in cluster.nodes:
        if (node.up and node.id != server and len(cluster.free_gpus(node.id)) >= count
                and not p.book.waiting(node.id, cluster)):
            return node.id
    return None


def rotate(p: Gandiva, cluster: Cluster, server: int) -> Iterator[A.Action]:
    """One round on ``server``: decide who runs for the next quantum and switch."""
    book, now = p.book, cluster.now
    jobs = [cluster.jobs[j] for j in book.members[server]]
    # a gang spread over servers keeps its GPUs; everything else takes its turn, packed jobs
    # too (a packed pair counts one GPU each here, so it can never crowd waiting jobs out)
    pinned = {j.id for j in jobs if j.status is JobStatus.RUNNING and len(book.home[j.id]) > 1}
    capacity = cluster.nodes[server].size - sum(
        1 for g in cluster.nodes[server].gpus if any(j in pinned for j in cluster.gpus[g].jobs))
    chosen: list[Job] = []
    for job in sorted((j for j in jobs if j.id not in pinned), key=lambda j: order_key(p, j, now)):
        if job.num_gpus <= capacity:
            chosen.append(job)
            capacity -= job.num_gpus
    keep = {j.id for j in chosen}
    for job in jobs:
        if job.status is JobStatus.RUNNING and job.id not in pinned and job.id not in keep:
            elsewhere = free_elsewhere(p, cluster, server, job.num_gpus)
            if elsewhere is not None and any(j.priority > job.priority for j in chosen):
                # a lower-priority job moves away rather than stop, where GPUs are free
                yield A.Migrate(job.id, gpus_on(cluster, elsewhere, job.num_gpus))
                book.assign(job, (elsewhere,))
            else:
                yield A.Suspend(job.id)
    for job in sorted(chosen, key=lambda j: -j.num_gpus):
        if job.status is JobStatus.RUNNING:
            continue
        gpus = gpus_on(cluster, server, job.num_gpus)
        if job.status is JobStatus.SUSPENDED:
            yield A.Resume(job.id, gpus)
            book.last_start[job.id] = now - switch_delay(job)
        else:
            yield A.Place(job.id, gpus)
            book.last_start[job.id] = now
