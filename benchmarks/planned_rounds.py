"""What keeps gandiva's time-slicing rounds from being planned ahead (issue 13's speed).

The simulator carries a planned group of servers' rounds out in closed form (rounds.py); every
other round is simulated one suspend, resume and profile sample at a time, which is where the
gandiva policy's simulation time goes. After each round the policy asks of every group of
over-subscribed servers what could change its next rounds other than who runs
(``rounds.unquiet``) and counts the answer per server (``Gandiva.plan_stats``); this prints
those counts as shares of all the servers' checks.

Usage: python benchmarks/planned_rounds.py [--trace philly] [--jobs 8000] [--cluster 120x4]
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

from paper.common import PAPER
from rich.console import Console
from rich.table import Table

from gandiva.policies import make_policy
from gandiva.sim.engine import SimConfig, Simulator
from gandiva.state import Cluster
from gandiva.traces import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="philly")
    ap.add_argument("--jobs", type=int, default=8000)
    ap.add_argument("--cluster", default="120x4")
    args = ap.parse_args()
    trace = load_trace(args.trace, jobs=args.jobs)
    policy = make_policy(PAPER)  # plans need -balance
    t0 = time.perf_counter()
    result = Simulator(Cluster.build(args.cluster), policy, trace.jobs,
                       reference_gpu=trace.reference_gpu,
                       config=SimConfig(timeline=False)).run()
    wall = time.perf_counter() - t0
    checks = sum(policy.plan_stats.values())
    shares = {why: round(n / checks, 4) for why, n in policy.plan_stats.most_common()}
    table = Table(title=f"{args.trace}: {len(trace.jobs):,} jobs on {args.cluster}: "
                        f"{checks:,} server checks after rounds, {wall:.1f} s, "
                        f"{result.events:,} events")
    table.add_column("the group's rounds")
    table.add_column("share of servers", justify="right")
    for why, share in shares.items():
        table.add_row(why, f"{share:.1%}")
    Console().print(table)
    print(json.dumps({"benchmark": "planned_rounds", "trace": args.trace, "jobs": len(trace.jobs),
                      "cluster": args.cluster, "checks": checks, "wall_s": round(wall, 2),
                      "events": result.events, "shares": shares}))


if __name__ == "__main__":
    main()
