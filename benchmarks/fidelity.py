"""The simulator's numbers on the workloads an independent peer reports: before/after table.

Runs fifo, las and gandiva on
- every bundled Gavel physical-cluster trace, on Gavel's physical cluster (8 V100, 16 P100,
  24 K80 in servers of 4: Narayanan et al., OSDI 2020, §7.1), and
- the §6.2 Philly replay of benchmarks/paper/trace_replay.py (8,800 jobs, 100 GPUs),
and prints mean JCT and makespan per workload and policy, then one JSON line.

Usage: python benchmarks/fidelity.py [--replay-jobs 8800] [--skip-replay] [--policies ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gandiva.metrics import summarize
from gandiva.sim.run import simulate
from gandiva.traces import load_trace

sys.path.insert(0, str(Path(__file__).parent / "paper"))
import trace_replay  # noqa: E402

GAVEL_CLUSTER = "2x4:V100+4x4:P100+6x4:K80"
GAVEL_TRACES = Path(__file__).parents[1] / "gandiva/traces/data/gavel/physical_cluster"


def workloads(replay_jobs: int, skip_replay: bool):
    for path in sorted(GAVEL_TRACES.glob("*.trace")):
        yield f"gavel/{path.stem}", load_trace(str(path)), GAVEL_CLUSTER
    if not skip_replay:
        trace, _ = trace_replay.workload(replay_jobs, "vc_6214e9")
        yield f"philly-replay-{replay_jobs}", trace, trace_replay.CLUSTER


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fifo,las,gandiva")
    ap.add_argument("--replay-jobs", type=int, default=8800)
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    rows: dict[str, dict[str, dict[str, float]]] = {}
    table = Table(title="mean JCT / makespan (minutes) per workload and policy")
    table.add_column("workload")
    table.add_column("jobs", justify="right")
    policies = args.policies.split(",")
    for p in policies:
        table.add_column(f"{p} JCT", justify="right")
        table.add_column(f"{p} makespan", justify="right")
    for name, trace, cluster in workloads(args.replay_jobs, args.skip_replay):
        rows[name] = {}
        cells = [name, str(len(trace.jobs))]
        for policy in policies:
            t0 = time.perf_counter()
            s = summarize(simulate(trace, policy, cluster=cluster))
            rows[name][policy] = {"mean_jct_min": round(s["mean_jct_s"] / 60, 2),
                                  "makespan_min": round(s["makespan_s"] / 60, 2),
                                  "finished": s["finished"],
                                  "wall_s": round(time.perf_counter() - t0, 2)}
            cells += [f"{s['mean_jct_s'] / 60:,.1f}", f"{s['makespan_s'] / 60:,.1f}"]
        table.add_row(*cells)
    Console(width=200).print(table)
    print(json.dumps({"benchmark": "fidelity", "gavel_cluster": GAVEL_CLUSTER,
                      "replay_cluster": trace_replay.CLUSTER, "workloads": rows}))


if __name__ == "__main__":
    main()
