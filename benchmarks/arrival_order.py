"""A matrix cell lost to LAS, run again with two arrivals swapped: is the loss the policy's, or
the order in which the jobs happened to come?

Neither LAS nor gandiva knows how long a job will run. On pollux-realistic-8 at the long-queue
load (9x4:T4) three 12-hour imagenet gangs of 16, 8 and 32 GPUs arrive in that order. LAS
serves its last level (10 GPU-hours on) first come first served, so the widest gang, the one
with the most work, runs last because it came last. Gandiva's levels go on past 10 GPU-hours
(``level_step``), so the widest gang, younger than the others, runs before them until its
service catches up. Swapping the arrivals of the first and the widest gang tells the two
apart: if LAS's lead came from its rule, it keeps it; if it came from the arrival order, it
turns.

Usage: python benchmarks/arrival_order.py [--trace pollux-realistic-8] [--load long]
       [--jobs 2000] [--min-gpus 8]
Prints a table and one JSON line, and keeps the run in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import dataclasses

from paper.common import console, emit
from policy_matrix import LOADS, cluster_for, first_jobs
from rich.table import Table

from gandiva.metrics import summarize
from gandiva.sim.run import simulate
from gandiva.spec import Trace

POLICIES = ("las", "gandiva")


def swapped(trace: Trace, min_gpus: int) -> tuple[Trace, str, str]:
    """The trace with the widest job's arrival swapped with the first arrival of a job at
    least ``min_gpus`` wide; and the two jobs' ids."""
    wide = sorted((j for j in trace.jobs if j.num_gpus >= min_gpus),
                  key=lambda j: (j.submit_time, j.id))
    if len(wide) < 2:
        raise SystemExit(f"--min-gpus {min_gpus}: the trace has fewer than two jobs that wide")
    first, widest = wide[0], max(wide, key=lambda j: (j.num_gpus, j.submit_time))
    if first is widest:
        raise SystemExit("the widest job is the first wide one already: nothing to swap")
    at = {first.id: widest.submit_time, widest.id: first.submit_time}
    jobs = sorted((dataclasses.replace(j, submit_time=at.get(j.id, j.submit_time))
                   for j in trace.jobs), key=lambda j: (j.submit_time, j.id))
    return dataclasses.replace(trace, jobs=jobs), first.id, widest.id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="pollux-realistic-8")
    ap.add_argument("--load", default="long", choices=sorted(LOADS))
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--min-gpus", type=int, default=8)
    args = ap.parse_args()
    trace = first_jobs(args.trace, args.jobs)
    cluster = cluster_for(trace, LOADS[args.load])
    other, first, widest = swapped(trace, args.min_gpus)
    table = Table(title=f"{args.trace} ({args.load} queue, {cluster}): mean JCT, min")
    for col in ("arrivals", *POLICIES, "gandiva/LAS"):
        table.add_column(col, justify="left" if col == "arrivals" else "right")
    rows = []
    for label, t in (("as recorded", trace),
                     (f"{first} and {widest} swapped", other)):
        jct = {p: summarize(simulate(t, p, cluster=cluster))["mean_jct_s"] / 60
               for p in POLICIES}
        ratio = jct["gandiva"] / jct["las"]
        table.add_row(label, *(f"{jct[p]:,.2f}" for p in POLICIES), f"{ratio:.3f}")
        rows.append({"arrivals": label, **{p: round(jct[p], 2) for p in POLICIES},
                     "gandiva_over_las": round(ratio, 4)})
    console.print(table)
    emit("arrival-order", {"trace": args.trace, "load": args.load, "cluster": cluster,
                           "jobs": len(trace.jobs), "swapped": [first, widest], "rows": rows})


if __name__ == "__main__":
    main()
