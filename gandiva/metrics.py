"""Metrics of one simulated run: JCT, makespan, utilisation, early feedback, fairness.

Finish-time fairness follows Themis (Mahajan et al., NSDI 2020): rho = shared JCT / JCT alone
on 1/N of the cluster, N the time-averaged number of jobs in the system during the job's life.
"On 1/N of the cluster" we read as: the job runs at full speed if G/N GPUs cover its gang,
otherwise proportionally slower, so T_alone = solo time x max(1, N x gpus / G).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gandiva.sim.engine import SimResult


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def ftf_rho(result: SimResult) -> list[float]:
    rhos = []
    for r in result.jobs:
        if r.finish is None:
            continue
        life = r.finish - r.spec.submit_time
        if life <= 0:
            rhos.append(1.0)
            continue
        n_avg = (r.active_area_at_finish - r.active_area_at_submit) / life
        alone = r.solo_time * max(1.0, n_avg * r.spec.num_gpus / result.cluster_gpus)
        rhos.append(life / alone if alone > 0 else 1.0)
    return rhos


WIDTHS = (("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), ("9+", 9, 1 << 30))


def by_width(result: SimResult) -> dict[str, dict[str, float]]:
    """Where finished jobs of each width spent their time, mean seconds per job: waiting for
    their first GPUs (queue), suspended or waiting for their turn after that (sliced out),
    on GPUs making progress (running: above ``alone`` when packed, spread or on slower GPUs),
    and stalled on GPUs (suspend/resume, migration, restore). Queue + sliced out + running +
    stalled = JCT. Only widths with finished jobs appear."""
    out = {}
    for label, low, high in WIDTHS:
        done = [r for r in result.jobs if r.finish is not None and r.start is not None
                and low <= r.spec.num_gpus <= high]
        if not done:
            continue
        n = len(done)
        out[label] = {
            "jobs": n,
            "mean_jct_s": sum(r.finish - r.spec.submit_time for r in done) / n,
            "queue_s": sum(r.start - r.spec.submit_time for r in done) / n,
            "sliced_out_s": sum(r.finish - r.start - r.held_s for r in done) / n,
            "running_s": sum(r.held_s - r.stall_s for r in done) / n,
            "stalled_s": sum(r.stall_s for r in done) / n,
            "alone_s": sum(r.solo_time for r in done) / n,
        }
    return out


def summarize(result: SimResult) -> dict[str, Any]:
    """The numbers ``gandiva simulate`` prints and writes to ``--json``."""
    done = [r for r in result.jobs if r.finish is not None]
    jct = [r.finish - r.spec.submit_time for r in done]  # type: ignore[operator]
    start, end = result.span
    makespan = max(end - start, 0.0)
    capacity = result.cluster_gpus * makespan
    useful = sum(r.solo_time * r.spec.num_gpus for r in done)
    # what nvidia-smi would average: the useful GPU time weighted by each model's utilisation
    busy = sum(r.solo_time * r.spec.num_gpus * r.utilization for r in done)
    queue = [r.start - r.spec.submit_time for r in result.jobs if r.start is not None]
    feedback = [r.first_feedback - r.spec.submit_time for r in done
                if r.first_feedback is not None]
    rhos = ftf_rho(result)
    return {
        "mean_jct_s": _mean(jct),
        "p50_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "p99_jct_s": percentile(jct, 99),
        "makespan_s": makespan,
        "utilization": result.allocated_gpu_seconds / capacity if capacity else 0.0,
        "useful_utilization": useful / capacity if capacity else 0.0,
        "sm_utilization": busy / capacity if capacity else 0.0,
        "mean_queue_s": _mean(queue),
        "mean_first_feedback_s": _mean(feedback),
        "suspends": result.counts["suspends"] + result.counts["unpacks"],
        "migrations": result.counts["migrations"],
        "packs": result.counts["packs"],
        "max_ftf_rho": max(rhos, default=math.nan),
        "mean_ftf_rho": _mean(rhos),
        "jobs": len(result.jobs),
        "finished": len(done),
        "by_width": by_width(result),
    }
