"""The policy's timers: what it wants to do when, per server, and the ticks it asks for.

Timers are kept by instant and kind, each with the servers armed then: a round arms one
timer for every server it slices (their next rounds fall on the same instant).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from enum import StrEnum

from gandiva import actions as A

OWN = -1  # the server of the policy's own timers (not a server's)


class TimerKind(StrEnum):
    """What a timer is for. Values are the old strings: timers due at one instant are
    taken in the order of their kinds' values, which decisions depend on."""

    REFILL = "refill"  # a server's slice order changed (a priority): refill it at this tick
    SLICE = "slice"  # a server's next time-slicing round
    SPREAD = "spread"  # packed jobs may take GPUs that freed (packing)
    GROW = "grow"  # an idle server may grow an elastic job (elastic)
    DEFRAG = "defrag"  # waiting jobs blocked by fragmentation (migration)


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, TimerKind]] = []
        self._at: dict[tuple[float, TimerKind], set[int]] = {}  # (when, kind) -> servers
        self._when: dict[tuple[TimerKind, int], float] = {}  # (kind, server) -> when
        self._asked = -1.0  # the tick last asked for

    def arm(self, at: float, kind: TimerKind, *servers: int) -> None:
        """Arm ``kind`` at ``at`` on each of ``servers`` (none: the policy's own) where it
        is not armed already."""
        when, bucket = self._when, None
        for server in servers or (OWN,):
            if (kind, server) in when:
                continue
            when[kind, server] = at
            if bucket is None:
                bucket = self._at.get((at, kind))
                if bucket is None:
                    bucket = self._at[at, kind] = set()
                    heapq.heappush(self._heap, (at, kind))
            bucket.add(server)

    def cancel(self, kind: TimerKind, server: int = OWN) -> None:
        at = self._when.pop((kind, server), None)
        if at is not None:  # (an instant left with no server is skipped when due)
            self._at[at, kind].discard(server)

    def when(self, kind: TimerKind, server: int = OWN) -> float | None:
        """When ``kind`` is armed on ``server``; None if it is not."""
        return self._when.get((kind, server))

    def servers_at(self, at: float, kind: TimerKind) -> frozenset[int]:
        return frozenset(self._at.get((at, kind), ()))

    def due(self, now: float) -> list[tuple[TimerKind, int]]:
        """At a tick: the timers due at ``now``, disarmed, by instant, kind and server."""
        self._asked = -1.0  # this tick was the one asked for: a timer due now needs another
        due = []
        while self._heap and self._heap[0][0] <= now + 1e-9:
            at, kind = heapq.heappop(self._heap)
            for server in sorted(self._at.pop((at, kind))):
                del self._when[kind, server]
                due.append((kind, server))
        return due

    def wake(self) -> Iterator[A.Wake]:
        """Ask for a tick at the first timer, if it is not asked for already."""
        while self._heap and not self._at[self._heap[0]]:
            del self._at[heapq.heappop(self._heap)]
        if self._heap and self._heap[0][0] != self._asked:
            self._asked = self._heap[0][0]
            yield A.Wake(self._asked)
