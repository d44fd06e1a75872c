"""Clocks: a wait ends at the next item or at the deadline; virtual time moves only when told,
from one deadline to the next while the threads that wait on it have nothing to do."""

from __future__ import annotations

import queue
import threading

import pytest

from gandiva.backends.clock import INF, NO_WAIT, VirtualClock, WallClock


@pytest.mark.parametrize("clock", [WallClock(), VirtualClock()], ids=["wall", "virtual"])
def test_a_wait_returns_what_is_there_and_no_wait_returns_at_once(clock):
    q: queue.Queue[str] = queue.Queue()
    q.put("a")
    assert clock.get(q, clock.now() + 10) == "a"
    with pytest.raises(queue.Empty):
        clock.get(q, NO_WAIT)


def test_a_virtual_wait_ends_when_the_clock_is_moved_past_its_deadline_and_not_before():
    clock, q = VirtualClock(), queue.Queue()
    ended = threading.Event()

    def wait() -> None:
        with pytest.raises(queue.Empty):
            clock.get(q, 5.0)
        ended.set()
    waiter = threading.Thread(target=wait)
    waiter.start()
    assert clock.settle(wall_s=10)  # it waits
    clock.advance(4.0)
    assert not ended.wait(0.05)
    clock.advance()  # to the earliest deadline
    assert ended.wait(10) and clock.now() == 5.0
    waiter.join(10)


def test_run_until_jumps_from_deadline_to_deadline_while_its_waiters_are_idle():
    clock, q = VirtualClock(), queue.Queue()
    woke: list[float] = []

    def ticker() -> None:  # wakes every 2 s of virtual time, three times
        for _ in range(3):
            try:
                clock.get(q, clock.now() + 2.0)
            except queue.Empty:
                woke.append(clock.now())
        clock.get(q, INF)  # then waits for an item
    t = threading.Thread(target=ticker)
    t.start()
    clock.run_until(lambda: len(woke) == 3, wall_s=10)
    assert woke == [2.0, 4.0, 6.0]
    q.put("stop")
    t.join(10)
    assert not t.is_alive()
