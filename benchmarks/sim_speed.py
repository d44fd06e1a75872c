"""Simulator speed on the full Philly job list (82,247 jobs), one run per policy.

Usage: python benchmarks/sim_speed.py [--policies fifo,las,gandiva] [--cluster 120x4] [--jobs N]
                                     [--each-round] [--profile FILE]

``--each-round`` adds a gandiva row with every time-slicing round carried out event by event
(``SimConfig(skip_quiet_rounds=False)``), beside the default that puts off rounds that would
change nothing: the two must give the same results, and the ratio of their wall times,
measured in one run, is what putting them off saves.

The cluster defaults to 120 servers x 4 GPUs = 480 GPUs: the Philly list asks for 374 GPUs on
average over its 110 days, so 480 keeps the cluster busy (about 80%) without an ever-growing
queue. ``--profile FILE`` runs each policy under cProfile (several times slower) and writes its
hot spots, by own time and by cumulative time, to FILE. Prints a table (with each policy's wall
time over fifo's in the same run, where fifo is among the policies) and one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

from rich.console import Console
from rich.table import Table

from gandiva.metrics import summarize
from gandiva.policies import available
from gandiva.sim.engine import SimConfig
from gandiva.sim.run import simulate
from gandiva.traces import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(available()))
    ap.add_argument("--cluster", default="120x4")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--each-round", action="store_true")
    ap.add_argument("--profile", metavar="FILE", default=None)
    args = ap.parse_args()

    t0 = time.perf_counter()
    trace = load_trace("philly", jobs=args.jobs)
    load_s = time.perf_counter() - t0
    rows = {}
    runs = [(p, p, True) for p in args.policies.split(",")]
    if args.each_round:
        runs += [(f"{p} (each round)", p, False) for p in args.policies.split(",")
                 if p.split(":")[0].startswith("gandiva")]
    for name, policy, skip in runs:
        profile = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if profile is not None:
            profile.enable()
        result = simulate(trace, policy, cluster=args.cluster,
                          config=SimConfig(timeline=False, skip_quiet_rounds=skip))
        if profile is not None:
            profile.disable()
        wall = time.perf_counter() - t0
        if profile is not None:
            with open(args.profile, "a") as out:
                out.write(f"# {name}: {len(trace.jobs):,} jobs on {args.cluster}, "
                          f"{wall:.1f} s under cProfile\n")
                stats = pstats.Stats(profile, stream=out)
                stats.sort_stats("tottime").print_stats(25)
                stats.sort_stats("cumtime").print_stats(30)
        s = summarize(result)
        rows[name] = {
            "wall_s": round(wall, 2),
            "events": result.events,
            "events_per_s": round(result.events / wall),
            "finished": s["finished"],
            "mean_jct_h": round(s["mean_jct_s"] / 3600, 2),
            "utilization": round(s["utilization"], 4),
        }
    if "fifo" in rows:  # each policy's wall time over fifo's, measured in this run
        for r in rows.values():
            r["vs_fifo"] = round(r["wall_s"] / rows["fifo"]["wall_s"], 2)
    table = Table(title=f"philly: {len(trace.jobs):,} jobs on {args.cluster} "
                        f"(trace load {load_s:.2f} s)")
    for col in ("policy", "wall s", "x fifo", "events", "events/s", "finished", "mean JCT h",
                "util"):
        table.add_column(col, justify="right")
    for p, r in rows.items():
        ratio = f"{r['vs_fifo']:.1f}" if "vs_fifo" in r else "-"
        table.add_row(p, f"{r['wall_s']:.1f}", ratio, f"{r['events']:,}",
                      f"{r['events_per_s']:,}", f"{r['finished']:,}", f"{r['mean_jct_h']:.1f}",
                      f"{r['utilization']:.1%}")
    Console().print(table)
    print(json.dumps({"benchmark": "sim_speed", "jobs": len(trace.jobs), "cluster": args.cluster,
                      "trace_load_s": round(load_s, 2), "policies": rows}))


if __name__ == "__main__":
    main()
