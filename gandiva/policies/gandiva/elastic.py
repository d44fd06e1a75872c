"""Grow and shrink for jobs that opt in (``min_gpus``/``max_gpus`` in their spec).

A job grows into GPUs of its own server that have stayed idle for ``grow_idle_s`` while nothing
waits; it shrinks back to the width it asked for as soon as new work needs those GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gandiva import actions as A
from gandiva.state import Cluster, Job, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva


def note_idle(p: Gandiva, cluster: Cluster, servers: set[int]) -> None:
    """Start the idle clock of servers that have free GPUs and an elastic job to grow."""
    for s in servers:
        if cluster.free_gpus(s) and _growable(p, cluster, s) and s not in p.idle_since:
            p.idle_since[s] = cluster.now
            p.timer(cluster.now + p.grow_idle_s, "grow", s)


def _growable(p: Gandiva, cluster: Cluster, server: int) -> list[Job]:
    out = []
    for jid in p.book.members[server]:
        job = cluster.jobs[jid]
        hi = job.spec.max_gpus or job.num_gpus
        if job.status is JobStatus.RUNNING and len(job.gpus) < hi and len(p.book.home[jid]) == 1:
            out.append(job)
    return out


def grow(p: Gandiva, cluster: Cluster, server: int) -> Iterator[A.Action]:
    """Give idle GPUs of ``server`` to its elastic jobs, if they stayed idle long enough."""
    since = p.idle_since.pop(server, None)
    if since is None or cluster.now - since < p.grow_idle_s - 1e-9 or p.unassigned:
        return
    if p.book.has_waiting(server, cluster):
        return
    for job in sorted(_growable(p, cluster, server), key=lambda j: j.seq):
        free = cluster.free_gpus(server)
        if not free:
            return
        hi = job.spec.max_gpus or job.num_gpus
        extra = tuple(free[: hi - len(job.gpus)])
        yield A.Grow(job.id, tuple(sorted(job.gpus + extra)))


def shrink_for(p: Gandiva, cluster: Cluster, need: Job) -> Iterator[A.Action]:
    """Shrink grown jobs on one server so that ``need`` fits there; nothing if none can."""
    for server in range(len(cluster.nodes)):
        if not cluster.nodes[server].up or cluster.nodes[server].size < need.num_gpus:
            continue
        grown = [cluster.jobs[j] for j in p.book.members[server]
                 if cluster.jobs[j].status is JobStatus.RUNNING
                 and len(cluster.jobs[j].gpus) > cluster.jobs[j].num_gpus]
        spare = sum(len(j.gpus) - j.num_gpus for j in grown)
        if not grown or len(cluster.free_gpus(server)) + spare < need.num_gpus:
            continue
        for job in grown:
            yield A.Shrink(job.id, job.gpus[: job.num_gpus])
            if len(cluster.free_gpus(server)) >= need.num_gpus:
                break
        return
