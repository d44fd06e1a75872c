"""Where a policy matrix cell's JCTs come from: for each policy, the jobs grouped by width and
by run time alone, each group's mean and p95 JCT and where its jobs spent their time
(waiting for their first GPUs, sliced out, running, stalled; ``metrics.by_width``'s split).

This is how a loss in ``policy_matrix.py`` is explained: which jobs lose, and to what.

Usage: python benchmarks/breakdown.py WORKLOAD LOAD [--policies las,gandiva] [--jobs 2000]
  e.g. python benchmarks/breakdown.py alibaba-2023 long
Prints a table per policy and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from policy_matrix import LOADS, cluster_for, first_jobs  # noqa: E402

from gandiva.metrics import WIDTHS, finished, summarize, time_split  # noqa: E402
from gandiva.run import percentile  # noqa: E402
from gandiva.sim.run import simulate  # noqa: E402

HOUR = 3600.0
RUN_TIMES = (("< 10 min", 0, HOUR / 6), ("10 min - 1 h", HOUR / 6, HOUR),
             ("1 - 4 h", HOUR, 4 * HOUR), ("4 - 24 h", 4 * HOUR, 24 * HOUR),
             (">= 24 h", 24 * HOUR, float("inf")))


def groups(result) -> dict[str, list]:
    """The finished jobs by width and by run time alone (a job is in one of each)."""
    done = finished(result)
    out = {}
    for label, low, high in WIDTHS:
        out[f"width {label}"] = [j for j in done if low <= j.spec.num_gpus <= high]
    for label, low, high in RUN_TIMES:
        out[f"alone {label}"] = [j for j in done if low <= j.solo_time < high]
    return {k: v for k, v in out.items() if v}


def split(jobs: list) -> dict[str, float]:
    """A group's JCT, its p95, and where its jobs spent it (``metrics.time_split``): mean
    minutes per job."""
    t = time_split(jobs)
    p95 = percentile([j.finish - j.spec.submit_time for j in jobs], 95)
    return {"jobs": t["jobs"], "mean_jct_min": t["mean_jct_s"] / 60, "p95_jct_min": p95 / 60,
            **{k.removesuffix("_s") + "_min": t[k] / 60
               for k in ("queue_s", "sliced_out_s", "running_s", "stalled_s", "alone_s")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("load", choices=tuple(LOADS))
    ap.add_argument("--policies", default="las,gandiva")
    ap.add_argument("--jobs", type=int, default=2000)
    args = ap.parse_args()
    trace = first_jobs(args.workload, args.jobs)
    cluster = cluster_for(trace, LOADS[args.load])
    console = Console(width=160)
    out = {}
    for policy in args.policies.split(","):
        result = simulate(trace, policy, cluster=cluster)
        s = summarize(result)
        rows = {name: split(jobs) for name, jobs in groups(result).items()}
        out[policy] = {"mean_jct_min": s["mean_jct_s"] / 60, "p95_jct_min": s["p95_jct_s"] / 60,
                       "p99_jct_min": s["p99_jct_s"] / 60, "counts": result.counts,
                       "groups": rows}
        table = Table(title=f"{policy} on {args.workload} ({args.load}, {cluster}): mean JCT "
                            f"{s['mean_jct_s'] / 60:,.1f} min, p95 {s['p95_jct_s'] / 60:,.0f}, "
                            f"p99 {s['p99_jct_s'] / 60:,.0f}")
        cols = ("jobs", "mean_jct_min", "p95_jct_min", "queue_min", "sliced_out_min",
                "running_min", "stalled_min", "alone_min")
        table.add_column("group")
        for c in cols:
            table.add_column(c.removesuffix("_min").replace("_", " "), justify="right")
        for name, r in rows.items():
            table.add_row(name, *(f"{r[c]:,.0f}" if c == "jobs" else f"{r[c]:,.1f}"
                                  for c in cols))
        console.print(table)
    print(json.dumps({"benchmark": "breakdown", "workload": args.workload, "load": args.load,
                      "cluster": cluster, "jobs": args.jobs, "policies": out}))


if __name__ == "__main__":
    main()
