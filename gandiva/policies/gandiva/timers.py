"""The policy's timers: what it wants to do when, per server, and the ticks it asks for.

Timers are kept by instant and kind, each with the servers armed then: a round arms one
timer for every server it slices (their next rounds fall on the same instant).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from gandiva import actions as A

OWN = -1  # the server of the policy's own timers (not a server's)


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._at: dict[tuple[float, str], set[int]] = {}  # (when, kind) -> servers
        self._when: dict[tuple[str, int], float] = {}  # (kind, server) -> when
        self._asked = -1.0  # the tick last asked for

    def arm(self, at: float, kind: str, *servers: int) -> None:
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

    def cancel(self, kind: str, server: int = OWN) -> None:
        at = self._when.pop((kind, server), None)
        if at is not None:  # (an instant left with no server is skipped when due)
            self._at[at, kind].discard(server)

    def when(self, kind: str, server: int = OWN) -> float | None:
        """When ``kind`` is armed on ``server``; None if it is not."""
        return self._when.get((kind, server))

    def servers_at(self, at: float, kind: str) -> frozenset[int]:
        return frozenset(self._at.get((at, kind), ()))

    def due(self, now: float) -> list[tuple[str, int]]:
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
