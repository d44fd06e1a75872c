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

Only where the backend watches no round (``Gandiva.put_off_quiet_rounds``: the simulator
without its timeline or a controller), and only while no job waits for a place and no
mechanism's decisions move with time beyond the slice order's levels: the mechanisms vote
(``time_dependent``; on a profile sample, ``may_change``), and time-slicing says until when
its rounds stay the same (``steady_until``). docs/decisions/0013.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gandiva import events as E
from gandiva.policies.gandiva.framework import Mechanism, ignores_samples
from gandiva.policies.gandiva.shared import Shared
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.state import Cluster

# after a round on these servers that changed nothing: until when rounds there change nothing
SteadyUntil = Callable[[Cluster, set[int]], float | None]


@dataclass(slots=True)
class PutOff:
    changes: int  # ``Shared.changes`` after the round that changed nothing
    servers: set[int]  # their next round put off to ``until``
    until: float


class Quiet:
    def __init__(self, shared: Shared, mechanisms: list[Mechanism],
                 steady_until: SteadyUntil) -> None:
        self.s = shared
        self.enabled = False  # (``Gandiva.put_off_quiet_rounds``)
        self.mechanisms = mechanisms
        # the votes on a sample of the mechanisms that some samples may change
        self.voters = [m.may_change for m in mechanisms
                       if type(m).may_change is not ignores_samples]
        self.steady_until = steady_until
        self.put_off: PutOff | None = None
        self.servers_put_off = 0  # servers whose round was put off, all told

    def news(self, cluster: Cluster, sample: E.ProfileSample) -> bool:
        """May this sample change what a round does? Every mechanism that may be changed by
        one votes (each sees it: a vote may note what it saw)."""
        return any([vote(cluster, sample) for vote in self.voters])

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
        if (not self.enabled or len(self.s.waiting)
                or any(m.time_dependent() for m in self.mechanisms)):
            return
        nxt = self.s.next_round(now)
        servers = set(timers.servers_at(nxt, TimerKind.SLICE))
        if not servers or not servers <= rounded:
            return  # a server joins the next round (an arrival's): it may change what runs
        until = self.steady_until(cluster, servers)
        if until is None:
            return
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
