"""Shares between teams: each user's GPU time per 1-hour window against its fair share, with
and without the gandiva policy's fair shares (``gandiva:fair``), side by side in one run.

Workloads:
- ``three-teams``: on 16 V100s (4 servers of 4), team ``sweeps`` submits 40 one-GPU jobs of
  3 h, team ``gangs`` four 8-GPU jobs of 8 h, team ``solo`` one one-GPU job of 40 h, all in
  the first minute; one user per team, equal tickets.
- ``philly-week``: the busiest week of the Philly job list (the 7 days from a day's start with
  the most GPU-hours submitted) on 48 servers of 4 (its jobs ask for 173 GPUs on average over
  the week: 192 keeps it contended, as shares need), its virtual clusters as users, grouped into
  teams by ``examples/teams.yaml`` (by size: the biggest VC alone, the next two, the next three, the
  other nine), equal tickets.
- ``alice-bob``: the issue's case: alice submits eight 10-hour jobs, bob one a minute later, on
  one 4-GPU server.

Fair share (``gandiva/fairness.py``): each window's GPU-seconds water-filled by tickets
(team, then user), capped by demand (a job's GPUs from submission to end). Pass: at least 95%
of (user, window) pairs within 10% of their fair share; mean JCT and utilisation within 5% of
the same policy without fairness.

Usage: python benchmarks/fair_share.py [--workloads three-teams,philly-week,alice-bob]
Prints a table and one JSON line, and keeps the run in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from paper.common import kept_stem  # noqa: E402

from gandiva.fairness import report  # noqa: E402
from gandiva.metrics import summarize  # noqa: E402
from gandiva.shares import Shares, read_teams  # noqa: E402
from gandiva.sim.engine import SimConfig  # noqa: E402
from gandiva.sim.run import simulate  # noqa: E402
from gandiva.spec import JobSpec, Trace  # noqa: E402
from gandiva.traces import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("las", "gandiva", "gandiva:fair")
HOUR, DAY = 3600.0, 86400.0
# the Philly list's 15 virtual clusters by jobs, most first, in four teams
PHILLY_TEAMS = read_teams(yaml.safe_load((ROOT / "examples" / "teams.yaml").read_text()))


def three_teams() -> tuple[Trace, str, Shares]:
    jobs = [JobSpec(f"sweep{i}", i, 1, "resnet50", user="sweeps", duration=3 * HOUR)
            for i in range(40)]
    jobs += [JobSpec(f"gang{i}", 40 + i, 8, "resnet50", user="gangs", duration=8 * HOUR)
             for i in range(4)]
    jobs.append(JobSpec("solo", 50, 1, "resnet50", user="solo", duration=40 * HOUR))
    return Trace("three-teams", jobs), "4x4", Shares()


def philly_week() -> tuple[Trace, str, Shares]:
    trace = load_trace("philly")
    by_day: dict[int, float] = {}
    for j in trace.jobs:
        d = int(j.submit_time // DAY)
        by_day[d] = by_day.get(d, 0.0) + j.num_gpus * (j.duration or 0.0)
    days = max(by_day) + 1
    start = max(range(days - 6), key=lambda d: sum(by_day.get(d + k, 0.0) for k in range(7)))
    lo, hi = start * DAY, (start + 7) * DAY
    jobs = [JobSpec(j.id, j.submit_time - lo, j.num_gpus, j.model, user=j.user,
                    duration=j.duration, priority=j.priority)
            for j in trace.jobs if lo <= j.submit_time < hi]
    return (Trace(f"philly-week@{start}d", jobs, reference_gpu=trace.reference_gpu),
            "48x4", PHILLY_TEAMS)


def alice_bob() -> tuple[Trace, str, Shares]:
    jobs = [JobSpec(f"a{i}", 0, 1, "resnet50", user="alice", duration=10 * HOUR)
            for i in range(8)]
    jobs.append(JobSpec("b", 60, 1, "resnet50", user="bob", duration=10 * HOUR))
    return Trace("alice-bob", jobs), "1x4", Shares()


WORKLOADS = {"three-teams": three_teams, "philly-week": philly_week, "alice-bob": alice_bob}


def cell(task: tuple[str, str]) -> dict:
    workload, policy = task
    trace, cluster, shares = WORKLOADS[workload]()
    t0 = time.perf_counter()
    result = simulate(trace, policy, cluster=cluster, shares=shares,
                      config=SimConfig(timeline=True))
    s = summarize(result)
    return {"workload": workload, "trace": trace.name, "jobs": len(trace.jobs),
            "cluster": cluster, "policy": policy, "mean_jct_h": round(s["mean_jct_s"] / HOUR, 3),
            "utilization": round(s["utilization"], 4), "fair": report(result, shares),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    names = args.workloads.split(",")
    for n in names:
        if n not in WORKLOADS:
            ap.error(f"--workloads: unknown {n!r}; known: {', '.join(WORKLOADS)}")
    tasks = [(w, p) for w in names for p in POLICIES]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        cells = list(pool.map(cell, tasks))
    table = Table(title="shares per 1-hour window: (user, window) pairs within 10% of their "
                        "fair share; mean JCT and utilisation against gandiva's")
    for col in ("workload", "policy", "pairs", "within 10%", "worst pair (fair/got GPU-h)",
                "Jain", "max FTF", "mean JCT h", "x gandiva", "util", "teams got/fair"):
        table.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    base = {c["workload"]: c for c in cells if c["policy"] == "gandiva"}
    for c in cells:
        f, b = c["fair"], base[c["workload"]]
        worst = f["worst"]
        table.add_row(
            c["workload"], c["policy"], str(f["pairs"]), f"{f['within']:.1%}",
            "-" if worst is None else
            f"{worst['user']} w{worst['window']}: {worst['fair_gpu_h']:.2f}/"
            f"{worst['received_gpu_h']:.2f}",
            f"{f['jain']:.3f}", f"{f['max_ftf']:.2f}", f"{c['mean_jct_h']:.2f}",
            f"{c['mean_jct_h'] / b['mean_jct_h']:.3f}", f"{c['utilization']:.1%}",
            " ".join(f"{t}:{v['received_gpu_h'] / v['fair_gpu_h']:.2f}"
                     for t, v in sorted(f["teams"].items()) if v["fair_gpu_h"] > 0))
    console = Console(width=220, record=True)
    console.print(table)
    console.print(f"wall {time.perf_counter() - t0:.0f} s")
    line = json.dumps({"benchmark": "fair_share", "cells": cells})
    print(line)
    stem = kept_stem("fair-share")
    stem.with_suffix(".txt").write_text(console.export_text(), encoding="utf-8")
    stem.with_suffix(".json").write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
