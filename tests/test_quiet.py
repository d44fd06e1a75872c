"""Quiet rounds (``policies/gandiva/quiet.py``): rounds that would change nothing are put off,
and nothing about a run may change but its speed."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import job

from gandiva import actions as A
from gandiva.policies import make_policy
from gandiva.sim.engine import SimConfig, SimResult, Simulator
from gandiva.state import Cluster
from gandiva.traces import load_trace


def philly_stretch(first: int = 2500, last: int = 3000):
    """A busy stretch of Philly, from its first job's arrival: 1- to 16-GPU jobs, packing."""
    trace = load_trace("philly", jobs=last)
    jobs = trace.jobs[first:last]
    t0 = jobs[0].submit_time
    return [dataclasses.replace(j, submit_time=j.submit_time - t0) for j in jobs]


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


def test_only_a_backend_that_watches_no_round_lets_rounds_be_put_off():
    for config in (SimConfig(timeline=True), SimConfig(timeline=False, report_every=100),
                   SimConfig(timeline=False, skip_quiet_rounds=False)):
        sim = Simulator(Cluster.build("1x4"), make_policy("gandiva", 0), [], config=config)
        assert not sim.policy.quiet.enabled
    sim = Simulator(Cluster.build("1x4"), make_policy("gandiva", 0), [],
                    config=SimConfig(timeline=False))
    assert sim.policy.quiet.enabled
    assert not make_policy("gandiva", 0).quiet.enabled  # (the real backends' default)


def test_under_the_default_rounds_that_would_change_nothing_are_put_off_with_the_same_run():
    """A round that changed nothing is put off until a level or anything else changes,
    failures and priority changes included, and the run is the one of every round."""
    jobs = philly_stretch()
    plans = [(t, jobs[i].id, 1) for t, i in ((20_000.0, 40), (90_000.0, 300))]
    failures = [(50_000.0, 3), (130_000.0, 7)]
    runs = {}
    for fast in (False, True):
        sim = Simulator(Cluster.build("12x4"), make_policy("gandiva", 0), jobs,
                        config=SimConfig(timeline=False, skip_quiet_rounds=fast,
                                         priority_changes=plans, failures=failures))
        runs[fast] = sim.run(), sim.policy
    (slow, _), (fast, policy) = runs[False], runs[True]
    assert_same_run(slow, fast)
    assert policy.quiet.servers_put_off > 100
    assert fast.counts["failures"] == 2


def first_place(jobs, cluster: str, jid: str, policy: str = "gandiva:-packing"
                ) -> dict[bool, float]:
    """When ``jid`` first starts, with rounds put off (True) and with every round (False)."""
    starts = {}
    for fast in (False, True):
        sim = Simulator(Cluster.build(cluster), make_policy(policy, 0), jobs,
                        config=SimConfig(timeline=False, skip_quiet_rounds=fast))
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
    server 1 in it, gives d its first turn: it is not put off. With ``balance.servers=all``
    (the default) server 1 is in the round at 600 s already, and d's first turn is that round."""
    jobs = [job("a", 0, 1, 20_000), job("b", 10, 1, 20_000), job("c", 20, 1, 20_000),
            job("d", 600, 1, 20_000)]
    rotating = "gandiva:-packing:balance.servers=rotating"
    assert first_place(jobs, "2x1", "d", rotating) == {False: 660.0, True: 660.0}
    assert first_place(jobs, "2x1", "d") == {False: 600.0, True: 600.0}


def test_an_arrival_just_as_a_put_off_round_would_fall_takes_that_round():
    """a runs and c waits (their rounds are put off until a's level changes); d arrives at
    1,200 s, a round's time, on the same server. Every round carried out, the round at 1,200 s
    comes after the arrival and gives d its first turn: so it does with rounds put off."""
    jobs = [job("a", 0, 1, 20_000), job("c", 20, 1, 20_000), job("d", 1200, 1, 20_000)]
    assert first_place(jobs, "1x1", "d") == {False: 1200.0, True: 1200.0}
