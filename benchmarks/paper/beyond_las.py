"""Beyond the paper: gandiva against Tiresias-style LAS on the same workloads.

The paper gives no cluster-wide fairness and LAS-style schedulers beat it on mean JCT. This
compares fifo, las, gandiva as the paper has it (round-robin time slices, newcomers queue
once every server is at max_height), gandiva with time slices ordered by attained service
(``slice_order=las``), gandiva with least-attained-service admission when the cluster is
full (``las_admission``, ``policies/gandiva/admission.py``), and both, on: the paper's 180-GPU
workload, the Philly trace replay, and the first jobs of the Chronus Philly trace.

What it shows (2026-11-30): every gandiva variant beats las on mean JCT on all three
workloads, and on GPU utilisation everywhere. The paper's gandiva also leads on early feedback
on the first two; on the Chronus stretch (3,000 jobs on 64 GPUs, servers at max_height) las
gives newcomers the GPU at once and leads on feedback.
``gandiva-paper:admission.rule=las:slices.order=las`` ("both") beats las on all three metrics
on all three workloads, at some mean JCT against the paper's gandiva on the first two.

Usage: python benchmarks/paper/beyond_las.py [--chronus-jobs 3000]
"""

from __future__ import annotations

import argparse

import cluster180
import trace_replay
from common import PAPER, console, emit, run_policies
from rich.table import Table

from gandiva.traces import load_trace

POLICIES = {"fifo": "fifo", "las": "las", "gandiva (paper)": PAPER,
            "gandiva+las-slices": f"{PAPER}:slices.order=las",
            "gandiva+las-admission": f"{PAPER}:admission.rule=las",
            "gandiva+both": f"{PAPER}:admission.rule=las:slices.order=las",
            "gandiva (default)": "gandiva"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chronus-jobs", type=int, default=3000)
    args = ap.parse_args()
    workloads = {
        "paper-180 (1,000 jobs, 180 GPUs)": (cluster180.workload(1000, 0), cluster180.CLUSTER),
        "philly replay (8,800 jobs, 100 GPUs)": (trace_replay.workload(8800, "vc_6214e9")[0],
                                                 trace_replay.CLUSTER),
        f"chronus-mix1 ({args.chronus_jobs:,} jobs, 64 GPUs)": (
            load_trace("chronus-mix1", jobs=args.chronus_jobs), "16x4"),
    }
    table = Table(title="gandiva vs las: mean JCT / first 100 mini-batches / GPU utilisation")
    table.add_column("workload")
    for p in POLICIES:
        table.add_column(p, justify="right")
    out = {}
    for name, (trace, cluster) in workloads.items():
        res = run_policies(trace, POLICIES, cluster)
        out[name] = {p: {k: res[p][k] for k in ("mean_jct_s", "mean_first_feedback_s",
                                                 "sm_utilization", "utilization", "wall_s")}
                     for p in POLICIES}
        table.add_row(name, *(f"{r['mean_jct_s'] / 60:,.0f} min / "
                              f"{r['mean_first_feedback_s'] / 60:,.1f} min / "
                              f"{100 * r['sm_utilization']:.0f}%" for r in res.values()))
    console.print(table)
    emit("beyond-las", {"workloads": out})


if __name__ == "__main__":
    main()
