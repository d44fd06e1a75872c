"""The simulator's truth: progress, action costs, failures, profiling and metrics, by hand.

Jobs give ``duration`` on V100 and run on V100 clusters, so a job alone on its GPUs,
consolidated, runs exactly ``duration`` seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import jcts, job

from gandiva import actions as A
from gandiva import events as E
from gandiva.metrics import summarize
from gandiva.policies import make_policy
from gandiva.run import percentile
from gandiva.sim.engine import (
    FIRST_FEEDBACK_STEPS,
    JobRecord,
    SimConfig,
    SimResult,
    Simulator,
)
from gandiva.sim.perf import default_perf_model
from gandiva.spec import JobSpec
from gandiva.state import Cluster, InvariantError, JobStatus

PERF = default_perf_model()
MODEL = "resnet50"
STEP = PERF.step_time(MODEL, "V100")
CKPT = PERF.profile(MODEL).checkpoint_mb
PACKED = PERF.packed(MODEL, MODEL, "V100")[0]
SPREAD = PERF.locality(MODEL, 2, False)


def simulate(cluster: str, policy, *jobs: JobSpec, **config) -> tuple[SimResult, Simulator]:
    sim = Simulator(Cluster.build(cluster, "V100"), policy, jobs, config=SimConfig(**config))
    result = sim.run()
    sim.cluster.check_invariants()
    return result, sim


def records(result: SimResult) -> dict[str, JobRecord]:
    return {r.spec.id: r for r in result.jobs}


# ---- tiny policies, real Policy objects ---------------------------------------------------

class Recorder:
    """Wraps a policy and keeps every ProfileSample it is shown."""

    name = "recorder"

    def __init__(self, inner) -> None:
        self.inner = inner
        self.samples: list[E.ProfileSample] = []

    def decide(self, event, cluster):
        if isinstance(event, E.ProfileSample):
            self.samples.append(event)
        yield from self.inner.decide(event, cluster)


class PlaceThenMigrate:
    """Places each job on GPU 0, then at ``at`` migrates job ``a`` to ``to``."""

    name = "place-then-migrate"

    def __init__(self, at: float, to: tuple[int, ...]) -> None:
        self.at, self.to = at, to

    def decide(self, event, cluster):
        if isinstance(event, E.Arrival):
            yield A.Place(event.job.id, (0,))
            yield A.Wake(self.at)
        elif isinstance(event, E.Tick):
            yield A.Migrate("a", self.to)


class PackWhenProfiled:
    """Places jobs on fixed GPUs; once every job is profiled, suspends some and packs them.

    ``pack`` maps a job to the GPUs it is packed onto; ``profiled_first=False`` packs them on
    arrival instead, before any memory is known (which the state must refuse).
    """

    name = "pack-when-profiled"

    def __init__(self, place: dict[str, tuple[int, ...]], pack: dict[str, tuple[int, ...]],
                 profiled_first: bool = True) -> None:
        self.place, self.pack, self.profiled_first = place, pack, profiled_first
        self.packed = False
        self.samples: list[tuple[float, str, float]] = []

    def decide(self, event, cluster):
        if isinstance(event, E.Arrival):
            jid = event.job.id
            if jid in self.place:
                yield A.Place(jid, self.place[jid])
            elif not self.profiled_first:
                yield A.Pack(jid, self.pack[jid])
        elif isinstance(event, E.ProfileSample):
            self.samples.append((event.time, event.job_id, event.mini_batch_time))
            if not self.packed and all(j.memory_gb is not None for j in cluster.jobs.values()):
                self.packed = True
                for jid, gpus in self.pack.items():
                    yield A.Suspend(jid)
                    yield A.Pack(jid, gpus)


# ---- determinism --------------------------------------------------------------------------

MIXED = (job("a", 0, 1, 900), job("b", 5, 2, 400, model="vgg16"), job("c", 10, 4, 300),
         job("d", 15, 1, 200, model="lstm"), job("e", 300, 2, 100), job("f", 320, 8, 60))


def run_mixed(policy: str, seed: int) -> tuple[SimResult, Recorder]:
    rec = Recorder(make_policy(policy, seed))
    result, _ = simulate("2x4", rec, *MIXED, seed=seed)
    return result, rec


def outcome(result: SimResult, rec: Recorder) -> tuple:
    jobs = [(r.spec.id, r.start, r.finish, r.first_feedback, r.done) for r in result.jobs]
    samples = [(s.time, s.job_id, s.mini_batch_time, s.memory_gb) for s in rec.samples]
    return jobs, result.counts, result.timeline, samples


@pytest.mark.parametrize("policy", ["fifo", "las:queue_limits=100"])
def test_same_seed_gives_identical_results(policy):
    first, second = run_mixed(policy, 7), run_mixed(policy, 7)
    assert outcome(*first) == outcome(*second)
    assert first[1].samples, "the policy was shown profile samples"
    if policy.startswith("las"):
        assert first[0].counts["suspends"] > 0, "the trace exercises preemption"


def test_another_seed_changes_profiled_noise_but_not_fifo_jcts():
    (r1, p1), (r2, p2) = run_mixed("fifo", 1), run_mixed("fifo", 2)
    assert jcts(r1) == jcts(r2)
    t1 = [(s.time, s.job_id) for s in p1.samples]
    assert t1 == [(s.time, s.job_id) for s in p2.samples]
    assert [s.mini_batch_time for s in p1.samples] != [s.mini_batch_time for s in p2.samples]


def profiled_with_two_packed_neighbours() -> dict[str, list[float]]:
    """Job g (2 GPUs) shares one GPU with x and one with y; g leaves first, x and y go on."""
    policy = PackWhenProfiled({"g": (0, 1), "x": (2,), "y": (3,)}, {"x": (0,), "y": (1,)})
    simulate("1x4", policy, job("g", 0, 2, 100), job("x", 0, 1, 1000), job("y", 0, 1, 1000))
    out: dict[str, list[float]] = {}
    for _, jid, mbt in policy.samples:
        out.setdefault(jid, []).append(mbt)
    return out


def test_same_seed_gives_identical_results_in_every_process():
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_sim; "
            "print(json.dumps(test_sim.profiled_with_two_packed_neighbours()))")
    outputs = set()
    for hash_seed in ("0", "1"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                              capture_output=True, text=True, env=env, timeout=120, check=True)
        outputs.add(proc.stdout)
    assert len(outputs) == 1


# ---- the performance model's truth --------------------------------------------------------

def test_a_gang_spread_over_two_servers_runs_slower_by_the_locality_factor():
    # a (2) and c (1) hold GPUs on both servers; when b (3) leaves at 100, the 4 free GPUs
    # for g are 2 on server 0 and 3 on server 1: g must spread
    trace = (job("a", 0, 2, 1000), job("b", 0, 3, 100), job("c", 0, 1, 1000),
             job("g", 50, 4, 400))
    result, _ = simulate("2x4", make_policy("fifo"), *trace)
    assert SPREAD < 1.0
    g = records(result)["g"]
    assert g.last_servers == frozenset({0, 1})
    assert g.start == pytest.approx(100)
    assert jcts(result)["g"] == pytest.approx(50 + 400 / SPREAD)
    assert jcts(result)["a"] == pytest.approx(1000)


def test_crossing_sockets_costs_only_a_job_one_socket_could_hold():
    class PlaceAt:
        name = "place-at"

        def decide(self, event, cluster):
            if isinstance(event, E.Arrival):
                yield A.Place(event.job.id, {"pair": (1, 2), "whole": (4, 5, 6, 7)}[event.job.id])

    trace = (job("pair", 0, 2, 600, model="vgg16"), job("whole", 0, 4, 600, model="vgg16"))
    result, _ = simulate("2x4", PlaceAt(), *trace)
    cross = PERF.locality("vgg16", 1, True)
    assert cross < 1.0
    assert jcts(result) == pytest.approx({"pair": 600 / cross, "whole": 600})


def test_first_feedback_is_the_time_to_100_steps_of_the_jobs_loop():
    few = JobSpec("few", 3, 1, MODEL, mini_batches=40)
    trace = (job("a", 0, 1, 1000), job("b", 5, 2, 1000), few)
    result, _ = simulate("1x4", make_policy("fifo"), *trace)
    rec = records(result)
    assert FIRST_FEEDBACK_STEPS == 100
    assert rec["a"].first_feedback == pytest.approx(100 * STEP)
    # a 2-GPU step is two mini-batches, done at the 2-GPU throughput
    two = 200 / PERF.throughput(MODEL, "V100", 2)
    assert rec["b"].first_feedback == pytest.approx(5 + two)
    # a job shorter than 100 mini-batches gives its feedback when it finishes
    assert rec["few"].first_feedback == rec["few"].finish == pytest.approx(3 + 40 * STEP)
    s = summarize(result)
    assert s["mean_first_feedback_s"] == pytest.approx((100 * STEP + two + 40 * STEP) / 3)


@pytest.mark.parametrize(("fail_at", "lost"), [(700.0, 100.0), (600.0, 0.0), (250.0, 250.0)])
def test_node_failure_loses_the_work_since_the_last_checkpoint(fail_at, lost):
    result, sim = simulate("2x1", make_policy("fifo"), job("a", 0, 1, 1000),
                           failures=[(fail_at, 0)], checkpoint_interval=300.0)
    a = records(result)["a"]
    # the job restarts at once on the other server from its checkpoint, paying the restore
    # (a checkpoint move across servers), and redoes `lost` s
    assert a.last_servers == frozenset({1})
    assert jcts(result)["a"] == pytest.approx(1000 + lost + PERF.migration_time(CKPT, True))
    assert result.counts["failures"] == 1 and result.counts["places"] == 2
    assert not sim.cluster.nodes[0].up and sim.cluster.finished == 1


def test_node_failure_of_an_idle_server_changes_nothing():
    result, _ = simulate("2x1", make_policy("fifo"), job("a", 0, 1, 1000),
                         failures=[(500.0, 1)], checkpoint_interval=300.0)
    assert jcts(result)["a"] == pytest.approx(1000)
    assert result.counts["places"] == 1


# ---- action costs, through a policy -------------------------------------------------------

@pytest.mark.parametrize(("cluster", "across"), [("1x2", False), ("2x1", True)])
def test_migration_stalls_the_job_for_its_checkpoint_move(cluster, across):
    result, sim = simulate(cluster, PlaceThenMigrate(100.0, (1,)), job("a", 0, 1, 1000))
    stall = PERF.migration_time(CKPT, across)
    assert stall > 0
    assert jcts(result)["a"] == pytest.approx(1000 + stall)
    assert records(result)["a"].gpus == () and sim.cluster.jobs["a"].migrations == 1
    assert summarize(result)["migrations"] == 1


class TakeTurns:
    """Time-slices every job on GPU 0 by hand: each ``quantum`` the running job is suspended
    and the next one, in arrival order, starts or resumes. ``sim`` is set by the test; at
    every turn the policy notes how many completion events each job has queued."""

    name = "take-turns"

    def __init__(self, quantum: float) -> None:
        self.quantum = quantum
        self.sim: Simulator | None = None
        self.most_queued = 0

    def decide(self, event, cluster):
        if isinstance(event, E.Arrival) and not cluster.running:
            yield A.Place(event.job.id, (0,))
        if isinstance(event, E.Arrival | E.Tick) and cluster.finished < len(cluster.jobs):
            yield A.Wake((event.time // self.quantum + 1) * self.quantum)
        if isinstance(event, E.Tick):
            self.most_queued = max(self.most_queued,
                                   *(len(r.queued) for r in self.sim.records.values()))
            ready = [j for j in cluster.jobs.values()
                     if j.status in (JobStatus.QUEUED, JobStatus.SUSPENDED)]
            if not ready:
                return
            for jid in list(cluster.running):
                yield A.Suspend(jid)
            nxt = min(ready, key=lambda j: (j.start_time is not None, j.seq))
            if nxt.status is JobStatus.SUSPENDED:
                yield A.Resume(nxt.id, (0,))
            else:
                yield A.Place(nxt.id, (0,))


def test_a_time_sliced_job_finishes_when_its_work_is_done_with_one_completion_queued():
    # a and b alternate on one GPU every 60 s; a resume stalls the job for its suspend and
    # resume. The completion planned at a turn's start is void once the job is suspended;
    # it stays queued and is planned again when it comes, rather than one queued per turn
    policy = TakeTurns(60.0)
    sim = Simulator(Cluster.build("1x1", "V100"), policy, (job("a", 0, 1, 300),
                                                          job("b", 0, 1, 1000)))
    policy.sim = sim
    result = sim.run()
    resume = PERF.suspend_resume_time(CKPT)
    left, t, turns, ran, finish = {"a": 300.0, "b": 1000.0}, 0.0, 0, set(), {}
    while left:  # by hand: turns in arrival order; the last job left runs to its end
        jid = ("a", "b")[turns % 2] if len(left) == 2 else next(iter(left))
        stall = resume if jid in ran else 0.0
        ran.add(jid)
        run = min(left[jid], 60.0 - stall) if len(left) == 2 else left[jid]
        left[jid] -= run
        if left[jid] <= 1e-9:
            finish[jid] = t + stall + run
            del left[jid]
        t += 60.0
        turns += 1
    assert jcts(result) == pytest.approx(finish)
    assert policy.most_queued == 1
    assert result.counts["suspends"] == 10  # five turns each before a is done


def test_packed_jobs_progress_at_the_packed_fractions():
    policy = PackWhenProfiled({"a": (0,), "b": (1,)}, {"b": (0,)})
    result, _ = simulate("1x2", policy, job("a", 0, 1, 1000), job("b", 0, 1, 2000),
                         profile_noise=0.0)
    assert 0 < PACKED < 1
    t = min(20 * STEP, 60.0)  # both profiled after 20 mini-batches: b is suspended and packed
    resume = PERF.suspend_resume_time(CKPT)
    a_end = t + (1000 - t) / PACKED  # a shares GPU 0 from t on
    b_left = 2000 - t - (a_end - t - resume) * PACKED  # b shared after its resume, then alone
    assert jcts(result) == pytest.approx({"a": a_end, "b": a_end + b_left})
    s = summarize(result)
    assert (s["packs"], s["suspends"]) == (1, 1)


def test_packing_before_memory_is_profiled_is_refused():
    policy = PackWhenProfiled({"a": (0,)}, {"b": (0,)}, profiled_first=False)
    with pytest.raises(InvariantError, match="before profiling memory"):
        simulate("1x1", policy, job("a", 0, 1, 100), job("b", 1, 1, 100))


def test_a_job_packed_with_a_failed_gang_speeds_up_once_alone():
    policy = PackWhenProfiled({"g": (0, 1), "p": (2,)}, {"p": (1,)})
    result, _ = simulate("3x1", policy, job("g", 0, 2, 5000), job("p", 0, 1, 1000),
                         profile_noise=0.0, failures=[(500.0, 0)])
    # g's first profile comes after 20 steps; it spans servers 0 and 1, as few as 1-GPU servers
    # allow: no extra cost
    t = 20 * 2 / PERF.throughput(MODEL, "V100", 2)
    move = PERF.migration_time(CKPT, True)  # p moves from server 2 to server 1
    left = 1000 - t - (500 - t - move) * PACKED
    assert jcts(result)["p"] == pytest.approx(500 + left)


def test_timeline_marks_shared_time_only():
    policy = PackWhenProfiled({"a": (0,), "b": (1,)}, {"b": (0,)})
    result, _ = simulate("1x2", policy, job("a", 0, 1, 1000), job("b", 0, 1, 2000),
                         profile_noise=0.0)
    t = min(20 * STEP, 60.0)
    a_end = records(result)["a"].finish
    for gpu, jid, start, end, shared in result.timeline:
        if gpu != 0:
            continue
        if shared:
            assert t - 1e-6 <= start and end <= a_end + 1e-6, (jid, start, end)
        else:
            assert end <= t + 1e-6 or start >= a_end - 1e-6, (jid, start, end)


# ---- profiling ----------------------------------------------------------------------------

SPREAD_TRACE = (job("a", 0, 2, 1000), job("b", 0, 3, 100), job("c", 0, 1, 1000),
                job("g", 50, 4, 400))


def profile_samples(noise: float) -> list[tuple[E.ProfileSample, float]]:
    """Every sample the policy saw, with the true mini-batch time at that moment."""
    rec = Recorder(make_policy("fifo"))
    simulate("2x4", rec, *SPREAD_TRACE, profile_noise=noise)
    # one step of the job's loop: N mini-batches at the N-GPU throughput
    truth = {"a": 2 / PERF.throughput(MODEL, "V100", 2), "b": 3 / PERF.throughput(MODEL, "V100", 3),
             "c": STEP, "g": 4 / PERF.throughput(MODEL, "V100", 4) / SPREAD}
    return [(s, truth[s.job_id]) for s in rec.samples]


def test_profile_samples_reach_the_policy_noisy_but_close_to_the_truth():
    noise = 0.05
    samples = profile_samples(noise)
    assert {s.job_id for s, _ in samples} == {"a", "b", "c", "g"}
    for s, truth in samples:
        assert abs(s.mini_batch_time / truth - 1) <= 5 * noise, s
        assert s.mini_batch_time != truth
        assert s.memory_gb == pytest.approx(PERF.profile(MODEL).memory_gb, rel=5 * noise)
        assert s.mini_batches_done >= 19  # measured after a warm-up of 20 steps


def test_profile_samples_without_noise_are_the_truth():
    samples = profile_samples(0.0)
    assert samples
    for s, truth in samples:
        assert s.mini_batch_time == pytest.approx(truth, rel=1e-12)
        assert s.memory_gb == PERF.profile(MODEL).memory_gb


# ---- metrics, by hand ---------------------------------------------------------------------

def test_summary_of_three_jobs_on_one_gpu():
    trace = (job("a", 0, 1, 100), job("b", 50, 1, 100), job("c", 300, 1, 50))
    s = summarize(simulate("1x1", make_policy("fifo"), *trace)[0])
    # a 0-100, b waits 50 then runs 100-200, idle 200-300, c 300-350
    assert s["jobs"] == s["finished"] == 3
    assert s["mean_jct_s"] == pytest.approx((100 + 150 + 50) / 3)
    assert s["makespan_s"] == pytest.approx(350)
    assert s["utilization"] == pytest.approx(250 / 350)
    assert s["useful_utilization"] == pytest.approx(250 / 350)
    assert s["mean_queue_s"] == pytest.approx(50 / 3)
    assert s["mean_first_feedback_s"] == pytest.approx((50 + 300 * STEP) / 3)
    # Themis rho: a shared with 1.5 jobs on average, b with 4/3, c was alone
    rho = [100 / (100 * 1.5), 150 / (100 * 4 / 3), 1.0]
    assert s["max_ftf_rho"] == pytest.approx(max(rho))
    assert s["mean_ftf_rho"] == pytest.approx(sum(rho) / 3)


@pytest.mark.parametrize(("cluster", "gpus"), [("1x4", 1), ("2x4", 4), ("1x1", 1)])
def test_a_lone_job_has_fairness_rho_one(cluster, gpus):
    result, _ = simulate(cluster, make_policy("las"), job("solo", 20, gpus, 500))
    s = summarize(result)
    assert s["max_ftf_rho"] == pytest.approx(1.0)
    assert s["mean_jct_s"] == pytest.approx(500)
    assert s["mean_queue_s"] == 0
    assert s["utilization"] == pytest.approx(gpus / result.cluster_gpus)


def test_percentile_interpolates_linearly():
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)
    assert percentile([7], 99) == 7



def test_the_breakdown_by_width_splits_each_jct_into_queue_sliced_out_running_and_stalls():
    trace = (job("a", 0, 1, 1000), job("b", 0, 1, 1000), job("w", 0, 2, 500))
    fifo, _ = simulate("1x2", make_policy("fifo"), *trace)
    one = summarize(fifo)["by_width"]["1"]
    # a and b run at once on the two GPUs; w waits for both, then runs alone
    assert (one["jobs"], one["queue_s"], one["sliced_out_s"], one["stalled_s"]) == (2, 0, 0, 0)
    assert one["running_s"] == pytest.approx(1000) == one["alone_s"]
    two = summarize(fifo)["by_width"]["2-4"]
    assert two["queue_s"] == pytest.approx(1000) and two["running_s"] == pytest.approx(500)
    sliced, _ = simulate("1x2", make_policy("gandiva:quantum=60:-slices.keep_turn"), *trace)
    for width in summarize(sliced)["by_width"].values():
        parts = (width["queue_s"] + width["sliced_out_s"] + width["running_s"]
                 + width["stalled_s"])
        assert parts == pytest.approx(width["mean_jct_s"])
        assert width["sliced_out_s"] > 0 and width["stalled_s"] > 0  # they took turns
