"""The ``slicer`` policy: the runtime's test policy, decided on hand-made events."""

from __future__ import annotations

import pytest
from conftest import drive, job

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import make_policy
from gandiva.sim.engine import Simulator
from gandiva.state import Cluster, JobStatus


def arrive(jid: str, at: float = 0.0, gpus: int = 1, **kw) -> E.Arrival:
    return E.Arrival(at, job(jid, at, gpus, 1e6, **kw))


def profile(jid: str, at: float, memory_gb: float) -> E.ProfileSample:
    return E.ProfileSample(at, jid, 0.1, memory_gb, 0.5, 10)


def running(sched) -> list[str]:
    return sorted(sched.cluster.running)


def test_the_spec_sets_its_parameters():
    policy = make_policy("slicer:quantum=2:pack")
    assert (policy.quantum, policy.pack, policy.grow) == (2.0, True, False)
    with pytest.raises(ValueError, match="has no parameter 'book'"):
        make_policy("slicer:book=1")  # its bookkeeping is not a parameter


def test_arrivals_take_free_gpus_in_order_and_a_gang_takes_whole_servers():
    sched, actions = drive("3x2", "slicer", arrive("a"), arrive("g", gpus=4), arrive("b"),
                           arrive("c"))
    places = {a.job_id: a.gpus for a in actions if isinstance(a, A.Place)}
    assert list(places) == ["a", "g", "b"]  # c waits: every GPU is taken
    assert sched.cluster.servers_of(places["g"]) == {1, 2}  # the two whole free servers
    assert sched.cluster.jobs["c"].status is JobStatus.QUEUED


def test_a_waiting_job_gets_a_turn_after_a_quantum_and_the_longest_running_yields():
    sched, actions = drive("1x2", "slicer:quantum=10", arrive("a"), arrive("b", at=1.0),
                           arrive("c", at=2.0))
    assert running(sched) == ["a", "b"]
    assert actions[-1] == A.Wake(10.0)  # a's turn ends; nothing is taken from it before
    sched.handle(E.Tick(10.0))
    assert running(sched) == ["b", "c"]  # a ran longest: it yields, b's turn is not over
    assert actions[-3:] == [A.Suspend("a"), A.Place("c", (0,)), A.Wake(11.0)]
    for t, expected in ((11.0, ["a", "c"]), (20.0, ["a", "b"]), (21.0, ["b", "c"])):
        sched.handle(E.Tick(t))
        sched.cluster.check_invariants()
        assert running(sched) == expected, t  # round robin: the one waiting longest is next
    assert [sched.cluster.jobs[j].suspends for j in "abc"] == [2, 1, 1]


def test_nothing_is_suspended_while_no_job_waits():
    sched, actions = drive("1x2", "slicer:quantum=1", arrive("a"), arrive("b"),
                           E.Tick(5.0), E.Departure(6.0, "a"), arrive("c", at=7.0))
    assert not any(isinstance(a, A.Suspend | A.Wake) for a in actions)
    assert running(sched) == ["b", "c"]


def test_a_wider_job_waits_for_enough_turns_to_end_and_smaller_ones_use_the_gap():
    sched, actions = drive("1x4", "slicer:quantum=10", arrive("a"), arrive("b", at=1.0),
                           arrive("c", at=2.0), arrive("d", at=3.0), arrive("g", at=4.0, gpus=3),
                           arrive("e", at=5.0))
    sched.handle(E.Tick(10.0))  # only a's turn is over: g cannot fit, e takes a's place
    assert running(sched) == ["b", "c", "d", "e"]
    sched.handle(E.Tick(13.0))  # b, c and d are over: g runs with e, whose turn is not
    assert running(sched) == ["e", "g"]
    sched.cluster.check_invariants()


def test_pack_runs_a_profiled_waiting_job_beside_one_that_runs_alone_and_leaves_the_pair():
    sched, actions = drive("1x2", "slicer:quantum=10:pack", arrive("a"), arrive("b"),
                           arrive("c"), profile("a", 1.0, 6.0), profile("b", 1.0, 12.0))
    assert not any(isinstance(a, A.Pack) for a in actions)  # c has not run: memory unknown
    sched.handle(E.Tick(10.0))  # c takes a's turn; a, suspended, has reported its memory
    sched.handle(profile("c", 11.0, 9.0))
    packs = [a for a in actions if isinstance(a, A.Pack)]
    assert packs == [A.Pack("a", sched.cluster.jobs["c"].gpus)]  # 6 + 12 GB > 16 GB: not b
    sched.handle(E.Tick(30.0))
    assert running(sched) == ["a", "b", "c"]  # no one waits; the pair is never rotated
    assert not any(isinstance(a, A.Suspend) for a in actions[actions.index(packs[0]):])


def test_pack_leaves_a_job_waiting_when_memory_does_not_fit():
    sched, actions = drive("1x1", "slicer:quantum=1:pack", arrive("a"), arrive("b"),
                           profile("a", 0.5, 10.0), E.Tick(1.0), profile("b", 1.5, 10.0),
                           E.Tick(2.0))
    assert not any(isinstance(a, A.Pack) for a in actions)
    assert running(sched) == ["a"]  # 20 GB on a 16 GB V100: they take turns instead


def test_grow_widens_an_elastic_job_after_a_quantum_and_a_newcomer_shrinks_it_at_once():
    sched, actions = drive("1x2", "slicer:quantum=1:grow",
                           arrive("e", min_gpus=1, max_gpus=2))
    assert actions == [A.Place("e", (0,)), A.Wake(1.0)]
    sched.handle(E.Tick(1.0))
    assert actions[-1] == A.Grow("e", (0, 1))
    sched.handle(arrive("c", at=5.0))
    assert actions[-2:] == [A.Shrink("e", (0,)), A.Place("c", (1,))]
    sched.handle(E.Departure(5.5, "c"))  # the shrink began a turn: e widens once it is over
    assert actions[-1] == A.Wake(6.0)
    sched.handle(E.Tick(6.0))
    assert actions[-1] == A.Grow("e", (0, 1))
    sched.cluster.check_invariants()


def test_the_book_shows_where_each_started_job_waits_and_how_over_subscribed_it_is():
    sched, _ = drive("2x2", "slicer:quantum=1")
    book = sched.policy.book
    assert book.height(0) == 0.0 and not book.home  # read before any event, as a view may
    for event in (arrive("a"), arrive("b"), arrive("c"), arrive("d"), arrive("e"), E.Tick(1.0)):
        sched.handle(event)
    waiting = [j for j in "abcde" if sched.cluster.jobs[j].status is JobStatus.SUSPENDED]
    assert len(waiting) == 1 and set(book.home) == set("abcde")
    server = book.home[waiting[0]][0]
    assert book.height(server) == 1.5 and book.height(1 - server) == 1.0
    sched.handle(E.Departure(2.0, waiting[0]))
    assert waiting[0] not in book.home and book.height(server) == 1.0


def test_a_failed_servers_jobs_start_again_elsewhere():
    sched, actions = drive("2x1", "slicer:quantum=1", arrive("a"), arrive("b"), arrive("c"))
    lost = sched.cluster.gpus[sched.cluster.jobs["a"].gpus[0]].node
    sched.handle(E.Failure(0.5, lost))
    sched.cluster.check_invariants()
    assert "a" not in sched.policy.book.home
    sched.handle(E.Tick(1.0))
    assert len(running(sched)) == 1 and sched.cluster.jobs["a"].status is not JobStatus.RUNNING
    sched.handle(E.Tick(2.0))  # the line goes round on the one server left
    assert sched.cluster.jobs["a"].status is JobStatus.RUNNING


def test_every_job_of_a_simulated_trace_finishes_and_time_slicing_shares_the_gpus():
    jobs = [job(f"j{i}", float(i), 1 + i % 2, 600.0) for i in range(8)]
    result = Simulator(Cluster.build("1x4"), make_policy("slicer:quantum=60"), jobs).run()
    assert all(r.finish is not None for r in result.jobs)
    assert result.counts["suspends"] > 0
    # every job started within a few turns of arriving, not after the ones ahead of it ended
    assert max(r.start - r.submit for r in result.jobs) < 600.0


def test_where_actions_take_time_a_turn_begins_once_the_node_has_started_the_job():
    sched, actions = drive("1x2", "slicer:quantum=10")
    sched.cluster.confirms = True  # as on a real backend: a start lasts until confirmed
    for event in (arrive("a"), arrive("b"), arrive("c"), E.Tick(10.0)):
        sched.handle(event)
    assert running(sched) == ["a", "b"]  # not started yet at 10 s: no turn has begun
    sched.handle(E.Confirmed(12.0, "a"))
    sched.handle(E.Confirmed(12.0, "b"))
    sched.handle(profile("a", 12.5, 1.0))  # the first event after: the turns begin now
    assert actions[-1] == A.Wake(22.5)
    sched.handle(E.Tick(22.0))
    assert running(sched) == ["a", "b"]
    sched.handle(E.Tick(22.5))
    assert running(sched) == ["b", "c"]


def test_a_gang_wider_than_a_server_waits_for_whole_free_servers():
    sched, actions = drive("3x2", "slicer:quantum=1000", arrive("a"), arrive("b"), arrive("c"),
                           E.Departure(1.0, "b"), arrive("g", at=2.0, gpus=4))
    assert sched.cluster.free_count() == 4  # one on server 0, one on 1, server 2 whole
    assert sched.cluster.jobs["g"].status is JobStatus.QUEUED  # not over three servers
    sched.handle(E.Departure(3.0, "c"))
    assert sched.cluster.servers_of(sched.cluster.jobs["g"].gpus) == {1, 2}


def test_the_oldest_turn_yields_whichever_gpu_it_holds():
    sched, actions = drive("1x2", "slicer:quantum=10", arrive("a"), arrive("b", at=1.0),
                           E.Departure(2.0, "a"), arrive("d", at=3.0), arrive("c", at=4.0))
    assert sched.cluster.jobs["d"].gpus == (0,) and sched.cluster.jobs["b"].gpus == (1,)
    sched.handle(E.Tick(13.0))  # b's turn began first: it yields its GPU 1 to c
    assert actions[-3:-1] == [A.Suspend("b"), A.Place("c", (1,))]
    assert running(sched) == ["c", "d"]
