"""Introspective packing: under overload, share a GPU when the profiles say it pays.

Greedy, as in the paper: the waiting job with the lowest profiled GPU utilisation goes onto
the GPU whose running job has the lowest utilisation, if their profiled memory fits. The pair is
then measured: if the two normalised throughputs (solo mini-batch time over packed mini-batch
time) add up to no more than time-slicing would give (1.0, plus ``min_gain``), the newcomer
is unpacked and the pair is not tried again. Packing is for overload only: a packed job takes
a free GPU of its server at its rounds, and (``spread``) free GPUs elsewhere a quantum after a
departure left them free (docs/decisions/0009).
"""

from __future__ import annotations

from collections.abc import Collection

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.config import PackingSettings
from gandiva.policies.gandiva.framework import Cycle, Mechanism
from gandiva.policies.gandiva.placement import free_elsewhere, gpus_on
from gandiva.policies.gandiva.shared import Decision, Shared, noting
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.state import Cluster, Job, JobStatus


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


class Packing(Mechanism):
    timers = {TimerKind.SPREAD: "on_spread"}

    def __init__(self, shared: Shared, settings: PackingSettings) -> None:
        self.s = shared
        self.min_gain = settings.min_gain
        self.spreads = settings.spread
        self.solo_mbt: dict[str, float] = {}  # a job's mini-batch time alone
        self.packed_mbt: dict[str, float] = {}  # ... and beside another, in a trial
        self.trials = Trials()
        self.bad_pairs: set[frozenset[str]] = set()  # pairs found wanting
        self.gains: list[float] = []  # every judged pair's summed normalised throughput
        self.packed_on: set[int] = set()  # servers it packed on (``spread_elsewhere``)
        self.profiled: dict[str, tuple[float | None, float | None]] = {}  # what samples said

    # ---- hooks --------------------------------------------------------------------------
    def observe(self, cluster: Cluster, event: E.Event, cycle: Cycle) -> Decision[None]:
        """A sample is remembered, and may end a trial; a job that outgrew its share of a GPU
        leaves it; a job stopping may end a trial."""
        if isinstance(event, E.ProfileSample):
            self.record(cluster, event)
            yield from self.judge(cluster)
        elif isinstance(event, E.OutOfMemory):
            yield from self.out_of_memory(cluster, cluster.jobs[event.job_id])
        elif isinstance(event, E.Departure):
            self.trials.changed(event.job_id)
        elif isinstance(event, E.Failure):
            self.trials.changed_all()

    def acted(self, action: A.JobAction) -> None:
        self.trials.changed(action.job_id)  # its trial may have ended

    def forget(self, job_id: str) -> None:
        self.solo_mbt.pop(job_id, None)
        self.packed_mbt.pop(job_id, None)
        self.trials.end(job_id)
        self.profiled.pop(job_id, None)

    def may_change(self, cluster: Cluster, sample: E.ProfileSample) -> bool:
        """It may if it can change packing: a first profile alone, a new memory or
        utilisation, or a sample of a packed job or a trial's. (Remembers what it saw.)"""
        job = cluster.jobs[sample.job_id]
        seen = (job.memory_gb, job.utilization)
        before = self.profiled.get(job.id)
        self.profiled[job.id] = seen
        if job.status is not JobStatus.RUNNING:
            return False  # packing ignores it
        return before != seen or self.may_act_on(cluster, job)

    def time_dependent(self) -> bool:
        return False

    def after_round(self, cluster: Cluster, servers: list[int], waits: dict[int, list[Job]]
                    ) -> Decision[Collection[int]]:
        """On each server of the round: a packed job takes a free GPU (``spread_out``), and
        the jobs left waiting are packed where they may (``try_pack``)."""
        book, left = self.s.book, []
        for server in servers:
            waiting = server in waits  # spreading out leaves it so
            if cluster.free_gpus(server):  # (most servers of a round have none)
                yield from self.spread_out(cluster, server)
            guests = self.guests(waits[server]) if waiting else None
            if guests:
                _, packed = yield from noting(self.try_pack(cluster, server, guests))
                waiting = not packed or book.has_waiting(server, cluster)
            if waiting:
                left.append(server)
        return left

    def on_spread(self, cluster: Cluster, server: int, cycle: Cycle) -> Decision[bool]:
        if self.packed_on and not len(self.s.waiting):
            yield from self.spread_elsewhere(cluster)
        return False

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        """After a departure or a join, arm a spread a quantum on if packed jobs could take
        free GPUs. (A departure while one is armed waits with it: it looks at every free GPU
        then, whichever departure freed it.)"""
        timers = self.s.timers
        if (isinstance(cycle.event, E.Departure | E.Join) and timers.when(TimerKind.SPREAD)
                is None and self.wants_spread(cluster)):
            timers.arm(cluster.now + self.s.quantum, TimerKind.SPREAD)
        return
        yield

    # ---- what it learns -----------------------------------------------------------------
    def record(self, cluster: Cluster, sample: E.ProfileSample) -> None:
        """Remember a job's solo mini-batch time, or its packed one during a trial."""
        job = cluster.jobs[sample.job_id]
        if job.status is not JobStatus.RUNNING:
            return
        if shares_gpu(cluster, job):
            self.packed_mbt[job.id] = sample.mini_batch_time
            self.trials.changed(job.id)
        else:
            self.solo_mbt[job.id] = sample.mini_batch_time
            self.packed_mbt.pop(job.id, None)

    def may_act_on(self, cluster: Cluster, job: Job) -> bool:
        """Could a sample of ``job`` lead to a pack or an unpack: it has no solo time yet, it is
        in a trial, or it shares a GPU?"""
        return (job.id not in self.solo_mbt or self.trials.involves(job.id)
                or shares_gpu(cluster, job))

    # ---- packing and judging ------------------------------------------------------------
    def may_pair(self, a: Job, b: Job, memory_gb: float) -> bool:
        """May ``a`` and ``b`` share a GPU of ``memory_gb``: their memory is known and fits,
        and they were not found wanting together?"""
        return (a.memory_gb is not None and b.memory_gb is not None
                and a.memory_gb + b.memory_gb <= memory_gb
                and frozenset((a.id, b.id)) not in self.bad_pairs)

    def guests(self, waiting: list[Job]) -> list[Job]:
        """The ``waiting`` jobs of a server that ``try_pack`` may pack: on one GPU, profiled
        (its memory known; its utilisation may not be, as on a MIG instance: it is packed
        on memory alone, and the trial still judges the pair), and in no trial (most rounds
        find none: the cheap test comes first)."""
        return [j for j in waiting if j.num_gpus == 1 and j.id in self.solo_mbt
                and j.memory_gb is not None and j.id not in self.trials]

    def try_pack(self, cluster: Cluster, server: int, waiting: list[Job]) -> Decision[None]:
        """Pack the ``waiting`` jobs of ``server`` (its ``guests``), least-utilised first,
        each onto the GPU of the least-utilised running job that shares no GPU yet, while
        memory fits; never onto a job of higher priority than the guest's (a packed job runs
        slower, and a job is never slowed for one of lower priority, as time-slicing never
        suspends one for it)."""
        book = self.s.book
        hosts = [cluster.jobs[j] for j in book.members[server]]
        hosts = [j for j in hosts if j.status is JobStatus.RUNNING and j.num_gpus == 1
                 and j.memory_gb is not None and not shares_gpu(cluster, j)]
        hosts.sort(key=_least_utilised)
        for guest in sorted(waiting, key=_least_utilised):
            for host in hosts:
                if self.s.tier(host) > self.s.tier(guest) or not self.may_pair(
                        guest, host, cluster.gpus[host.gpus[0]].memory_gb):
                    continue
                yield A.Pack(guest.id, host.gpus)
                self.packed_on.add(server)
                self.trials.start(guest.id, host.id)
                self.packed_mbt.pop(guest.id, None)
                self.packed_mbt.pop(host.id, None)
                book.last_start[guest.id] = cluster.now
                hosts.remove(host)
                break

    def judge(self, cluster: Cluster) -> Decision[None]:
        """Keep or undo each packing trial once both jobs have a packed profile sample. Only
        trials whose jobs changed since the last look are looked at (``Trials``)."""
        for guest_id, host_id in self.trials.take_changed():
            guest, host = cluster.jobs[guest_id], cluster.jobs[host_id]
            together = (guest.status is JobStatus.RUNNING and host.status is JobStatus.RUNNING
                        and set(guest.gpus) & set(host.gpus))
            if not together:
                self.trials.end(guest_id)
                continue
            if guest_id not in self.packed_mbt or host_id not in self.packed_mbt:
                continue
            rates = [self.solo_mbt[j.id] / self.packed_mbt[j.id] for j in (guest, host)]
            self.trials.end(guest_id)
            self.gains.append(sum(rates))
            if sum(rates) <= 1.0 + self.min_gain:  # no better than time-slicing
                self.bad_pairs.add(frozenset((guest_id, host_id)))
                yield from self._part(cluster, guest)

    def _part(self, cluster: Cluster, guest: Job) -> Decision[None]:
        """The guest leaves its GPU-mate to wait for its turn: its servers take a round at
        the next quantum (none was armed: it had been seated)."""
        yield A.Unpack(guest.id)
        servers = self.s.book.home.get(guest.id, ())
        if servers:
            self.s.timers.arm(self.s.next_round(cluster.now), TimerKind.SLICE, *servers)

    def out_of_memory(self, cluster: Cluster, job: Job) -> Decision[None]:
        """``job`` outgrew its share of a GPU it shares: it never pairs with its GPU-mates
        again, and leaves the GPU (to be time-sliced, and spread out as a GPU frees)."""
        if job.status is not JobStatus.RUNNING or not shares_gpu(cluster, job):
            return
        for g in job.gpus:
            for mate in cluster.gpus[g].jobs:
                if mate != job.id:
                    self.bad_pairs.add(frozenset((job.id, mate)))
        self.trials.end(job.id)
        yield from self._part(cluster, job)

    # ---- spreading out ------------------------------------------------------------------
    def spread_out(self, cluster: Cluster, server: int) -> Decision[None]:
        """When the server has a free GPU, a packed job takes it. The move stays on the
        server, so it is the fast path: suspend to host memory, resume on the free GPU."""
        if not cluster.free_gpus(server):
            return
        for gpu in cluster.nodes[server].gpus:
            jobs = cluster.gpus[gpu].jobs
            free = cluster.free_gpus(server)
            if len(jobs) > 1 and free:
                mover = cluster.jobs[jobs[-1]]
                if mover.num_gpus == 1:
                    yield from self._unpack_to(cluster, mover, (free[0],))

    def _unpack_to(self, cluster: Cluster, mover: Job, gpus: tuple[int, ...]) -> Decision[None]:
        """A packed job leaves its GPU-mate and resumes alone on ``gpus``."""
        yield A.Unpack(mover.id)
        yield A.Resume(mover.id, gpus)
        self.s.book.last_start[mover.id] = cluster.now
        self.trials.end(mover.id)

    def still_packed(self, cluster: Cluster) -> bool:
        """Forget the servers packed on with no packed GPU left (a pair parted, a job ended,
        the server failed); does any remain?"""
        for server in list(self.packed_on):
            if not any(len(cluster.gpus[g].jobs) > 1 for g in cluster.nodes[server].gpus):
                self.packed_on.discard(server)
        return bool(self.packed_on)

    def wants_spread(self, cluster: Cluster) -> bool:
        """After a departure: are there packed jobs and free GPUs for ``spread_elsewhere``
        (with no job waiting for a place, which the free GPUs are for)?"""
        return (self.spreads and bool(self.packed_on) and not len(self.s.waiting)
                and bool(cluster.free_count()) and self.still_packed(cluster))

    def spread_elsewhere(self, cluster: Cluster) -> Decision[None]:
        """GPUs free on servers with jobs, none waiting: packed jobs of other servers take
        them, each resuming there from its checkpoint (a free GPU of its own server first:
        ``spread_out``). An empty server is left empty: it is what a gang waits for."""
        book = self.s.book
        for server in sorted(self.packed_on):
            yield from self.spread_out(cluster, server)
            for gpu in cluster.nodes[server].gpus:
                jobs = cluster.gpus[gpu].jobs
                if len(jobs) < 2 or cluster.jobs[jobs[-1]].num_gpus != 1:
                    continue
                mover = cluster.jobs[jobs[-1]]
                dest = free_elsewhere(book, cluster, server, 1, with_jobs=True,
                                      may=self.s.may_go(mover, cluster))
                if dest is None:
                    continue
                yield from self._unpack_to(cluster, mover, gpus_on(cluster, dest, 1))
                book.assign(mover, (dest,))
        self.still_packed(cluster)


def _least_utilised(job: Job) -> tuple[bool, float, int]:
    """Packing's order: the least utilised first, those of unknown utilisation after."""
    return (job.utilization is None, job.utilization or 0.0, job.seq)
