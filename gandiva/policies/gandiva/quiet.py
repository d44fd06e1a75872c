"""Quiet rounds: rounds that would change nothing are put off (the one accelerator).

Under ``balance`` every server of a round shares one slice order. A round that changed nothing
(no suspend, resume, move or pack) is followed by the same round as long as nothing changes:
the ``levels`` order reads a job's priority, whether it has run, its attained-service level and
arrival, and of these only the level of a running job moves with time. So after such a round
the servers' next round is put off to the round before the first running job reaches its next
level (its timers armed then: the policy's next ``Wake`` is the hint the backend sees), and
brought back to the next round as soon as anything could change a round's outcome: any event
but a profile sample with no news for packing, or any action (``Shared.changes`` counts them).
The rounds skipped are those that would have found the same jobs running and done nothing.

Only where the backend watches no round (``Cluster.skip_quiet_rounds``: the simulator without
its timeline or a controller), and only where a round's outcome reads nothing else that moves
with time: ``levels`` order, no queued job (``LasAdmission`` displaces for it by attained
service), no elastic job, and no job in its first half quantum (it keeps its turn in this
round and competes in the next). docs/decisions/0013.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gandiva import events as E
from gandiva.policies.gandiva.elastic import Elastic
from gandiva.policies.gandiva.order import Levels, SliceOrder
from gandiva.policies.gandiva.packing import Packing
from gandiva.policies.gandiva.shared import Shared
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.policies.gandiva.timeslice import TimeSlicing
from gandiva.state import Cluster, JobStatus


@dataclass(slots=True)
class PutOff:
    changes: int  # ``Shared.changes`` after the round that changed nothing
    servers: set[int]  # their next round put off to ``until``
    until: float


class Quiet:
    def __init__(self, shared: Shared, order: SliceOrder, slicing: TimeSlicing,
                 packing: Packing, elastic: Elastic) -> None:
        self.s = shared
        self.levels = order if isinstance(order, Levels) and slicing.balance else None
        self.slicing = slicing
        self.packing = packing
        self.elastic = elastic
        self.put_off: PutOff | None = None
        self.profiled: dict[str, tuple[float | None, float | None]] = {}  # what samples said
        self.servers_put_off = 0  # servers whose round was put off, all told

    def news(self, cluster: Cluster, sample: E.ProfileSample) -> bool:
        """May this sample change what a round does? It may if it can change packing: a
        first profile alone, a new memory or utilisation, or a sample of a packed job or a
        trial's."""
        job = cluster.jobs[sample.job_id]
        seen = (job.memory_gb, job.utilization)
        before = self.profiled.get(job.id)
        self.profiled[job.id] = seen
        if job.status is not JobStatus.RUNNING:
            return False  # packing ignores it
        return before != seen or self.packing.may_act_on(cluster, job)

    def forget(self, job_id: str) -> None:
        self.profiled.pop(job_id, None)

    def at_tick(self, now: float) -> None:
        if self.put_off is not None and self.put_off.until <= now + 1e-9:
            self.put_off = None  # the put-off round is due

    def after(self, cluster: Cluster, before: int, rounded: set[int]) -> bool:
        """After a decision: bring put-off rounds back if anything changed, or put the next
        round off if this decision's round changed nothing; whether it did either (the
        timers may have changed)."""
        if self.put_off is not None and self.s.changes != self.put_off.changes:
            self._rouse(cluster)
            return True
        if rounded and self.s.changes == before:
            self._declare(cluster, rounded)
            return True
        return False

    def _declare(self, cluster: Cluster, rounded: set[int]) -> None:
        """After a round that changed nothing: put the servers' next round off, if it can be."""
        now, q, timers = cluster.now, self.s.quantum, self.s.timers
        if (not cluster.skip_quiet_rounds or self.levels is None or len(self.s.waiting)
                or self.elastic.jobs):
            return
        nxt = self.s.next_round(now)
        servers = set(timers.servers_at(nxt, TimerKind.SLICE))
        if not servers or not servers <= rounded:
            return  # a server joins the next round (an arrival's): it may change what runs
        slicing = self.slicing
        if slicing.balance_all:  # every server with jobs takes the round: every homed job
            jobs = slicing.homed(cluster)
        else:
            _, jobs = slicing.group(cluster, slicing.round_of(cluster, servers))
        last_start = self.s.book.last_start
        until = math.inf
        for job in jobs:
            if job.status is not JobStatus.RUNNING:
                continue
            if now - last_start.get(job.id, -math.inf) < q / 2:
                return  # it kept its turn in this round; in the next it competes
            attained = job.attained_at(now)
            limit = self.levels.next_limit(attained)
            if limit is not None:  # when ``las.level`` will say the next one
                until = min(until, now + (limit - attained) / len(job.gpus))
        # the last round before the level changes runs (it changes nothing) and puts off again
        wake = max(nxt, math.floor(until / q) * q) if until < math.inf else math.inf
        if wake <= nxt:
            return
        for s in servers:
            timers.cancel(TimerKind.SLICE, s)
            if wake < math.inf:
                timers.arm(wake, TimerKind.SLICE, s)
        self.put_off = PutOff(self.s.changes, servers, wake)
        self.servers_put_off += len(servers)

    def _rouse(self, cluster: Cluster) -> None:
        """Something changed: the put-off servers take their next round (at this instant if
        it falls on a round: the simulator runs ticks after the other events of an instant)."""
        assert self.put_off is not None
        now, timers = cluster.now, self.s.timers
        this = math.floor(now / self.s.quantum + 1e-9) * self.s.quantum
        at = now if abs(this - now) < 1e-9 else self.s.next_round(now)
        for s in self.put_off.servers:
            if timers.when(TimerKind.SLICE, s) == self.put_off.until:
                timers.cancel(TimerKind.SLICE, s)
            timers.arm(at, TimerKind.SLICE, s)
        self.put_off = None
