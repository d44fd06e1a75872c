"""A job alone on an empty cluster ends exactly when the tables say, for every format's work.

Gavel counts a job's steps at the throughput of its (job type, scale factor) row; a Philly,
Tiresias, Chronus, Pollux or Alibaba duration is wall time at the job's GPU count on the trace's
reference GPU type (gandiva/traces/FORMAT.md). A first placement costs nothing (no checkpoint to
restore), so the job's completion time is its work over its throughput, to float precision.
"""

from __future__ import annotations

import ast
import json
from importlib import resources

import pytest

from gandiva.policies import make_policy
from gandiva.sim.engine import Simulator
from gandiva.sim.perf import default_perf_model
from gandiva.spec import JobSpec
from gandiva.state import Cluster
from gandiva.traces import load_trace

PERF = default_perf_model()
GAVEL = json.loads(resources.files("gandiva").joinpath("data/gavel_throughputs.json")
                   .read_text(encoding="utf-8"))
WORKERS = {"v100": "V100", "p100": "P100", "k80": "K80"}
ROWS = sorted((worker, *ast.literal_eval(key)) for worker in WORKERS for key in GAVEL[worker])


def alone(spec: JobSpec, cluster: str, gpu_type: str, reference_gpu: str = "V100") -> float:
    sim = Simulator(Cluster.build(cluster, gpu_type), make_policy("fifo"), [spec],
                    reference_gpu=reference_gpu)
    (rec,) = sim.run().jobs
    assert rec.finish is not None
    return rec.finish - spec.submit_time


@pytest.mark.parametrize(("worker", "job_type", "scale"), ROWS,
                         ids=[f"{w}-{j}-{n}" for w, j, n in ROWS])
def test_a_gavel_job_runs_its_steps_at_its_rows_throughput(worker, job_type, scale):
    steps_per_s = GAVEL[worker][str((job_type, scale))]["null"]
    if steps_per_s <= 0:
        pytest.skip("Gavel measured no throughput for this row")
    steps = 100_000
    spec = JobSpec("j", 10.0, scale, job_type, mini_batches=steps)
    # servers of 4, so an 8-GPU job spans two: still the consolidated row (Gavel's simulator
    # counts every job at its consolidated throughput)
    assert alone(spec, "4x4", WORKERS[worker]) == pytest.approx(steps / steps_per_s, rel=1e-9)


@pytest.mark.parametrize("scale", [3, 16, 32])
def test_a_gavel_scale_without_a_row_keeps_the_widest_rows_efficiency(scale):
    job_type = "ResNet-50 (batch size 64)"
    rows = GAVEL["v100"]
    one, eight = rows[str((job_type, 1))]["null"], rows[str((job_type, 8))]["null"]
    if scale == 3:  # between 2 and 4: efficiency interpolated
        e2 = rows[str((job_type, 2))]["null"] / one / 2
        e4 = rows[str((job_type, 4))]["null"] / one / 4
        expected = 3 * one * (e2 + e4) / 2
    else:
        expected = scale * eight / 8
    spec = JobSpec("j", 0.0, scale, job_type, mini_batches=50_000)
    assert alone(spec, "8x4", "V100") == pytest.approx(50_000 / expected, rel=1e-9)


def first_wide(trace_name: str) -> tuple[JobSpec, str]:
    trace = load_trace(trace_name)
    spec = next(j for j in trace.jobs if j.num_gpus > 1 and j.num_gpus <= 8)
    return spec, trace.reference_gpu


@pytest.mark.parametrize("trace_name", ["philly", "tiresias-60", "chronus-mix1", "pollux-1",
                                        "alibaba-2023"])
def test_a_trace_duration_is_wall_time_at_the_jobs_width(trace_name):
    spec, reference = first_wide(trace_name)
    assert spec.duration is not None
    assert alone(spec, "4x8", reference, reference) == pytest.approx(spec.duration, rel=1e-9)
    # on another GPU type the same work takes the throughput ratio longer or shorter
    other = "K80" if reference != "K80" else "V100"
    ratio = (PERF.throughput(spec.model, reference, spec.num_gpus)
             / PERF.throughput(spec.model, other, spec.num_gpus))
    assert alone(spec, "4x8", other, reference) == pytest.approx(spec.duration * ratio, rel=1e-9)


def test_our_formats_mini_batches_are_counted_as_gavel_counts_steps(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("job_id,submit_time,num_gpus,duration,mini_batches,model\n"
                    "a,0,4,,40000,resnet50\nb,0,2,3600,,resnet50\n", encoding="utf-8")
    a, b = load_trace(str(path)).jobs
    assert alone(a, "1x4", "V100") == pytest.approx(
        40_000 / PERF.throughput("resnet50", "V100", 4), rel=1e-9)
    assert alone(b, "1x4", "V100") == pytest.approx(3600, rel=1e-9)


def test_a_wider_job_of_the_same_steps_ends_sooner_by_its_scaling():
    job_type = "LM (batch size 80)"
    times = {n: alone(JobSpec("j", 0.0, n, job_type, mini_batches=807_918), "4x4", "V100")
             for n in (1, 4)}
    # the example: 28,609 s at one GPU's speed, 10,800 s at the 4-GPU row (74.8 steps/s)
    assert times[1] == pytest.approx(28_609, abs=1)
    assert times[4] == pytest.approx(10_800, abs=1)


class Pinned:
    """A policy that places each job on the GPUs named for it (to test a placement's cost)."""

    name = "pinned"

    def __init__(self, gpus: dict[str, tuple[int, ...]]) -> None:
        self.gpus = gpus

    def decide(self, event, cluster):
        from gandiva import actions as A
        from gandiva import events as E

        if isinstance(event, E.Arrival):
            yield A.Place(event.job.id, self.gpus[event.job.id])


@pytest.mark.parametrize("model", ["deepspeech2", "cifar10", "LM (batch size 10)",
                                   "Transformer (batch size 64)"])
def test_a_gang_spread_wider_than_it_needs_never_ends_sooner(model):
    """The locality tables are keyed by server count, and some measured rows are not monotone
    in it (Pollux deepspeech2 at 4 GPUs: 2+2 keeps 0.705 of one server's speed, 1+1+1+1 keeps
    0.919). An 8-GPU job on 4-GPU servers spread 4+3+1 must still not beat 4+4."""
    whole = (0, 1, 2, 3, 4, 5, 6, 7)
    spread = (0, 1, 2, 3, 4, 5, 6, 8)
    specs = [JobSpec("whole", 0.0, 8, model, duration=3600.0),
             JobSpec("spread", 0.0, 8, model, duration=3600.0)]
    ends = {}
    for spec, gpus in zip(specs, (whole, spread), strict=True):
        sim = Simulator(Cluster.build("3x4", "T4"), Pinned({spec.id: gpus}), [spec],
                        reference_gpu="T4")
        (rec,) = sim.run().jobs
        ends[spec.id] = rec.finish
    assert ends["whole"] == pytest.approx(3600.0)
    assert ends["spread"] >= ends["whole"]
