"""Readers' snapshots (``backends.explain.Seen``): what changed since the last is copied,
what did not is the last snapshot's, and no snapshot changes once taken."""

from conftest import drive, job

from gandiva import events as E
from gandiva.backends.explain import Seen


def test_a_snapshot_copies_what_changed_and_keeps_the_last_ones_parts_that_did_not():
    sched, _ = drive("2x2", "gandiva", E.Arrival(0.0, job("a", 0, 1, 100)))
    seen = Seen(sched.cluster, sched.policy, [f"gpu{i}" for i in range(4)])
    first = seen.snapshot
    assert set(first.jobs) == set(first.home) == {"a"}

    seen.take()  # nothing touched, the book unchanged: the same parts
    assert seen.snapshot.jobs is first.jobs and seen.snapshot.home is first.home
    assert seen.snapshot.height is first.height

    sched.handle(E.Arrival(1.0, job("b", 1, 2, 100)))  # placed: the book changes
    seen.touch("b")
    seen.take()
    second = seen.snapshot
    assert set(second.jobs) == set(second.home) == {"a", "b"}
    assert set(first.jobs) == set(first.home) == {"a"}  # the first is as it was taken
    assert second.height != first.height

    sched.handle(E.PriorityChange(2.0, "a", 5))  # the job's row changes, not its home
    seen.touch("a")
    seen.take()
    assert seen.snapshot.jobs["a"][3] == 5 and second.jobs["a"][3] == 0
    assert seen.snapshot.home is second.home

    sched.handle(E.Departure(3.0, "b"))
    seen.touch(None)  # many jobs may have changed: everything is read again
    seen.take()
    assert set(seen.snapshot.jobs) == set(seen.snapshot.home) == {"a"}
