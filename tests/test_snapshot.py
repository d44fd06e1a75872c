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


def test_who_waits_on_each_server_follows_rounds_moves_and_departures_and_shares_the_rest():
    """A snapshot's ``waits`` is kept from the jobs touched and the jobs the book moved, not
    from every job; it must equal a look at every job, and a server whose waiting jobs did not
    change keeps the same tuple (the cluster view reuses its part for it)."""
    sched, actions = drive("4x2", "gandiva:quantum=10",
                           *[E.Arrival(float(i), job(f"j{i}", i, 1 + (i % 4 == 0), 1000))
                             for i in range(14)])
    seen = Seen(sched.cluster, sched.policy, [f"gpu{i}" for i in range(8)])
    book = sched.policy.book

    def every_job() -> list[tuple[str, ...]]:
        return [tuple(sorted(j for j, servers in book.home.items() if s in servers and
                             sched.cluster.jobs[j].status in ("suspended", "queued")))
                for s in range(4)]

    assert any(seen.snapshot.waits) and seen.snapshot.waits == every_job()
    # rounds; then the jobs on server 0 leave, and jobs waiting elsewhere move to it (the
    # book moves them; no action touches a job that waits on)
    events: list = [E.Tick(10.0 * k) for k in range(1, 4)]
    events += [E.Departure(40.0, j) for j in sorted(sched.cluster.jobs)
               if book.home.get(j) == (0,)]
    events += [E.Arrival(41.0, job("late", 41, 1, 1000)), E.Tick(50.0), E.Tick(60.0)]
    kept = moved = 0
    for event in events:
        before, done, changes = seen.snapshot.waits, len(actions), book.changes
        sched.handle(event)
        moved += len(book.moved_since(changes) or ())
        for action in actions[done:]:
            seen.touch(getattr(action, "job_id", None))
        if isinstance(event, E.Arrival | E.Departure):  # as the driver touches them
            seen.touch(event.job.id if isinstance(event, E.Arrival) else event.job_id)
        seen.take()
        after = seen.snapshot.waits
        assert after == every_job(), event
        kept += sum(a is b for a, b in zip(before, after, strict=True) if a == b)
    assert kept  # some servers' lists were shared, not built again
    assert moved  # the book kept its moves for the reader

    # the book moves a waiting job to another server, with no action and no touch (as the
    # policy's rounds may): it is seen waiting there, and no longer where it was
    jid = next(j for j in seen.snapshot.waits[1] if book.home[j] == (1,))
    book.assign(sched.cluster.jobs[jid], (2,))
    seen.take()
    assert jid in seen.snapshot.waits[2] and jid not in seen.snapshot.waits[1]
    assert seen.snapshot.waits == every_job()


def test_a_reader_further_behind_than_the_book_remembers_looks_at_every_job(monkeypatch):
    from gandiva.policies.gandiva import book as pages

    monkeypatch.setattr(pages, "MOVES_KEPT", 2)
    sched, _ = drive("2x2", "gandiva", E.Arrival(0.0, job("a", 0, 1, 100)))
    book = sched.policy.book
    assert book.moved_since(book.changes) is None  # a first look: at every job
    start = book.changes
    sched.handle(E.Arrival(1.0, job("b", 1, 1, 100)))
    assert book.moved_since(start) == ["b"]
    for i, name in enumerate("cde"):
        sched.handle(E.Arrival(2.0 + i, job(name, 2 + i, 1, 100)))
    assert book.moved_since(start) is None  # b's move is forgotten: look at every job
    assert set(book.moved_since(book.changes - 2) or ()) <= {"d", "e"}
    assert book.moved_since(book.changes) == []


def test_a_job_waiting_its_turn_is_explained_with_its_servers_height_and_the_quantum():
    from gandiva.spec import JobState

    sched, _ = drive("1x2", "gandiva:quantum=10",
                     *[E.Arrival(float(i), job(f"j{i}", i, 1, 1000)) for i in range(4)])
    seen = Seen(sched.cluster, sched.policy, ["gpu0", "gpu1"])
    waiting = sorted(j for j, v in seen.snapshot.jobs.items() if v[0] == "suspended"
                     or v[0] == "queued")
    assert waiting
    why = seen.explain(waiting[0], JobState.SUSPENDED, "", ())["reason"]
    assert why == ("time-sliced: its server is over-subscribed (height 2.0); it runs at its "
                   "turn, in rounds of 10 s")


def test_a_waiting_gang_under_fair_shares_is_told_when_it_reserves_its_servers():
    from gandiva.spec import JobState

    # two servers of 2 full of 1-GPU jobs: the 4-GPU gang gets both as its home and waits
    sched, _ = drive("2x2", "gandiva:fair:fair.gang_wait=900",
                     *[E.Arrival(float(i), job(f"j{i}", i, 1, 1000)) for i in range(4)],
                     E.Arrival(5.0, job("gang", 5, 4, 1000)))
    seen = Seen(sched.cluster, sched.policy, [f"gpu{g}" for g in range(4)])
    assert sched.policy.book.home["gang"] == (0, 1)
    why = seen.explain("gang", JobState.QUEUED, "", ())["reason"]
    assert why.endswith("; a gang across 2 servers: after 900 s of waiting it reserves them "
                        "and runs at the next round")
