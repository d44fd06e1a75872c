"""``las``: Tiresias' discretised two-dimensional least-attained-service, with preemption and
consolidated gangs.

Attained service is GPUs x time run (the "2D" of Tiresias, Gu et al., NSDI 2019). Jobs sit in
priority levels cut at ``queue_limits`` GPU-seconds; within a level, first come first served.
The GPUs go greedily to the jobs in that order; a running job that falls behind a waiting one
is preempted (suspended at a mini-batch boundary) to make room.

A gang starts only on the fewest servers that can hold it (one server if it fits in one), as
Tiresias places the models whose tensors are skewed; until such room is free, or can be made
by suspending jobs it outranks, it waits and the jobs behind it go ahead. (Tiresias profiles
skew; this scheduler sees no tensors, and in our performance model 17 of Gavel's 19
distributed jobs lose 13-78% spread over two servers, so every gang is treated as skewed:
decision 0035.)
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator
from sortedcontainers import SortedList

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import Options as PolicyOptions
from gandiva.policies.placement import best_fit, pick_in_server
from gandiva.state import Cluster, Job, JobStatus

Key = tuple[int, float, int, str]  # (level, submit time, arrival seq, job id)

# 1 and 10 GPU-hours: most Philly jobs (median 19 min) finish in the top level; long jobs
# sink below newcomers, which is what gives LAS its short mean JCT.
QUEUE_LIMITS = (3_600.0, 36_000.0)
# GPU-seconds: float rounding at a limit must not keep a job below it (nor re-arm the same
# timer for ever)
LEVEL_TOLERANCE = 1e-6


def level(attained: float, limits: tuple[float, ...] = QUEUE_LIMITS) -> int:
    """The attained-service level of a job with ``attained`` GPU-seconds (0: the first), at
    ``limits``: the rule of this policy and of the gandiva policy's ``levels`` order."""
    return bisect_right(limits, attained + LEVEL_TOLERANCE)


class Options(PolicyOptions):
    queue_limits: tuple[float, ...] = QUEUE_LIMITS  # GPU-seconds; a spec writes 3600/36000
    max_scan: int = Field(256, ge=1)

    @field_validator("queue_limits", mode="before")
    @classmethod
    def _slashes(cls, value: Any) -> Any:
        return tuple(x for x in value.split("/") if x) if isinstance(value, str) else value


@dataclass
class Las:
    queue_limits: tuple[float, ...] = QUEUE_LIMITS
    max_scan: int = 256  # waiting jobs examined per decision beyond those started
    name: str = "las"
    spec: str = "las"
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _key: dict[str, Key] = field(default_factory=dict, repr=False)
    _running: SortedList = field(default_factory=SortedList, repr=False)
    _waiting: SortedList = field(default_factory=SortedList, repr=False)
    _crossings: list[tuple[float, str]] = field(default_factory=list, repr=False)
    _wake: float = -1.0
    _shares: dict[str, tuple[tuple[int, ...], dict[int, int]]] = field(default_factory=dict,
                                                                       repr=False)

    def level(self, attained: float) -> int:
        return level(attained, self.queue_limits)

    def decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        if isinstance(event, E.ProfileSample):
            return
        self._observe(event, cluster)  # (a server that joined changes no job's level)
        if self._waiting and self._running and self._waiting[0] < self._running[-1]:
            yield from self._reorder(cluster)
        else:
            yield from self._fill(cluster)
        if self._crossings and self._crossings[0][0] != self._wake:
            self._wake = self._crossings[0][0]
            yield A.Wake(self._wake)

    # ---- bookkeeping ----------------------------------------------------------------------
    def _observe(self, event: E.Event, cluster: Cluster) -> None:
        if isinstance(event, E.Arrival):
            job = cluster.jobs[event.job.id]
            key = (0, job.spec.submit_time, job.seq, job.id)
            self._key[job.id] = key
            self._waiting.add(key)
        elif isinstance(event, E.Departure):  # finished, or cancelled even while waiting
            key = self._key.pop(event.job_id)
            self._shares.pop(event.job_id, None)
            self._running.discard(key)
            self._waiting.discard(key)
        elif isinstance(event, E.Failure):
            for jid in list(self._key):
                self._move(cluster.jobs[jid], cluster.now)
        while self._crossings and self._crossings[0][0] <= cluster.now:
            _, jid = heapq.heappop(self._crossings)
            job = cluster.jobs[jid]
            if job.status is JobStatus.RUNNING:
                self._move(job, cluster.now)

    def _move(self, job: Job, now: float) -> None:
        """Re-file ``job`` under its current level and status; plan its next demotion."""
        old = self._key[job.id]
        (self._running if old in self._running else self._waiting).remove(old)
        attained = job.attained_at(now)
        key = (self.level(attained), *old[1:])
        self._key[job.id] = key
        running = job.status is JobStatus.RUNNING
        (self._running if running else self._waiting).add(key)
        if running and key[0] < len(self.queue_limits):
            at = now + (self.queue_limits[key[0]] - attained) / len(job.gpus)
            heapq.heappush(self._crossings, (at, job.id))

    # ---- decisions ------------------------------------------------------------------------
    @staticmethod
    def _fewest(cluster: Cluster, count: int) -> int:
        """How many servers a gang of ``count`` spans when consolidated (the state's biggest
        bucket of free GPUs is the biggest server's size)."""
        return -(-count // cluster.max_free_bucket)

    def _start(self, cluster: Cluster, job: Job, gpus: tuple[int, ...]) -> Iterator[A.Action]:
        if job.status is JobStatus.SUSPENDED:
            yield A.Resume(job.id, gpus)
        else:
            yield A.Place(job.id, gpus)
        self._move(job, cluster.now)

    def _fill(self, cluster: Cluster) -> Iterator[A.Action]:
        """No waiting job outranks a running one: hand free GPUs to waiting jobs in order,
        each gang only where it is consolidated."""
        free = cluster.free_count()
        i = 0
        while free > 0 and i < min(self.max_scan, len(self._waiting)):
            job = cluster.jobs[self._waiting[i][3]]
            gpus = best_fit(cluster, job.num_gpus) if job.num_gpus <= free else None
            if gpus is None or len(cluster.servers_of(gpus)) > self._fewest(
                    cluster, job.num_gpus):
                i += 1
                continue
            free -= job.num_gpus
            yield from self._start(cluster, job, gpus)

    def _reorder(self, cluster: Cluster) -> Iterator[A.Action]:
        """Greedy in LAS order over all jobs, each waiting one placed consolidated in a plan of
        the cluster; running jobs whose GPUs the plan gives to jobs ahead of them are
        suspended."""
        # the running jobs ahead of every waiting one stay where they are: the plan starts
        # from what they leave
        behind = list(self._running.islice(self._running.bisect_left(self._waiting[0])))
        plan = _Plan(cluster, behind, self._shares)
        starts: list[tuple[Job, list[tuple[int, int]]]] = []
        skipped = 0
        for key in heapq.merge(behind, self._waiting):
            if plan.left == 0 or skipped > self.max_scan:
                break
            job = cluster.jobs[key[3]]
            if job.status is JobStatus.RUNNING:
                plan.keep(job.id)
                continue
            where = plan.place(job.num_gpus, self._fewest(cluster, job.num_gpus))
            if where is None:
                skipped += 1
                continue
            starts.append((job, where))
        for key in behind:
            if key[3] in plan.suspended:
                yield A.Suspend(key[3])
                self._move(cluster.jobs[key[3]], cluster.now)
        for job, where in sorted(starts, key=lambda s: -s[0].num_gpus):
            gpus = tuple(g for server, n in where for g in pick_in_server(cluster, server, n))
            yield from self._start(cluster, job, gpus)


class _Plan:
    """One reordering's view of the cluster: per up server, the GPUs not yet planned for a job
    (``room``) and those of them free now or freed by the plan (``idle``); the running jobs
    not yet reached in LAS order (all behind the job being placed), by server. Built from the
    free GPUs and the running jobs ``behind`` the first waiting one, in LAS order."""

    def __init__(self, cluster: Cluster, behind: list[Key],
                 shares: dict[str, tuple[tuple[int, ...], dict[int, int]]]) -> None:
        up = [n.id for n in cluster.nodes if n.up]
        self.idle = {s: len(cluster.free_gpus(s)) for s in up}
        self.room = dict(self.idle)
        self.share: dict[str, dict[int, int]] = {}
        self.rank: dict[str, int] = {}
        self.held: dict[int, list[str]] = {s: [] for s in up}  # highest priority first
        for rank, key in enumerate(behind):
            jid = key[3]
            self.rank[jid] = rank
            self.share[jid] = share = _share(cluster, cluster.jobs[jid], shares)
            for server, n in share.items():
                self.held[server].append(jid)
                self.room[server] += n
        self.left = sum(self.room.values())
        self.top = max(self.room.values(), default=0)  # no server has more room
        self.suspended: set[str] = set()

    def keep(self, jid: str) -> None:
        """A running job reached in order, not suspended by the plan: it stays where it is."""
        if jid in self.suspended:
            return
        for server, n in self.share[jid].items():
            self.room[server] -= n
            self.held[server].remove(jid)
            self.left -= n

    def victims(self, server: int, need: int) -> list[str]:
        """The lowest-ranked jobs on ``server`` to suspend for ``need`` idle GPUs there."""
        have, out = self.idle[server], []
        for jid in reversed(self.held[server]):
            if have >= need:
                break
            out.append(jid)
            have += self.share[jid][server]
        return out

    def cost(self, server: int, need: int) -> tuple[float, int, int, int]:
        """Taking ``need`` GPUs of ``server``: best with nobody suspended, else with the
        victims' best rank lowest, then the fewest GPUs suspended; then best fit."""
        if self.idle[server] >= need:
            return (-float("inf"), 0, self.idle[server], server)
        victims = self.victims(server, need)
        return (-min(self.rank[v] for v in victims),
                sum(sum(self.share[v].values()) for v in victims), self.room[server], server)

    def place(self, count: int, servers: int) -> list[tuple[int, int]] | None:
        """Room for a gang of ``count`` on ``servers`` servers (taken in the plan), as
        (server, GPUs) pairs; None if the plan has no such room."""
        per = -(-count // servers)
        if count > self.left or per > self.top:
            return None
        where: list[tuple[int, int]] = []
        left = count
        while left:
            need = min(per, left)
            used = {s for s, _ in where}
            fits = [s for s, r in self.room.items() if r >= need and s not in used]
            if not fits:
                self.top = max(self.room.values())  # (per > top now: fail fast next time)
                return None
            where.append((min(fits, key=lambda s: self.cost(s, need)), need))
            left -= need
        for server, need in where:
            for jid in self.victims(server, need):
                self.suspended.add(jid)
                for s, n in self.share[jid].items():
                    self.idle[s] += n
                    self.held[s].remove(jid)
            self.idle[server] -= need
            self.room[server] -= need
            self.left -= need
        return where


def _share(cluster: Cluster, job: Job,
           shares: dict[str, tuple[tuple[int, ...], dict[int, int]]]) -> dict[int, int]:
    """A running job's GPUs per server (remembered while it stays on the same GPUs)."""
    known = shares.get(job.id)
    if known is not None and known[0] is job.gpus:
        return known[1]
    share: dict[int, int] = {}
    for g in job.gpus:
        node = cluster.gpus[g].node
        share[node] = share.get(node, 0) + 1
    shares[job.id] = (job.gpus, share)
    return share


POLICY = Las
