"""Planned rounds (``policies/gandiva/rounds.py``): the simulator carries quiet time-slicing
rounds out in closed form, and nothing about a run may change but its speed."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from conftest import job

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import make_policy
from gandiva.policies.gandiva import quiet
from gandiva.policies.gandiva.rounds import PLANNED
from gandiva.sim.engine import SimConfig, SimResult, Simulator
from gandiva.state import Cluster, InvariantError
from gandiva.traces import load_trace

# Plans are made only without ``balance`` (one slice order across servers links every
# rotating server's round to every other's: rounds.unquiet), and they pay where rounds change
# who runs: round-robin (the paper's order) suspends a job every round on every crowded server
# (the paper's order and placement, with spread_packed: its moves of packed jobs are checked
# here too)
POLICY = "gandiva:-balance:slice_order=roundrobin:-las_admission:-gang_shares"


def philly_stretch(first: int = 2500, last: int = 3000):
    """A busy stretch of Philly, from its first job's arrival: 1- to 16-GPU jobs, packing."""
    trace = load_trace("philly", jobs=last)
    jobs = trace.jobs[first:last]
    t0 = jobs[0].submit_time
    return [dataclasses.replace(j, submit_time=j.submit_time - t0) for j in jobs]


class Watched(Simulator):
    """Counts the plans made, the servers they cover, and what ended them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: Counter[str] = Counter()
        self.plans: list[A.Rounds] = []
        self.handed_back: list[float] = []
        self._event = "start"

    def execute(self, action, cluster) -> None:
        if isinstance(action, A.Rounds):
            self.plans.append(action)
            self.seen["plans"] += 1
            self.seen["gang plans"] += len(action.servers) > 1
        elif isinstance(action, A.Thaw):
            self.seen[f"ended at {self._event}"] += 1
        super().execute(action, cluster)

    def _hand_back(self, rounds) -> None:
        self.seen["handed back"] += 1
        self.handed_back.append(self.now)
        super()._hand_back(rounds)


def run(jobs, cluster: str, fast: bool, policy: str = POLICY, **config
        ) -> tuple[SimResult, Watched]:
    sim = Watched(Cluster.build(cluster), make_policy(policy, 0), jobs,
                  config=SimConfig(timeline=False, fast_rounds=fast, **config))
    handle = sim.scheduler.handle

    def noting(event: E.Event) -> None:
        sim._event = type(event).__name__
        handle(event)

    sim.scheduler.handle = noting  # type: ignore[method-assign]
    return sim.run(), sim


def assert_same_run(slow: SimResult, fast: SimResult) -> None:
    assert fast.counts == slow.counts
    assert fast.events < slow.events
    by_id = {r.spec.id: r for r in fast.jobs}
    for r in slow.jobs:
        twin = by_id[r.spec.id]
        assert twin.finish == pytest.approx(r.finish, abs=1e-5), r.spec.id
        assert twin.first_feedback == pytest.approx(r.first_feedback, abs=1e-5), r.spec.id
        assert twin.held_s == pytest.approx(r.held_s, abs=1e-5), r.spec.id
        assert twin.stall_s == pytest.approx(r.stall_s, abs=1e-5), r.spec.id
    assert fast.allocated_gpu_seconds == pytest.approx(slow.allocated_gpu_seconds, rel=1e-9)


@pytest.mark.parametrize("policy", [POLICY, POLICY + ":gang_shares"])
def test_planned_rounds_end_in_the_same_run_as_rounds_carried_out_one_by_one(policy):
    # (with gang_shares, a gang's share of each server is planned as a round takes it)
    jobs = philly_stretch()
    slow, _ = run(jobs, "12x4", fast=False, policy=policy)
    fast, sim = run(jobs, "12x4", fast=True, policy=policy)
    assert_same_run(slow, fast)
    # it did plan, gangs' servers together too, and plans ended every way they can
    assert sim.seen["plans"] > 300 and sim.seen["gang plans"] > 10
    assert sim.seen["handed back"] > 0 and sim.seen["ended at Tick"] > 0
    assert fast.events < 0.8 * slow.events
    # the planner's own count of what it planned, and why it did not plan the rest
    stats = sim.policy.plan_stats
    assert stats[PLANNED] == sum(len(p.servers) for p in sim.plans)
    # packing is checked round by round (a plan stops before a round where it would try a
    # pair), not ruled out for as long as some pair of the group could share a GPU
    assert stats["quiet, but packing tries a pair at its next round"] > 0
    assert "a pair of 1-GPU jobs packing may still try" not in stats


def test_planned_rounds_end_before_a_failure_or_a_priority_change_as_if_carried_out():
    jobs = philly_stretch()
    _, sim = run(jobs, "12x4", fast=True)
    # the first change comes in the middle of a plan's second round (later ones may not:
    # the run differs from there on)
    changes = [(p.start(1) + 30.0, p.jobs[0], 1) for p in sim.plans[50:400:25]]
    failures = [(p.start(2) + 17.0, p.servers[0]) for p in sim.plans[20:400:60]]
    slow, _ = run(jobs, "12x4", fast=False, priority_changes=changes, failures=failures)
    fast, sim = run(jobs, "12x4", fast=True, priority_changes=changes, failures=failures)
    assert_same_run(slow, fast)
    assert slow.counts["failures"] == len(failures)
    assert sim.seen["ended at PriorityChange"] > 0  # the policy ended plans it was to change
    assert {t for t, _ in failures} & set(sim.handed_back)  # the simulator, those that failed


def test_only_a_backend_that_carries_rounds_out_itself_is_given_a_plan():
    cluster = Cluster.build("1x4")
    rounds = A.Rounds((0,), 0, 60.0, (), ((),))
    with pytest.raises(InvariantError, match="carries out every round itself"):
        cluster.apply(rounds)
    # and the simulator plans only where every action and report may go unrecorded
    for config in (SimConfig(timeline=True), SimConfig(timeline=False, report_every=100),
                   SimConfig(timeline=False, fast_rounds=False)):
        sim = Simulator(Cluster.build("1x4"), make_policy("gandiva", 0), [], config=config)
        assert not sim.cluster.fast_rounds


def test_under_the_default_rounds_that_would_change_nothing_are_put_off_with_the_same_run():
    """``quiet.py``: the default's one slice order links every rotating server, so nothing is
    planned; but a round that changed nothing is put off until a level or anything else
    changes, failures and priority changes included, and the run is the one of every round."""
    jobs = philly_stretch()
    plans = [(t, jobs[i].id, 1) for t, i in ((20_000.0, 40), (90_000.0, 300))]
    failures = [(50_000.0, 3), (130_000.0, 7)]
    runs = {}
    for fast in (False, True):
        sim = Simulator(Cluster.build("12x4"), make_policy("gandiva", 0), jobs,
                        config=SimConfig(timeline=False, fast_rounds=fast,
                                         priority_changes=plans, failures=failures))
        runs[fast] = sim.run(), sim.policy
    (slow, _), (fast, policy) = runs[False], runs[True]
    assert_same_run(slow, fast)
    assert policy.plan_stats[quiet.PUT_OFF] > 100 and PLANNED not in policy.plan_stats
    assert fast.counts["failures"] == 2


def first_place(jobs, cluster: str, jid: str, policy: str = "gandiva:-pack"
                ) -> dict[bool, float]:
    """When ``jid`` first starts, with rounds put off (True) and with every round (False)."""
    starts = {}
    for fast in (False, True):
        sim = Simulator(Cluster.build(cluster), make_policy(policy, 0), jobs,
                        config=SimConfig(timeline=False, fast_rounds=fast))
        execute = sim.execute

        def noting(action, cluster, sim=sim, execute=execute, fast=fast) -> None:
            if isinstance(action, A.Place) and action.job_id == jid:
                starts.setdefault(fast, sim.now)
            execute(action, cluster)

        sim.execute = noting  # type: ignore[method-assign]
        sim.run()
    return starts


def test_a_server_that_joins_the_next_round_keeps_it_from_being_put_off():
    """a runs and c waits on server 0, b runs on server 1; d arrives just as a round falls
    (600 s) and waits on server 1. With the slice order across rotating servers only, server
    1's round is the next one: the round at 600 s changed nothing, but the next one, with
    server 1 in it, gives d its first turn: it is not put off. With ``balance_all`` (the
    default) server 1 is in the round at 600 s already, and d's first turn is that round."""
    jobs = [job("a", 0, 1, 20_000), job("b", 10, 1, 20_000), job("c", 20, 1, 20_000),
            job("d", 600, 1, 20_000)]
    assert first_place(jobs, "2x1", "d", "gandiva:-pack:-balance_all") == {False: 660.0,
                                                                           True: 660.0}
    assert first_place(jobs, "2x1", "d") == {False: 600.0, True: 600.0}


def test_an_arrival_just_as_a_put_off_round_would_fall_takes_that_round():
    """a runs and c waits (their rounds are put off until a's level changes); d arrives at
    1,200 s, a round's time, on the same server. Every round carried out, the round at 1,200 s
    comes after the arrival and gives d its first turn: so it does with rounds put off."""
    jobs = [job("a", 0, 1, 20_000), job("c", 20, 1, 20_000), job("d", 1200, 1, 20_000)]
    assert first_place(jobs, "1x1", "d") == {False: 1200.0, True: 1200.0}
