"""Introspective packing: under overload, share a GPU when the profiles say it pays.

Greedy, as in the paper: the waiting job with the lowest profiled GPU utilisation goes onto
the GPU whose running job has the lowest utilisation, if their profiled memory fits. The pair is
then measured: if the two normalised throughputs (solo mini-batch time over packed mini-batch
time) add up to no more than time-slicing would give (1.0, plus ``pack_min_gain``), the newcomer
is unpacked and the pair is not tried again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gandiva import actions as A
from gandiva import events as E
from gandiva.state import Cluster, Job, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva


def shares_gpu(cluster: Cluster, job: Job) -> bool:
    return any(len(cluster.gpus[g].jobs) > 1 for g in job.gpus)


def observe(p: Gandiva, cluster: Cluster, sample: E.ProfileSample) -> None:
    """Remember a job's solo mini-batch time, or its packed one during a trial."""
    job = cluster.jobs[sample.job_id]
    if job.status is not JobStatus.RUNNING:
        return
    if shares_gpu(cluster, job):
        p.packed_mbt[job.id] = sample.mini_batch_time
        p.recheck_trials = True
    else:
        p.solo_mbt[job.id] = sample.mini_batch_time
        p.packed_mbt.pop(job.id, None)


def try_pack(p: Gandiva, cluster: Cluster, server: int) -> Iterator[A.Action]:
    """Pack waiting 1-GPU jobs of ``server``, least-utilised first, each onto the GPU of the
    least-utilised running job that shares no GPU yet, while memory fits."""
    waiting = [j for j in p.book.waiting(server, cluster)
               if j.num_gpus == 1 and j.id in p.solo_mbt and j.utilization is not None
               and j.memory_gb is not None and j.id not in p.trials]
    if not waiting:
        return
    hosts = [cluster.jobs[j] for j in p.book.members[server]]
    hosts = [j for j in hosts if j.status is JobStatus.RUNNING and j.num_gpus == 1
             and j.utilization is not None and j.memory_gb is not None
             and not shares_gpu(cluster, j)]
    hosts.sort(key=lambda j: (j.utilization, j.seq))
    for guest in sorted(waiting, key=lambda j: (j.utilization, j.seq)):
        for host in hosts:
            gpu = cluster.gpus[host.gpus[0]]
            if frozenset((guest.id, host.id)) in p.bad_pairs:
                continue
            if (guest.memory_gb or 0) + (host.memory_gb or 0) > gpu.memory_gb:
                continue
            yield A.Pack(guest.id, host.gpus)
            p.trials[guest.id] = host.id
            p.packed_mbt.pop(guest.id, None)
            p.packed_mbt.pop(host.id, None)
            p.book.last_start[guest.id] = cluster.now
            hosts.remove(host)
            break


def judge(p: Gandiva, cluster: Cluster) -> Iterator[A.Action]:
    """Keep or undo each packing trial once both jobs have a packed profile sample.

    Trials are looked at again only when a packed sample came, a job stopped or the policy
    acted since the last look (``recheck_trials``): most samples are solo ones, of
    time-sliced jobs, and most events between them change no trial (a round with nothing to
    rotate, an arrival that waits).
    """
    if not p.recheck_trials:
        return
    p.recheck_trials = False
    for guest_id, host_id in list(p.trials.items()):
        guest, host = cluster.jobs[guest_id], cluster.jobs[host_id]
        together = (guest.status is JobStatus.RUNNING and host.status is JobStatus.RUNNING
                    and set(guest.gpus) & set(host.gpus))
        if not together:
            del p.trials[guest_id]
            continue
        if guest_id not in p.packed_mbt or host_id not in p.packed_mbt:
            continue
        gain = sum(p.solo_mbt[j] / p.packed_mbt[j] for j in (guest_id, host_id))
        del p.trials[guest_id]
        p.pack_gains.append(gain)
        if gain <= 1.0 + p.pack_min_gain:
            p.bad_pairs.add(frozenset((guest_id, host_id)))
            yield A.Unpack(guest_id)
            p.recheck_trials = True


def spread_out(p: Gandiva, cluster: Cluster, server: int) -> Iterator[A.Action]:
    """When the server has a free GPU, a packed job takes it (packing is for overload only).

    The move stays on the server, so it is the fast path: suspend to host memory, resume on
    the free GPU (no checkpoint), as when time-slicing.
    """
    for gpu in cluster.nodes[server].gpus:
        jobs = cluster.gpus[gpu].jobs
        free = cluster.free_gpus(server)
        if len(jobs) > 1 and free:
            mover = cluster.jobs[jobs[-1]]
            if mover.num_gpus == 1:
                target = (free[0],)
                yield A.Unpack(mover.id)
                yield A.Resume(mover.id, target)
                p.book.last_start[mover.id] = cluster.now
                p.trials.pop(mover.id, None)
