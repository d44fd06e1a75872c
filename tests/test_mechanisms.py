"""The gandiva policy's mechanisms, each on its own: its hooks called directly on a small
cluster set up by hand, one table per mechanism (what the simulator-driven tests of
``test_gandiva_policy.py`` show through whole runs)."""

import math

import pytest
from test_gandiva_policy import hand_state

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import make_policy
from gandiva.policies.gandiva import Cycle
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.spec import JobSpec


def arrive(c, jid: str, n: int, t: float = 0.0, **kw):
    c.observe(E.Arrival(t, JobSpec(jid, t, n, "resnet50", duration=1e6, **kw)))
    return c.jobs[jid]


def carried_out(c, decision) -> list:
    """The actions of ``decision``, each applied to the state before the next; then its
    result as the last item."""
    out = []
    while True:
        try:
            action = next(decision)
        except StopIteration as end:
            return [*out, end.value]
        c.apply(action)
        out.append(action)


# ---- elastic: make_room -----------------------------------------------------------------

@pytest.mark.parametrize("grown, choice, shrinks", [
    (True, None, True),  # no server: shrink
    (True, (0, False), True),  # it would only time-slice: shrink, so that it starts
    (True, (0, True), False),  # it starts at once: nothing to do
    (False, None, False),  # nobody grown: nothing to shrink
])
def test_elastic_makes_room_by_shrinking_unless_the_job_starts_at_once(grown, choice, shrinks):
    p = make_policy("gandiva")
    c, book = hand_state("1x2", {}, policy=p)
    e = arrive(c, "e", 1, min_gpus=1, max_gpus=2)
    p.elastic.jobs["e"] = None
    c.apply(A.Place("e", (0,)))
    book.assign(e, (0,))
    if grown:
        c.apply(A.Grow("e", (0, 1)))
    new = arrive(c, "new", 1)
    *actions, made = carried_out(c, p.elastic.make_room(c, new, choice))
    assert made is shrinks
    assert actions == ([A.Shrink("e", (0,))] if shrinks else [])


# ---- admission: make_room, by attained service ------------------------------------------

@pytest.mark.parametrize("served_s, choice, victim", [
    (7200.0, None, "old"),  # more service than the newcomer by over the margin: sent back
    (1800.0, None, None),  # within the margin: stays
    (7200.0, (0, False), None),  # a server was found: nobody is sent back
])
def test_las_admission_sends_back_the_most_served_job_only_when_no_server_was_found(
        served_s, choice, victim):
    p = make_policy("gandiva:admission.displace_margin=3600")
    c, book = hand_state("1x1", {"old": (1, (0,))}, policy=p)
    c.now = served_s  # it has run since 0
    new = arrive(c, "new", 1, t=served_s)
    *actions, made = carried_out(c, p.admission.make_room(c, new, choice))
    assert made is (victim is not None)
    assert actions == ([A.Suspend(victim)] if victim else [])
    assert ("old" in p.waiting) is (victim is not None)  # back in the queue, by its service


# ---- packing: votes on samples ----------------------------------------------------------

@pytest.mark.parametrize("before, memory, running, solo_known, votes", [
    (None, 4.0, True, True, True),  # a first profile
    ((4.0, 0.5), 4.0, True, True, False),  # the same again, profiled alone: no news
    ((4.0, 0.5), 6.0, True, True, True),  # its memory moved: may pack differently
    ((4.0, 0.5), 4.0, True, False, True),  # no solo time yet: a pack may follow
    (None, 4.0, False, True, False),  # not running: packing ignores it
])
def test_packing_votes_a_sample_news_only_when_it_may_pack_or_unpack(
        before, memory, running, solo_known, votes):
    p = make_policy("gandiva")
    c, _ = hand_state("1x1", {"a": (1, (0,) if running else ())}, policy=p)
    c.jobs["a"].memory_gb, c.jobs["a"].utilization = memory, 0.5
    if before is not None:
        p.packing.profiled["a"] = before
    if solo_known:
        p.packing.solo_mbt["a"] = 0.1
    sample = E.ProfileSample(1.0, "a", 0.1, memory, 0.5, 10)
    assert p.packing.may_change(c, sample) is votes
    assert p.packing.profiled["a"] == (memory, 0.5)  # it notes what it saw


# ---- defrag: a timer while jobs wait on fragmented GPUs ---------------------------------

@pytest.mark.parametrize("free_split, armed", [
    (True, True),  # 2 free GPUs, one per server: a 2-GPU job waits on fragmentation
    (False, False),  # 2 free GPUs on one server: it is not blocked by fragmentation
])
def test_defrag_arms_its_timer_only_when_a_waiting_job_is_blocked_by_fragmentation(
        free_split, armed):
    p = make_policy("gandiva")
    held = {"a": (1, (0,)), "b": (1, (2,))} if free_split else {"a": (1, (0,)), "b": (1, (1,))}
    c, _ = hand_state("2x2", held, policy=p)
    p.waiting.add(arrive(c, "wide", 2))
    carried_out(c, p.defrag.after_decision(c, Cycle(E.Tick(0.0))))
    when = p.s.timers.when(TimerKind.DEFRAG)
    assert (when == p.defrag.interval) if armed else when is None


# ---- time-slicing: how long rounds stay the same ----------------------------------------

@pytest.mark.parametrize("spec, dependent", [
    ("gandiva", False),  # levels, balanced: only a running job's level moves with time
    ("gandiva:slices.order=las", True),  # attained service moves every round
    ("gandiva:-balance", True),  # rounds per server: not put off
])
def test_time_slicing_votes_whether_its_rounds_move_with_time(spec, dependent):
    assert make_policy(spec).slicing.time_dependent() is dependent


@pytest.mark.parametrize("started, until", [
    (0.0, 3600.0),  # 1 GPU-hour to the next level, from 0 service at 0
    (1790.0, None),  # began its turn under half a quantum ago: the next round may change
])
def test_time_slicing_says_rounds_stay_the_same_until_a_running_job_changes_level(
        started, until):
    p = make_policy("gandiva")
    c, book = hand_state("1x1", {"a": (1, (0,))}, policy=p)
    book.last_start["a"] = started
    c.now = 1800.0
    got = p.slicing.steady_until(c, {0})
    if until is None:
        assert got is None
    else:
        assert got == pytest.approx(until, abs=1.0) and got < math.inf
