"""``las``: Tiresias-style discretised two-dimensional least-attained-service, with preemption.

Attained service is GPUs x time run (the "2D" of Tiresias, Gu et al., NSDI 2019). Jobs sit in
priority levels cut at ``queue_limits`` GPU-seconds; within a level, first come first served.
The GPUs go greedily to the jobs in that order; a running job that falls behind a waiting one
is preempted (suspended at a mini-batch boundary) to make room.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from pydantic import Field, field_validator
from sortedcontainers import SortedList

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import Options as PolicyOptions
from gandiva.policies.placement import best_fit
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
    def _start(self, cluster: Cluster, job: Job) -> Iterator[A.Action]:
        gpus = best_fit(cluster, job.num_gpus)
        assert gpus is not None, "selection is by GPU count, so a fitting set always exists"
        if job.status is JobStatus.SUSPENDED:
            yield A.Resume(job.id, gpus)
        else:
            yield A.Place(job.id, gpus)
        self._move(job, cluster.now)

    def _fill(self, cluster: Cluster) -> Iterator[A.Action]:
        """No waiting job outranks a running one: hand free GPUs to waiting jobs in order."""
        free = cluster.free_count()
        i = 0
        while free > 0 and i < min(self.max_scan, len(self._waiting)):
            job = cluster.jobs[self._waiting[i][3]]
            if job.num_gpus > free:
                i += 1
                continue
            free -= job.num_gpus
            yield from self._start(cluster, job)

    def _reorder(self, cluster: Cluster) -> Iterator[A.Action]:
        """Greedy in LAS order over all jobs; preempt running jobs that fall outside."""
        capacity = sum(n.size for n in cluster.nodes if n.up)
        chosen: list[Job] = []
        skipped = 0
        for key in heapq.merge(self._running, islice(self._waiting, None)):
            if capacity == 0 or skipped > self.max_scan:
                break
            job = cluster.jobs[key[3]]
            if job.num_gpus <= capacity:
                chosen.append(job)
                capacity -= job.num_gpus
            else:
                skipped += 1
        keep = {j.id for j in chosen}
        for key in list(self._running):
            if key[3] not in keep:
                yield A.Suspend(key[3])
                self._move(cluster.jobs[key[3]], cluster.now)
        starting = [j for j in chosen if j.status is not JobStatus.RUNNING]
        for job in sorted(starting, key=lambda j: -j.num_gpus):
            yield from self._start(cluster, job)


POLICY = Las
