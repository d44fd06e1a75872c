"""The time a backend runs on: the wall clock, or a virtual one that tests move.

A backend's threads read the time (``now``) and wait for their next message or their next
deadline, whichever comes first (``get``): the loop for the nodes' events, hollow nodes for
their timers. On the ``WallClock`` that is ``queue.get`` with a timeout. On a
``VirtualClock`` time stands still until a test moves it (``advance``, or ``run_until``,
which moves it to the next deadline whenever every thread that has waited on it waits again
with nothing to do), so tests of the loop and of hollow nodes take no wall time and sleep
nowhere.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

INF = float("inf")
NO_WAIT = -INF  # (a deadline that has always passed)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, on a clock that never goes back."""

    def get(self, q: queue.Queue, until: float) -> Any:
        """The next item of ``q``, waiting until the clock reads ``until`` at most (then
        ``queue.Empty``; ``INF``: no limit; ``NO_WAIT``: what is there now). Whoever waits
        on a clock takes every item of ``q`` through it."""

    def hold(self) -> None:
        """Something is under way on a thread that does not wait on this clock (a courier
        handing a node its action): time must not move until it is ``let_go``."""

    def let_go(self) -> None:
        """The end of one ``hold``."""


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def get(self, q: queue.Queue, until: float) -> Any:
        if until == NO_WAIT:
            return q.get_nowait()
        return q.get(timeout=None if until == INF else max(0.0, until - time.monotonic()))

    def hold(self) -> None:
        pass  # (wall time moves regardless)

    def let_go(self) -> None:
        pass


class _Due:
    """Put on a waiter's queue when its deadline has come (never seen by the caller)."""


class VirtualClock:
    """Time that moves only when a test moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._changed = threading.Condition()
        self._waiting: dict[_Due, tuple[float, queue.Queue]] = {}
        self._waiter: dict[_Due, threading.Thread] = {}
        self._threads: set[threading.Thread] = set()  # every thread that has waited here
        self._held = 0  # ``hold``s not yet let go

    def now(self) -> float:
        with self._changed:
            return self._now

    def get(self, q: queue.Queue, until: float) -> Any:
        """As ``Clock.get``. An item counts as handed over (``q.task_done``) only once its
        taker has stopped waiting: until then the clock is not ``idle``."""
        due = _Due()
        with self._changed:
            self._threads.add(threading.current_thread())
            if until <= self._now:  # no wait: what is there, or nothing
                while True:
                    item = q.get_nowait()  # (queue.Empty when nothing is)
                    q.task_done()
                    if not isinstance(item, _Due):
                        return item
            self._waiting[due] = (until, q)
            self._waiter[due] = threading.current_thread()
            self._changed.notify_all()
        taken = False
        try:
            while True:
                item = q.get()
                if item is due or not isinstance(item, _Due):
                    taken = True
                    if item is due:
                        raise queue.Empty
                    return item
                q.task_done()  # a deadline that came as it got an item, last time
        finally:
            with self._changed:
                self._waiting.pop(due, None)
                self._waiter.pop(due, None)
                if taken:
                    q.task_done()
                self._changed.notify_all()

    def hold(self) -> None:
        with self._changed:
            self._held += 1

    def let_go(self) -> None:
        with self._changed:
            self._held -= 1
            self._changed.notify_all()

    def advance(self, to: float | None = None) -> float:
        """Move the clock to ``to`` (None: the earliest deadline anyone waits for) and wake
        whoever waits for a deadline that has come; the time it reads now."""
        with self._changed:
            if to is None:
                to = min((until for until, _ in self._waiting.values()), default=self._now)
            if to != INF:
                self._now = max(self._now, to)
            for due, (until, q) in list(self._waiting.items()):
                if until <= self._now:
                    del self._waiting[due], self._waiter[due]
                    q.put(due)
            return self._now

    def idle(self) -> bool:
        """Whether every live thread that has waited on this clock waits on it now with
        nothing to do, and nothing is held (``hold``): nothing happens until the clock moves.
        Decision: a courier holds the clock while a worker hands a node its action; else a
        worker kept off the CPU under load saw the clock run on without it (a minute of
        virtual time, once, in a test of a stalled node)."""
        with self._changed:
            return self._idle()

    def settle(self, wall_s: float) -> bool:
        """Wait until ``idle``, at most ``wall_s`` seconds of wall time; whether it is."""
        with self._changed:
            return self._changed.wait_for(self._idle, timeout=wall_s)

    def _idle(self) -> bool:
        self._threads = {t for t in self._threads if t.is_alive()}
        return (bool(self._waiting) and not self._held
                and self._threads <= set(self._waiter.values())
                and all(q.unfinished_tasks == 0 for _, q in self._waiting.values()))

    def run_until(self, done: Callable[[], bool], limit: float = 3600.0,
                  wall_s: float = 60.0) -> None:
        """Move time on, from one deadline to the next, each time the threads that wait on
        this clock are ``idle``, until ``done()``. ``limit``: the most seconds it moves;
        ``wall_s``: the most seconds of wall time this may take (``TimeoutError`` after)."""
        stop_at, give_up = self.now() + limit, time.monotonic() + wall_s
        while not done():
            if time.monotonic() > give_up:
                raise TimeoutError(f"not done after {wall_s:g} s of wall time, at t={self.now()}")
            with self._changed:  # (woken as waiters come and go; looks at done() again)
                if not self._changed.wait_for(self._idle, timeout=0.05):
                    continue
                to = min(until for until, _ in self._waiting.values())
                if to == INF:  # no deadline: only a thread that does not wait here can act
                    self._changed.wait(0.05)
                    continue
                to = min(to, stop_at)
            if self.now() >= stop_at:
                raise TimeoutError(f"not done after {limit:g} s of virtual time")
            self.advance(to)
