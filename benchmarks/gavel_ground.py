"""Gavel's own ground: the job streams of Gavel's continuous-trace experiments, under our LAS
and gandiva, beside the results Gavel published for its LAS and its gandiva.

The workload is Gavel's generator's (Narayanan et al., OSDI 2020, §7; the generator is
``generate_job`` in ``scheduler/utils.py`` and the arrivals ``simulate`` in
``scheduler/scheduler.py`` of stanford-futuredata/gavel, c4fa400). ``gavel_jobs`` draws the
same random streams in the same order, so a seed here is Gavel's seed, job for job:
- GPUs: 1, 2, 4 or 8 with probabilities 70/10/15/5% (drawn for every job, kept only in a
  multi-GPU trace);
- run time on dedicated V100s at that width: 10^x minutes, x ~ U(1.5, 3) with probability
  0.8, else x ~ U(3, 4);
- job type: uniform over Gavel's 26 templates, redrawn for a multi-GPU job until it is one of
  the 19 that run distributed;
- Poisson arrivals at the given rate (jobs per hour), the first at 0.
Measured as Gavel measures: the mean JCT of jobs 4000-4999, the ones before warming the
cluster up; the jobs after them keep the load on while the window's jobs finish.

Clusters: Gavel's (36 V100 + 36 P100 + 36 K80, one GPU per server), where its published
numbers were measured (``benchmarks/gavel/published.json``: seed 0, the outputs committed in
its notebooks), and 108 V100s in 4-GPU servers, the homogeneous case the paper's gandiva was
built for. Gavel's simulator has no cost to preempt or resume a job; ours charges a suspend,
a resume and the checkpoint clock, so our numbers carry a cost Gavel's do not.

Usage: python benchmarks/gavel_ground.py [--rates single:4.0,4.8 multi:2.0] [--jobs 6000]
       [--clusters v100,gavel] [--workers 2]
Prints a table and one JSON line, and keeps the run in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from paper.common import kept_stem  # noqa: E402

from gandiva.sim.run import simulate  # noqa: E402
from gandiva.spec import JobSpec, Trace  # noqa: E402

# Gavel's job templates in the order of its JobTable; the first 19 run distributed
TEMPLATES = (
    [f"ResNet-18 (batch size {b})" for b in (16, 32, 64, 128, 256)]
    + [f"ResNet-50 (batch size {b})" for b in (16, 32, 64, 128)]
    + [f"Transformer (batch size {b})" for b in (16, 32, 64, 128, 256)]
    + [f"LM (batch size {b})" for b in (5, 10, 20, 40, 80)]
    + [f"Recommendation (batch size {b})" for b in (512, 1024, 2048, 4096, 8192)]
    + ["A3C", "CycleGAN"]
)
DISTRIBUTED = 19
WINDOW = (4000, 5000)  # the jobs measured, as in every Gavel continuous-trace figure
CLUSTERS = {"gavel": "36x1:V100+36x1:P100+36x1:K80", "v100": "27x4:V100"}
# jobs per hour: Gavel's rates where its gandiva and LAS part (its Figures 8 and 9), then on
# to where 108 V100s saturate (Gavel's cluster, a third of it K80s, saturates sooner)
RATES = {"single": (2.0, 4.0, 4.8, 5.6, 6.0, 6.5, 7.0),
         "multi": (1.0, 2.0, 2.4, 2.6, 2.8, 3.0, 3.2)}
POLICIES = ("las", "gandiva")
PUBLISHED = json.loads((Path(__file__).parent / "gavel" / "published.json").read_text())


def gavel_jobs(rate_per_hour: float, jobs: int, multi_gpu: bool, seed: int = 0) -> Trace:
    """The first ``jobs`` jobs of Gavel's continuous trace at this rate and seed."""
    job_rng, gap_rng = random.Random(seed + 2), random.Random(seed + 3)
    out, t = [], 0.0
    for i in range(jobs):
        u = job_rng.uniform(0, 1)
        width = 8 if u >= 0.95 else 4 if u >= 0.8 else 2 if u >= 0.7 else 1
        long_job = job_rng.random() >= 0.8
        minutes = 10 ** (job_rng.uniform(3, 4) if long_job else job_rng.uniform(1.5, 3))
        if not multi_gpu:
            width = 1
        while True:
            k = job_rng.choice(range(len(TEMPLATES)))  # Gavel's choice(JobTable), as an index
            if width == 1 or k < DISTRIBUTED:
                break
        out.append(JobSpec(str(i), t, width, TEMPLATES[k], duration=60.0 * minutes))
        t += -math.log(1.0 - gap_rng.random()) * 3600.0 / rate_per_hour
    kind = "multi" if multi_gpu else "single"
    return Trace(name=f"gavel-{kind}@{rate_per_hour:g}", jobs=out, reference_gpu="V100",
                 source=f"Gavel's generator, {kind}-GPU jobs, {rate_per_hour:g} jobs/h, "
                        f"seed {seed}")


def window_jct_h(result) -> tuple[float, int]:
    """Mean JCT in hours of the window's jobs, and how many of them did not finish."""
    lo, hi = WINDOW
    jcts, missing = [], 0
    for j in result.jobs:
        if lo <= int(j.spec.id) < hi:
            if j.finish is None:
                missing += 1
            else:
                jcts.append(j.finish - j.submit)
    return (sum(jcts) / len(jcts) / 3600.0 if jcts else math.nan), missing


def cell(task: tuple[str, float, str, str, int]) -> dict:
    kind, rate, cluster, policy, jobs = task
    t0 = time.perf_counter()
    result = simulate(gavel_jobs(rate, jobs, kind == "multi"), policy,
                      cluster=CLUSTERS[cluster])
    jct, missing = window_jct_h(result)
    return {"kind": kind, "rate": rate, "cluster": cluster, "policy": policy,
            "mean_jct_h": round(jct, 2), "unfinished": missing,
            "wall_s": round(time.perf_counter() - t0, 1)}


def published(kind: str, rate: float, policy: str) -> float | None:
    return PUBLISHED[f"{kind}_gpu"][policy].get(f"{rate:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", nargs="*", default=None,
                    help="e.g. single:4.0,4.8 multi:2.0 (default: Gavel's rates where "
                         "policies part)")
    ap.add_argument("--jobs", type=int, default=6000, help="jobs generated per run")
    ap.add_argument("--clusters", default="v100,gavel")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    rates = ({k: tuple(map(float, v.split(","))) for k, v in
              (r.split(":") for r in args.rates)} if args.rates else RATES)
    clusters = args.clusters.split(",")
    for c in clusters:
        if c not in CLUSTERS:
            ap.error(f"--clusters: unknown {c!r}; known: {', '.join(CLUSTERS)}")
    tasks = [(kind, rate, c, p, args.jobs) for kind, rs in rates.items() for rate in rs
             for c in clusters for p in POLICIES]
    t0 = time.perf_counter()
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            cells = list(pool.map(cell, tasks))
    else:
        cells = [cell(t) for t in tasks]
    wall = time.perf_counter() - t0
    ours = {(c["kind"], c["rate"], c["cluster"], c["policy"]): c for c in cells}
    table = Table(title=f"mean JCT (h) of jobs {WINDOW[0]}-{WINDOW[1] - 1}, seed 0, "
                        f"{args.jobs} jobs per run: Gavel's published runs, and ours on "
                        + ", ".join(f"{c} ({CLUSTERS[c]})" for c in clusters))
    table.add_column("jobs")
    table.add_column("rate/h", justify="right")
    for col in ("Gavel: LAS", "gandiva", "Gavel w/ SS"):
        table.add_column(col, justify="right")
    for c in clusters:
        for col in (f"{c}: our las", "our gandiva", "gandiva/las"):
            table.add_column(col, justify="right")
        if c == "gavel":
            table.add_column("ours/Gavel's gandiva", justify="right")
    rows = []
    for kind, rs in rates.items():
        for rate in rs:
            theirs = {p: published(kind, rate, p) for p in
                      ("max_min_fairness", "gandiva", "max_min_fairness_packed")}
            cols = ["-" if v is None else f"{v:.1f}" for v in theirs.values()]
            row = {"kind": kind, "rate": rate, "published": theirs}
            for c in clusters:
                las, ours_g = (ours[kind, rate, c, p]["mean_jct_h"] for p in POLICIES)
                row[c] = {"las": las, "gandiva": ours_g, "gandiva_over_las": round(ours_g / las, 3)}
                cols += [f"{las:.1f}", f"{ours_g:.1f}", f"{ours_g / las:.2f}"]
                if c == "gavel":
                    ratio = ours_g / theirs["gandiva"] if theirs["gandiva"] else None
                    row[c]["over_gavels_gandiva"] = round(ratio, 3) if ratio else None
                    cols.append("-" if ratio is None else f"{ratio:.2f}")
            table.add_row(kind, f"{rate:g}", *cols)
            rows.append(row)
    console = Console(width=200, record=True)
    console.print(table)
    unfinished = sum(c["unfinished"] for c in cells)
    console.print(f"window jobs unfinished: {unfinished}; wall {wall:.0f} s")
    line = json.dumps({"benchmark": "gavel_ground", "jobs": args.jobs, "window": WINDOW,
                       "clusters": {c: CLUSTERS[c] for c in clusters}, "wall_s": round(wall, 1),
                       "rows": rows, "cells": cells})
    print(line)
    stem = kept_stem("gavel-ground")
    stem.with_suffix(".txt").write_text(console.export_text(), encoding="utf-8")
    stem.with_suffix(".json").write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
