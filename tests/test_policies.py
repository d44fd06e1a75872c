"""The baselines' decisions on small hand-built clusters, with hand-computed JCTs."""

import pytest
from conftest import drive, jcts, job

from gandiva import actions as A
from gandiva import events as E
from gandiva.metrics import summarize
from gandiva.policies import available, make_policy
from gandiva.policies.placement import best_fit
from gandiva.sim.perf import default_perf_model
from gandiva.sim.run import simulate
from gandiva.spec import JobSpec
from gandiva.state import Cluster, JobStatus


def test_policy_registry_and_parameters():
    assert {"fifo", "las"} <= set(available())
    assert make_policy("fifo:backfill").backfill is True
    assert make_policy("las:queue_limits=5/50").queue_limits == (5.0, 50.0)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")
    with pytest.raises(ValueError, match="no parameter 'colour'"):
        make_policy("fifo:colour=red")
    with pytest.raises(ValueError, match="backfill_depth"):
        make_policy("fifo:backfill_depth=many")


def test_the_registry_names_every_policy_module_and_each_of_its_presets_once():
    """Policies are listed, not discovered: a module that builds a policy and is not in
    ``POLICIES`` (or a preset left out) is a policy no one can name."""
    import importlib
    import pkgutil

    import gandiva.policies as policies

    built = {}
    for m in pkgutil.iter_modules(policies.__path__):
        module = importlib.import_module(f"gandiva.policies.{m.name}")
        if hasattr(module, "POLICY") or hasattr(module, "build"):
            built |= dict.fromkeys(getattr(module, "PRESETS", {m.name: None}), m.name)
    assert policies.POLICIES == built
    assert available() == sorted(built)


def test_what_a_policy_can_show_is_a_capability_it_has_not_an_attribute_probed():
    from gandiva.backends.explain import placements, quantum
    from gandiva.policies import AssignsServers, TimeSlices

    for name in ("fifo", "las"):
        policy = make_policy(name)
        assert not isinstance(policy, AssignsServers | TimeSlices)
        assert placements(policy) is quantum(policy) is None
    for spec, q in (("slicer:quantum=3", 3.0), ("gandiva:quantum=7", 7.0), ("gandiva-paper", 60.0)):
        policy = make_policy(spec)
        assert isinstance(policy, AssignsServers) and isinstance(policy, TimeSlices)
        assert quantum(policy) == q and placements(policy) is not None


def test_best_fit_prefers_fullest_server_and_one_socket():
    c = Cluster.build("2x4")
    c.observe(E.Arrival(0, JobSpec("x", 0, 3, "resnet50", duration=1)))
    c.apply(A.Place("x", (0, 1, 2)))
    assert best_fit(c, 1) == (3,)  # server 0 has one free GPU left: fill it first
    assert best_fit(c, 2) == (4, 5)  # same socket of the empty server
    assert best_fit(c, 5) is not None and len(set(best_fit(c, 5))) == 5
    assert best_fit(c, 6) is None


def test_best_fit_takes_whole_servers_for_big_gangs():
    c = Cluster.build("3x4")
    c.observe(E.Arrival(0, JobSpec("x", 0, 1, "resnet50", duration=1)))
    c.apply(A.Place("x", (0,)))
    gpus = best_fit(c, 8)
    assert sorted(gpus) == list(range(4, 12))


def test_fifo_three_jobs_two_gpus_exact(make_trace):
    trace = make_trace(job("a", 0, 1, 100), job("b", 10, 2, 50), job("c", 20, 1, 30))
    strict = simulate(trace, "fifo", cluster="1x2")
    assert jcts(strict) == pytest.approx({"a": 100, "b": 140, "c": 160})
    s = summarize(strict)
    assert s["mean_jct_s"] == pytest.approx(400 / 3)
    assert s["makespan_s"] == pytest.approx(180)
    assert s["mean_queue_s"] == pytest.approx((0 + 90 + 130) / 3)
    # busy GPU-seconds: a 100, b 2x50, c 30 over 2 GPUs x 180 s
    assert s["utilization"] == pytest.approx(230 / 360)
    backfill = simulate(trace, "fifo:backfill", cluster="1x2")
    assert jcts(backfill) == pytest.approx({"a": 100, "b": 140, "c": 30})


def test_las_preempts_for_newcomers_and_charges_resume(make_trace):
    trace = make_trace(job("a", 0, 1, 100), job("b", 10, 1, 20))
    res = simulate(trace, "las:queue_limits=5", cluster="1x1")
    perf = default_perf_model()
    c = perf.suspend_resume_time(perf.profile("resnet50").checkpoint_mb)
    # a: 0-10, b: 10-15 (crosses 5 GPU-s, falls behind older a), a: 15+c .. 105+c, b resumes
    assert jcts(res) == pytest.approx({"a": 105 + c, "b": 110 + 2 * c})
    assert res.counts["suspends"] == 2 and res.counts["resumes"] == 2


def test_las_beats_fifo_on_mean_jct_with_a_long_job_ahead(make_trace):
    trace = make_trace(job("long", 0, 1, 3600), *(job(f"s{i}", 10 + i, 1, 60) for i in range(5)))
    fifo = summarize(simulate(trace, "fifo", cluster="1x1"))
    las = summarize(simulate(trace, "las:queue_limits=120", cluster="1x1"))
    assert las["mean_jct_s"] < fifo["mean_jct_s"] / 2
    assert las["suspends"] >= 1 and fifo["suspends"] == 0


def test_gang_waits_for_a_whole_server_under_locality_aware_fifo(make_trace):
    trace = make_trace(job("one", 0, 1, 100), job("four", 1, 4, 100))
    res = simulate(trace, "fifo", cluster="2x4")
    rec = {r.spec.id: r for r in res.jobs}
    # the 4-GPU gang gets the empty server, not 3 + 1 spread over two
    assert jcts(res)["four"] == pytest.approx(100)
    assert rec["four"].last_servers == frozenset({1})


@pytest.mark.parametrize("policy", ["fifo", "las", "gandiva:-placement.oversubscribe", "gandiva"])
def test_a_job_cancelled_while_queued_or_suspended_is_never_started(policy):
    from gandiva import events as E
    from gandiva.policies import make_policy
    from gandiva.scheduler import Scheduler
    from gandiva.state import Cluster, JobStatus

    done = []

    class Record:
        def execute(self, action, cluster):
            done.append(action)

    cluster = Cluster.build("1x1")
    sched = Scheduler(cluster, make_policy(policy), Record())
    for i, jid in enumerate(("a", "b", "c")):
        sched.handle(E.Arrival(float(i), job(jid, float(i), 1, 600)))
    sched.handle(E.Tick(120.0))  # gandiva time-slices: b or c may have run and be suspended
    for jid in ("b", "c"):
        sched.handle(E.Departure(130.0, jid, how="cancelled"))
        assert cluster.jobs[jid].status is JobStatus.KILLED
    cluster.check_invariants()
    before = len(done)
    running = [j for j in cluster.jobs.values() if j.status is JobStatus.RUNNING]
    for j in running:
        sched.handle(E.Departure(700.0, j.id))
    sched.handle(E.Tick(800.0))
    started = {a.job_id for a in done[before:] if hasattr(a, "gpus")}
    assert not started & {"b", "c"}
    assert cluster.free_count() == 1 and not cluster.queue and not cluster.suspended


@pytest.mark.parametrize("policy", ["fifo", "las", "gandiva", "gandiva:-placement.oversubscribe"])
def test_jobs_that_did_not_fit_start_on_a_server_that_joins(policy):
    # one 2-GPU server: a runs; b waits, and wide is wider than any server yet
    sched, _ = drive("1x2", policy, E.Arrival(0.0, job("a", 0, 2, 600)),
                     E.Arrival(1.0, job("b", 1, 2, 600)), E.Arrival(2.0, job("wide", 2, 4, 600)))
    cluster = sched.cluster
    assert [j.status for j in cluster.jobs.values()] == [JobStatus.RUNNING] + [
        JobStatus.QUEUED] * 2
    sched.handle(E.Join(10.0, 6, "V100", 16.0))
    cluster.check_invariants()
    assert all(j.status is JobStatus.RUNNING for j in cluster.jobs.values())
    assert cluster.servers_of(cluster.jobs["b"].gpus + cluster.jobs["wide"].gpus) == {1}


@pytest.mark.parametrize("policy", ["fifo", "las", "gandiva"])
def test_a_cancelled_jobs_device_goes_to_a_waiting_job_in_the_same_decision(policy):
    """What a sweep relies on: the device of a trial it stops is reused at once, not at the
    next time-slicing round."""
    from conftest import drive

    from gandiva import actions as A
    from gandiva import events as E

    sched, actions = drive("1x1", policy, *(E.Arrival(float(i), job(j, float(i), 1, 600))
                                            for i, j in enumerate(("a", "b"))))
    running = [j.id for j in sched.cluster.jobs.values() if j.gpus]
    assert len(running) == 1
    before = len(actions)
    sched.handle(E.Departure(10.0, running[0], how="cancelled"))
    started = [a for a in actions[before:] if isinstance(a, A.Place | A.Resume)]
    assert [a.job_id for a in started] == [j for j in "ab" if j != running[0]]
