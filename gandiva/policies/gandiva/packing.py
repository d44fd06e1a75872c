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
from gandiva.policies.gandiva.placement import gpus_on
from gandiva.policies.gandiva.timeslice import free_elsewhere
from gandiva.state import Cluster, Job, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva


RULES = ("gain", "jct")  # what a packed pair must beat (``pays``)


class Trials:
    """Packing trials awaiting judgement (guest -> host, in the order they began), and the jobs
    that changed since they were last looked at: a packed sample came, the policy acted on
    the job, or it stopped. Only a trial with a changed job can have ended or become
    judgeable, so a look costs the changes, not the trials (thousands on a big cluster)."""

    def __init__(self) -> None:
        self.host: dict[str, str] = {}  # guest -> host
        self._guests: dict[str, set[str]] = {}  # host -> guests (a stale trial lingers
        # beside a new one on the same host until it is looked at)
        self._seq: dict[str, int] = {}  # guest -> when its trial began
        self._next = 0
        self._changed: set[str] = set()
        self._all = False

    def __contains__(self, guest: str) -> bool:
        return guest in self.host

    def involves(self, job_id: str) -> bool:
        """Is the job in a trial, as guest or host?"""
        return job_id in self.host or job_id in self._guests

    def start(self, guest: str, host: str) -> None:
        self.host[guest] = host
        self._guests.setdefault(host, set()).add(guest)
        self._seq[guest] = self._next
        self._next += 1

    def end(self, guest: str) -> None:
        host = self.host.pop(guest, None)
        if host is not None:
            del self._seq[guest]
            self._guests[host].discard(guest)
            if not self._guests[host]:
                del self._guests[host]

    def changed(self, job_id: str) -> None:
        if self.host:
            self._changed.add(job_id)

    def changed_all(self) -> None:
        self._all = bool(self.host)

    def take_changed(self) -> list[tuple[str, str]]:
        """The trials with a changed job, in the order they began; forgets the changes."""
        if self._all:
            guests = list(self.host)
        else:
            guests = sorted({g for j in self._changed
                             for g in ({j} & self.host.keys()) | self._guests.get(j, set())},
                            key=self._seq.__getitem__)
        self._changed, self._all = set(), False
        return [(g, self.host[g]) for g in guests]


def shares_gpu(cluster: Cluster, job: Job) -> bool:
    return any(len(cluster.gpus[g].jobs) > 1 for g in job.gpus)


def observe(p: Gandiva, cluster: Cluster, sample: E.ProfileSample) -> None:
    """Remember a job's solo mini-batch time, or its packed one during a trial."""
    job = cluster.jobs[sample.job_id]
    if job.status is not JobStatus.RUNNING:
        return
    if shares_gpu(cluster, job):
        p.packed_mbt[job.id] = sample.mini_batch_time
        p.trials.changed(job.id)
    else:
        p.solo_mbt[job.id] = sample.mini_batch_time
        p.packed_mbt.pop(job.id, None)


def may_pair(p: Gandiva, a: Job, b: Job, memory_gb: float) -> bool:
    """May ``a`` and ``b`` share a GPU of ``memory_gb``: their memory fits, and they were not
    found wanting together?"""
    return ((a.memory_gb or 0) + (b.memory_gb or 0) <= memory_gb
            and frozenset((a.id, b.id)) not in p.bad_pairs)


def guests(p: Gandiva, waiting: list[Job]) -> list[Job]:
    """The ``waiting`` jobs of a server that ``try_pack`` may pack: on one GPU, profiled, and
    in no trial (most rounds find none: the cheap test comes first)."""
    return [j for j in waiting if j.num_gpus == 1 and j.id in p.solo_mbt
            and j.utilization is not None and j.memory_gb is not None
            and j.id not in p.trials]


def try_pack(p: Gandiva, cluster: Cluster, server: int, waiting: list[Job]
             ) -> Iterator[A.Action]:
    """Pack the ``waiting`` jobs of ``server`` (its ``guests``), least-utilised first, each
    onto the GPU of the least-utilised running job that shares no GPU yet, while memory fits.

    Decision: never onto a job of higher priority than the guest's. A packed job runs slower
    (its GPU, or here its CPU cores, are shared), and a job is never slowed for one of lower
    priority, as time-slicing never suspends one for it: a sweep's promoted trials share
    their devices with no trial below them (the paper's AutoML ran its top configurations
    exclusively), where a trial let through for want of company was packed beside them."""
    hosts = [cluster.jobs[j] for j in p.book.members[server]]
    hosts = [j for j in hosts if j.status is JobStatus.RUNNING and j.num_gpus == 1
             and j.utilization is not None and j.memory_gb is not None
             and not shares_gpu(cluster, j)]
    hosts.sort(key=lambda j: (j.utilization, j.seq))
    for guest in sorted(waiting, key=lambda j: (j.utilization, j.seq)):
        for host in hosts:
            if host.priority > guest.priority or not may_pair(
                    p, guest, host, cluster.gpus[host.gpus[0]].memory_gb):
                continue
            yield A.Pack(guest.id, host.gpus)
            p.packed_on.add(server)
            p.trials.start(guest.id, host.id)
            p.packed_mbt.pop(guest.id, None)
            p.packed_mbt.pop(host.id, None)
            p.book.last_start[guest.id] = cluster.now
            hosts.remove(host)
            break


def judge(p: Gandiva, cluster: Cluster) -> Iterator[A.Action]:
    """Keep or undo each packing trial once both jobs have a packed profile sample.

    Only trials whose jobs changed since the last look are looked at (``Trials``).
    """
    for guest_id, host_id in p.trials.take_changed():
        guest, host = cluster.jobs[guest_id], cluster.jobs[host_id]
        together = (guest.status is JobStatus.RUNNING and host.status is JobStatus.RUNNING
                    and set(guest.gpus) & set(host.gpus))
        if not together:
            p.trials.end(guest_id)
            continue
        if guest_id not in p.packed_mbt or host_id not in p.packed_mbt:
            continue
        rates = [p.solo_mbt[j.id] / p.packed_mbt[j.id] for j in (guest, host)]
        p.trials.end(guest_id)
        p.pack_gains.append(sum(rates))
        if not pays(p, cluster, (guest, host), rates):
            p.bad_pairs.add(frozenset((guest_id, host_id)))
            yield A.Unpack(guest_id)


def pays(p: Gandiva, cluster: Cluster, pair: tuple[Job, Job], rates: list[float]) -> bool:
    """Does a packed ``pair`` pay, given each job's normalised throughput beside the other?

    "gain" (the paper's): the two add up to more than time-slicing's 1.0, by
    ``pack_min_gain``. "jct": the pair lowers the mean JCT, against running the two one after
    the other, the one with less attained service (LAS's guess at the shorter) first, with
    ``k`` jobs queued behind them for the GPU. With remaining work ``a`` <= ``b`` (solo
    seconds) and rates ``ra``, ``rb``: one after the other, the two end at ``a`` and
    ``a + b``, and so does the GPU; packed, at ``a / ra`` and ``a / ra + b - a rb / ra``. The
    sum of the JCTs changes by ``a / ra * ((2 - 2 ra - rb) + k (1 - ra - rb))``, so packing
    pays when ``2 ra + rb + k (ra + rb) > 2 + k``, whatever ``a`` and ``b``. Alone (k = 0)
    two equal rates must pass 4/3; behind a long queue the rule becomes the paper's.
    ``k``: the jobs waiting in the cluster per GPU up (they share every GPU)."""
    if p.pack_rule == "gain":
        return sum(rates) > 1.0 + p.pack_min_gain
    a, b = pair
    first, second = rates if (a.attained_at(cluster.now), a.seq) <= (
        b.attained_at(cluster.now), b.seq) else rates[::-1]
    k = (len(cluster.queue) + len(cluster.suspended)) / max(cluster.up_gpus(), 1)
    return 2 * first + second + k * (first + second) > (2 + k) * (1.0 + p.pack_min_gain)


def spread_out(p: Gandiva, cluster: Cluster, server: int) -> Iterator[A.Action]:
    """When the server has a free GPU, a packed job takes it (packing is for overload only).

    The move stays on the server, so it is the fast path: suspend to host memory, resume on
    the free GPU (no checkpoint), as when time-slicing.
    """
    if not cluster.free_gpus(server):
        return
    for gpu in cluster.nodes[server].gpus:
        jobs = cluster.gpus[gpu].jobs
        free = cluster.free_gpus(server)
        if len(jobs) > 1 and free:
            mover = cluster.jobs[jobs[-1]]
            if mover.num_gpus == 1:
                yield from unpack_to(p, cluster, mover, (free[0],))


def unpack_to(p: Gandiva, cluster: Cluster, mover: Job, gpus: tuple[int, ...]
              ) -> Iterator[A.Action]:
    """A packed job leaves its GPU-mate and resumes alone on ``gpus``."""
    yield A.Unpack(mover.id)
    yield A.Resume(mover.id, gpus)
    p.book.last_start[mover.id] = cluster.now
    p.trials.end(mover.id)


def still_packed(p: Gandiva, cluster: Cluster) -> bool:
    """Forget the servers of ``Gandiva.packed_on`` with no packed GPU left (a pair parted, a
    job ended, the server failed); does any remain?"""
    for server in list(p.packed_on):
        if not any(len(cluster.gpus[g].jobs) > 1 for g in cluster.nodes[server].gpus):
            p.packed_on.discard(server)
    return bool(p.packed_on)


def spread_elsewhere(p: Gandiva, cluster: Cluster) -> Iterator[A.Action]:
    """GPUs free on servers with jobs, none waiting: packed jobs of other servers take them
    (``spread_packed``, a quantum after a departure left GPUs free, if they are still free
    and no job waits for a place), each resuming there from its checkpoint (a free GPU of its
    own server first: ``spread_out``, the fast path). An empty server is left empty: it is
    what a gang waits for. Looks only at the servers packing packed on
    (``Gandiva.packed_on``)."""
    for server in sorted(p.packed_on):
        yield from spread_out(p, cluster, server)
        for gpu in cluster.nodes[server].gpus:
            jobs = cluster.gpus[gpu].jobs
            if len(jobs) < 2 or cluster.jobs[jobs[-1]].num_gpus != 1:
                continue
            dest = free_elsewhere(p, cluster, server, 1, with_jobs=True)
            if dest is None:
                continue
            mover = cluster.jobs[jobs[-1]]
            yield from unpack_to(p, cluster, mover, gpus_on(cluster, dest, 1))
            p.book.assign(mover, (dest,))
    still_packed(p, cluster)
