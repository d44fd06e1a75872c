"""fifo, las and gandiva on every bundled trace at two loads: who wins where, and by how much.

For each trace (its first --jobs jobs) the offered load is the GPUs the jobs keep busy on
average if each ran alone from its arrival; two clusters of 4-GPU servers are sized from it:
- short queue: the cluster is twice the average demand (load 0.5);
- long queue: the cluster is 0.8 of the average demand (load 1.25: the queue grows);
never smaller than the widest job. Each cell: mean JCT, p95 JCT, mean time to first feedback
(100 steps), GPU allocation and useful utilisation. A trace's "win" cell says whether
gandiva's mean JCT is at most LAS's (the goal of issue 17), and whether it keeps its
first-feedback lead over FIFO.

Two utilisations, both over the GPUs' time from the first arrival to the last finish:
- allocation: the GPU time jobs held. Work lost or repeated (restarts, suspend and resume)
  raises it and packing (two jobs on one GPU, counted once) lowers it, so more is not better;
- useful: the GPU time the finished jobs would have taken alone. Every policy does the same
  work, so it differs only by the span: a policy that leaves GPUs idle while work remains
  ends later and scores lower. This is the utilisation lead issue 17 asks gandiva to keep.

Usage: python benchmarks/policy_matrix.py [--quick] [--jobs 2000] [--traces a,b,...] [--workers 2]
--quick: six traces of different kinds, 300 jobs each (a minute or two on 2 cores).
Prints a table and one JSON line, and keeps the run in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import time

from paper.common import kept_stem
from rich.console import Console
from rich.table import Table

from gandiva.metrics import summarize
from gandiva.sim.perf import default_perf_model
from gandiva.sim.run import simulate
from gandiva.spec import Trace
from gandiva.traces import BUNDLED, load_trace

POLICIES = ("fifo", "las", "gandiva")
LOADS = {"short": 0.5, "long": 1.25}  # offered load: demand / cluster GPUs
SERVER = 4
QUICK = ("tiresias-60", "pollux-1", "pollux-4", "pollux-realistic-2", "gavel-minimize_makespan",
         "chronus-mix1")


def demand(trace: Trace) -> tuple[float, int]:
    """The GPUs the jobs keep busy on average if each ran alone from its arrival (GPU time
    over the span from the first arrival to the last such finish), and the widest job."""
    perf = default_perf_model()
    gpu_s, end = 0.0, 0.0
    for j in trace.jobs:
        alone = j.duration if j.duration is not None else (
            j.mini_batches / perf.throughput(j.model, trace.reference_gpu, j.num_gpus))
        gpu_s += alone * j.num_gpus
        end = max(end, j.submit_time + alone)
    span = max(end - min(j.submit_time for j in trace.jobs), 1.0)
    return gpu_s / span, max(j.num_gpus for j in trace.jobs)


def cluster_for(trace: Trace, load: float) -> str:
    need, widest = demand(trace)
    gpus = max(need / load, widest, SERVER)
    return f"{math.ceil(gpus / SERVER)}x{SERVER}:{trace.reference_gpu}"


@functools.lru_cache(maxsize=1)  # a trace's two loads run one after the other
def first_jobs(name: str, jobs: int) -> Trace:
    return load_trace(name, jobs=jobs)


def row(task: tuple[str, int, str, dict[str, str]]) -> dict:
    """One trace at one load: each policy's cell, and gandiva's standing."""
    name, jobs, load_name, specs = task
    trace = first_jobs(name, jobs)
    cluster = cluster_for(trace, LOADS[load_name])
    cells = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        s = summarize(simulate(trace, specs[policy], cluster=cluster))
        cells[policy] = {"mean_jct_min": round(s["mean_jct_s"] / 60, 2),
                         "p95_jct_min": round(s["p95_jct_s"] / 60, 2),
                         "first_feedback_min": round(s["mean_first_feedback_s"] / 60, 2),
                         "allocation": round(s["utilization"], 4),
                         "useful": round(s["useful_utilization"], 4),
                         "finished": s["finished"],
                         "wall_s": round(time.perf_counter() - t0, 2)}
    g, las, fifo = cells["gandiva"], cells["las"], cells["fifo"]
    return {"trace": name, "jobs": len(trace.jobs), "load": load_name, "cluster": cluster,
            "cells": cells, "jct_win": g["mean_jct_min"] <= las["mean_jct_min"],
            "gandiva_over_las": round(g["mean_jct_min"] / las["mean_jct_min"], 3)
            if las["mean_jct_min"] else None,
            "feedback_lead": g["first_feedback_min"] <= fifo["first_feedback_min"],
            "allocation_lead": g["allocation"] >= max(las["allocation"], fifo["allocation"]),
            "useful_lead": g["useful"] >= max(las["useful"], fifo["useful"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--traces", default=None)
    ap.add_argument("--gandiva", default="gandiva", help="the gandiva variant to compare, "
                    "e.g. gandiva:slices.order=las")
    ap.add_argument("--workers", type=int, default=1,
                    help="cells run in this many processes (each cell's wall time is its own)")
    args = ap.parse_args()
    specs = {"fifo": "fifo", "las": "las", "gandiva": args.gandiva}
    names = (args.traces.split(",") if args.traces else QUICK if args.quick
             else sorted(BUNDLED))
    jobs = args.jobs or (300 if args.quick else 2000)
    t_all = time.perf_counter()
    tasks = [(name, jobs, load_name, specs) for name in names for load_name in LOADS]
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            rows = pool.map(row, tasks, chunksize=1)
    else:
        rows = [row(task) for task in tasks]
    wall = time.perf_counter() - t_all
    table = Table(title=f"mean JCT min (p95) · first feedback min · allocation (useful); "
                        f"{jobs} jobs per trace; wall {wall:.0f} s")
    for col in ("trace", "load", "cluster", *POLICIES, "gandiva/LAS", "win"):
        table.add_column(col, justify="left" if col in ("trace", "load", "cluster") else "right")
    for r in rows:
        c = r["cells"]
        table.add_row(r["trace"], r["load"], r["cluster"], *(
            f"{c[p]['mean_jct_min']:,.1f} ({c[p]['p95_jct_min']:,.0f}) · "
            f"{c[p]['first_feedback_min']:,.1f} · {c[p]['allocation']:.0%} ({c[p]['useful']:.0%})"
            for p in POLICIES),
            f"{r['gandiva_over_las']:.2f}" if r["gandiva_over_las"] else "-",
            "win" if r["jct_win"] else "loss")
    console = Console(width=220, record=True)
    console.print(table)
    wins = sum(r["jct_win"] for r in rows)
    console.print(f"gandiva <= LAS on mean JCT in {wins} of {len(rows)} cells; first-feedback "
                  f"lead over FIFO in {sum(r['feedback_lead'] for r in rows)} of {len(rows)}; "
                  f"allocation at least both others' in "
                  f"{sum(r['allocation_lead'] for r in rows)} of {len(rows)}; useful "
                  f"utilisation at least both others' in "
                  f"{sum(r['useful_lead'] for r in rows)} of {len(rows)}")
    line = json.dumps({"benchmark": "policy_matrix", "quick": args.quick, "jobs": jobs,
                       "gandiva": args.gandiva, "workers": args.workers,
                       "wall_s": round(wall, 1), "rows": rows})
    print(line)
    variant = "" if args.gandiva == "gandiva" else "-" + args.gandiva.replace(":", "_")
    stem = kept_stem(f"policy-matrix{'-quick' if args.quick else ''}{variant}")
    stem.with_suffix(".txt").write_text(console.export_text(), encoding="utf-8")
    stem.with_suffix(".json").write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
