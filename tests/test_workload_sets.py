"""The workloads the policy is chosen on and reported on: the matrix's tuning and validation
sets (benchmarks/policy_matrix.py) and Gavel's generated traces (benchmarks/gavel_ground.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gavel_ground  # noqa: E402
import policy_matrix  # noqa: E402

from gandiva.sim.perf import default_perf_model  # noqa: E402
from gandiva.traces.bundled import BUNDLED  # noqa: E402


def test_tuning_and_validation_share_no_trace_family_and_cover_every_bundled_trace() -> None:
    tuning = policy_matrix.workloads("tuning")
    validation = policy_matrix.workloads("validation")
    assert set(tuning).isdisjoint(validation)
    assert {policy_matrix.family(w) for w in tuning}.isdisjoint(
        policy_matrix.family(w) for w in validation)
    assert set(BUNDLED) <= set(tuning) | set(validation)
    assert sorted(tuning + validation) == sorted(policy_matrix.workloads("both"))
    assert policy_matrix.family("gavel-philly-0e4a51") == "gavel"
    assert policy_matrix.family("philly@30d") == "philly"


def test_a_window_holds_the_first_jobs_submitted_from_its_day_on() -> None:
    from gandiva.traces import load_trace

    whole = {j.id: j.submit_time for j in load_trace("philly").jobs}
    window = policy_matrix.first_jobs("philly@30d", 50)
    assert len(window.jobs) == 50
    assert all(whole[j.id] >= 30 * 86400 for j in window.jobs)  # shifted to start at 0
    earlier = [i for i, t in whole.items() if 30 * 86400 <= t < whole[window.jobs[-1].id]]
    assert set(earlier) <= {j.id for j in window.jobs}  # none skipped


def test_gavels_generator_gives_gavels_seed_0_jobs() -> None:
    """The first jobs of Gavel's multi-GPU stream at seed 0, as Gavel's own generate_job
    (scheduler/utils.py at c4fa400) draws them: type, width, minutes on dedicated V100s."""
    trace = gavel_ground.gavel_jobs(2.0, 6, multi_gpu=True, seed=0)
    got = [(j.model, j.num_gpus, round(j.duration / 60, 3)) for j in trace.jobs]
    assert got == [("ResNet-18 (batch size 64)", 8, 1139.073),
                   ("Transformer (batch size 16)", 1, 516.943),
                   ("Recommendation (batch size 2048)", 1, 35.777),
                   ("Recommendation (batch size 8192)", 1, 123.111),
                   ("LM (batch size 5)", 4, 114.312),
                   ("Transformer (batch size 64)", 1, 7430.755)]
    times = [j.submit_time for j in trace.jobs]
    assert times[0] == 0.0 and times == sorted(set(times))  # Poisson arrivals from 0


@pytest.mark.parametrize("multi_gpu", [False, True])
def test_gavels_generated_jobs_are_ones_the_performance_model_knows(multi_gpu: bool) -> None:
    perf = default_perf_model()
    trace = gavel_ground.gavel_jobs(4.0, 400, multi_gpu=multi_gpu)
    widths = {j.num_gpus for j in trace.jobs}
    assert widths == ({1, 2, 4, 8} if multi_gpu else {1})
    for job in trace.jobs:
        assert perf.throughput(job.model, "V100", job.num_gpus) > 0
        if job.num_gpus > 1:
            assert gavel_ground.TEMPLATES.index(job.model) < gavel_ground.DISTRIBUTED
