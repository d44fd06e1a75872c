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

Tuning and validation (--split): defaults are chosen on the tuning set only and reported on
both. The sets split the workloads by source, so no trace family is in both:
- tuning: Gavel's traces (its physical-cluster traces and its per-VC Philly samples) and
  Tiresias' 60 jobs;
- validation: Pollux's workloads (synthetic and realistic), the Philly job list, Chronus'
  Philly-derived lists, Alibaba's 2023 GPU list, and windows of the Philly and Alibaba lists
  no choice has seen (``philly@30d``: the first jobs submitted from day 30 on).
Each set's summary gives gandiva/LAS's geometric mean, the wins, the worst cell, and the
cells where gandiva wins the mean but loses the p95 (a mean bought with the tail).

Usage: python benchmarks/policy_matrix.py [--quick] [--split tuning|validation|both]
       [--jobs 2000] [--traces a,b,...] [--workers 2]
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


# windows of the long lists that no default was chosen on: (trace, first day)
UNSEEN_WINDOWS = (("philly", 30), ("philly", 60), ("philly", 90), ("alibaba-2023", 60),
                  ("alibaba-2023", 110))
TUNING_FAMILIES = ("gavel", "tiresias")


def family(workload: str) -> str:
    """The source a workload comes from: ``gavel-philly-0e4a51`` -> ``gavel``."""
    return workload.split("@")[0].split("-")[0]


def workloads(split: str) -> list[str]:
    """The workloads of a split: ``tuning``, ``validation`` or ``both``."""
    every = sorted(BUNDLED) + [f"{name}@{day}d" for name, day in UNSEEN_WINDOWS]
    if split == "both":
        return every
    tuning = split == "tuning"
    return [w for w in every if (family(w) in TUNING_FAMILIES) == tuning]


@functools.lru_cache(maxsize=1)  # a trace's two loads run one after the other
def first_jobs(name: str, jobs: int) -> Trace:
    """The first ``jobs`` jobs of a workload: a bundled trace, or ``trace@Nd``, the first
    jobs submitted from day N on."""
    if "@" not in name:
        return load_trace(name, jobs=jobs)
    trace, day = name.split("@")
    return load_trace(trace, jobs=jobs, window=(float(day.removesuffix("d")) * 86400, 1e12))


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
                         "p99_jct_min": round(s["p99_jct_s"] / 60, 2),
                         "max_ftf": round(s["max_ftf_rho"], 2),
                         "first_feedback_min": round(s["mean_first_feedback_s"] / 60, 2),
                         "allocation": round(s["utilization"], 4),
                         "useful": round(s["useful_utilization"], 4),
                         "finished": s["finished"],
                         "wall_s": round(time.perf_counter() - t0, 2)}
    g, las, fifo = cells["gandiva"], cells["las"], cells["fifo"]
    return {"trace": name, "family": family(name), "jobs": len(trace.jobs), "load": load_name,
            "cluster": cluster, "cells": cells, "jct_win": g["mean_jct_min"] <= las["mean_jct_min"],
            "gandiva_over_las": round(g["mean_jct_min"] / las["mean_jct_min"], 3)
            if las["mean_jct_min"] else None,
            "p95_over_las": round(g["p95_jct_min"] / las["p95_jct_min"], 3)
            if las["p95_jct_min"] else None,
            "tail_loss": g["mean_jct_min"] <= las["mean_jct_min"]
            and g["p95_jct_min"] > las["p95_jct_min"],
            "feedback_lead": g["first_feedback_min"] <= fifo["first_feedback_min"],
            "allocation_lead": g["allocation"] >= max(las["allocation"], fifo["allocation"]),
            "useful_lead": g["useful"] >= max(las["useful"], fifo["useful"])}


def standing(rows: list[dict]) -> dict:
    """A set's summary: gandiva/LAS's geometric mean over its cells, the wins, the worst cell,
    and the cells whose mean is won with a p95 lost."""
    ratios = [r["gandiva_over_las"] for r in rows if r["gandiva_over_las"]]
    worst = max(rows, key=lambda r: r["gandiva_over_las"] or 0.0)
    return {"cells": len(rows), "wins": sum(r["jct_win"] for r in rows),
            "geomean_over_las": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
            if ratios else None,
            "worst": f"{worst['trace']} ({worst['load']}) {worst['gandiva_over_las']}",
            "tail_losses": [f"{r['trace']} ({r['load']}) p95 {r['p95_over_las']}"
                            for r in rows if r["tail_loss"]],
            "feedback_leads": sum(r["feedback_lead"] for r in rows),
            "useful_leads": sum(r["useful_lead"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--split", choices=("tuning", "validation", "both"), default="both",
                    help="which workloads: the tuning set, the validation set, or both")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--traces", default=None)
    ap.add_argument("--gandiva", default="gandiva", help="the gandiva variant to compare, "
                    "e.g. gandiva:slices.order=las")
    ap.add_argument("--workers", type=int, default=1,
                    help="cells run in this many processes (each cell's wall time is its own)")
    args = ap.parse_args()
    specs = {"fifo": "fifo", "las": "las", "gandiva": args.gandiva}
    names = (args.traces.split(",") if args.traces else
             [n for n in QUICK if n in workloads(args.split)] if args.quick
             else workloads(args.split))
    jobs = args.jobs or (300 if args.quick else 2000)
    t_all = time.perf_counter()
    tasks = [(name, jobs, load_name, specs) for name in names for load_name in LOADS]
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            rows = pool.map(row, tasks, chunksize=1)
    else:
        rows = [row(task) for task in tasks]
    wall = time.perf_counter() - t_all
    sets = {"tuning": [r for r in rows if r["family"] in TUNING_FAMILIES],
            "validation": [r for r in rows if r["family"] not in TUNING_FAMILIES]}
    # the windows no choice has ever seen, apart (the validation families were in the matrix
    # every default before the split was chosen on)
    unseen = [r for r in sets["validation"] if "@" in r["trace"]]
    console = Console(width=240, record=True)
    summary = {}
    for set_name, set_rows in sets.items():
        if not set_rows:
            continue
        table = Table(title=f"{set_name}: mean JCT min (p95 · p99) · first feedback min · "
                            f"allocation (useful) · max FTF; {jobs} jobs per workload")
        for col in ("workload", "load", "cluster", *POLICIES, "gandiva/LAS", "p95/LAS", "win"):
            table.add_column(col, justify="left" if col in ("workload", "load", "cluster")
                             else "right")
        for r in set_rows:
            c = r["cells"]
            table.add_row(r["trace"], r["load"], r["cluster"], *(
                f"{c[p]['mean_jct_min']:,.1f} ({c[p]['p95_jct_min']:,.0f} · "
                f"{c[p]['p99_jct_min']:,.0f}) · {c[p]['first_feedback_min']:,.1f} · "
                f"{c[p]['allocation']:.0%} ({c[p]['useful']:.0%}) · {c[p]['max_ftf']:,.1f}"
                for p in POLICIES),
                f"{r['gandiva_over_las']:.2f}" if r["gandiva_over_las"] else "-",
                f"{r['p95_over_las']:.2f}" if r["p95_over_las"] else "-",
                "win" if r["jct_win"] else "loss")
        console.print(table)
        s = summary[set_name] = standing(set_rows)
        console.print(
            f"{set_name}: gandiva <= LAS on mean JCT in {s['wins']} of {s['cells']} cells, "
            f"geometric mean of gandiva/LAS {s['geomean_over_las']}, worst {s['worst']}; "
            f"mean won with p95 lost in {len(s['tail_losses'])}"
            + (f" ({'; '.join(s['tail_losses'])})" if s["tail_losses"] else "")
            + f"; first-feedback lead over FIFO in {s['feedback_leads']}; useful utilisation "
            f"at least both others' in {s['useful_leads']}")
    if unseen:
        s = summary["unseen windows"] = standing(unseen)
        console.print(f"of which windows no choice has seen: gandiva <= LAS on mean JCT in "
                      f"{s['wins']} of {s['cells']}, geometric mean {s['geomean_over_las']}, "
                      f"worst {s['worst']}; mean won with p95 lost in {len(s['tail_losses'])}")
    console.print(f"wall {wall:.0f} s")
    line = json.dumps({"benchmark": "policy_matrix", "quick": args.quick, "split": args.split,
                       "jobs": jobs, "gandiva": args.gandiva, "workers": args.workers,
                       "wall_s": round(wall, 1), "summary": summary, "rows": rows})
    print(line)
    variant = ("" if args.gandiva == "gandiva"  # (no dots: the stem takes a suffix)
               else "-" + args.gandiva.replace(":", "_").replace(".", "_"))
    split = "" if args.split == "both" else "-" + args.split
    stem = kept_stem(f"policy-matrix{'-quick' if args.quick else ''}{split}{variant}")
    stem.with_suffix(".txt").write_text(console.export_text(), encoding="utf-8")
    stem.with_suffix(".json").write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
