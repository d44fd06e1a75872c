"""Metrics of one simulated run: JCT, makespan, utilisation, early feedback, fairness.

Finish-time fairness follows Themis (Mahajan et al., NSDI 2020): rho = shared JCT / JCT alone
on 1/N of the cluster, N the time-averaged number of jobs in the system during the job's life.
"On 1/N of the cluster" we read as: the job runs at full speed if G/N GPUs cover its gang,
otherwise proportionally slower, so T_alone = solo time x max(1, N x gpus / G).
"""

from __future__ import annotations

import math
from typing import Any

from gandiva.run import mean, outcome
from gandiva.sim.engine import SimResult


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
        done = [r for r in finished(result) if low <= r.spec.num_gpus <= high]
        if done:
            out[label] = time_split(done)
    return out


def finished(result: SimResult) -> list:
    """The jobs that started and finished (the ones ``time_split`` can split)."""
    return [r for r in result.jobs if r.finish is not None and r.start is not None]


def time_split(done: list) -> dict[str, float]:
    """Where ``done`` (finished jobs) spent their time, mean seconds per job (``by_width``)."""
    n = len(done)
    return {
        "jobs": n,
        "mean_jct_s": sum(r.finish - r.spec.submit_time for r in done) / n,
        "queue_s": sum(r.start - r.spec.submit_time for r in done) / n,
        "sliced_out_s": sum(r.finish - r.start - r.held_s for r in done) / n,
        "running_s": sum(r.held_s - r.stall_s for r in done) / n,
        "stalled_s": sum(r.stall_s for r in done) / n,
        "alone_s": sum(r.solo_time for r in done) / n,
    }


def summarize(result: SimResult) -> dict[str, Any]:
    """The numbers ``gandiva simulate`` prints and writes to ``--json``: every run's
    (``run.outcome``), and what only the simulator knows (utilisation as areas, the time each
    job would have taken alone, finish-time fairness)."""
    done = [r for r in result.jobs if r.finish is not None]
    start, end = result.span
    capacity = result.cluster_gpus * max(end - start, 0.0)
    useful = sum(r.solo_time * r.spec.num_gpus for r in done)
    # what nvidia-smi would average: the useful GPU time weighted by each model's utilisation
    busy = sum(r.solo_time * r.spec.num_gpus * r.utilization for r in done)
    rhos = ftf_rho(result)
    return {
        **outcome(result),
        "utilization": result.allocated_gpu_seconds / capacity if capacity else 0.0,
        "useful_utilization": useful / capacity if capacity else 0.0,
        "sm_utilization": busy / capacity if capacity else 0.0,
        "max_ftf_rho": max(rhos, default=math.nan),
        "mean_ftf_rho": mean(rhos),
        "by_width": by_width(result),
    }
