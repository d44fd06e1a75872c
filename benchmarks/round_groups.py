"""How a gandiva run's time-slicing rounds split into independent groups, and how quiet each
group stays between rounds: the measurement behind issue 13's closed-form rounds.

At every round (a Tick) the over-subscribed servers (height > 1) are split into groups: servers
linked by a gang they share decide their rounds together, others apart. A group is *quiet* when
no arrival, departure, failure or priority change touched any of its servers since the last
round: its next round is then a pure function of the last, which is what a closed-form round
would advance without simulating it. Profile samples are not counted as touches: they change
no membership, though packing reads them (so a closed-form round must still model them).

Usage: python benchmarks/round_groups.py [--trace philly] [--jobs 8000] [--cluster 120x4]
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

from rich.console import Console
from rich.table import Table

from gandiva import events as E
from gandiva.policies.gandiva import Gandiva
from gandiva.sim.engine import SimConfig, Simulator
from gandiva.state import Cluster
from gandiva.traces import load_trace


class Watched(Gandiva):
    """The default gandiva policy, counting groups and the events that touch them."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.touched: Counter[int] = Counter()  # server -> events since its last round
        self.rows: list[tuple[int, int, int, float, float]] = []

    def decide(self, event, cluster):
        if self.book is not None and isinstance(event, E.Tick):
            self._count_groups()
        # a departure's servers are known before the decision, an arrival's after it
        if (self.book is not None and isinstance(event, E.Departure | E.PriorityChange)
                and event.job_id in self.book.home):
            self.touched.update(self.book.home[event.job_id])
        yield from super().decide(event, cluster)
        if isinstance(event, E.Arrival) and event.job.id in self.book.home:
            self.touched.update(self.book.home[event.job.id])
        if isinstance(event, E.Failure):
            self.touched[event.node] += 1

    def _count_groups(self) -> None:
        book = self.book
        over = book.crowded()
        parent = {s: s for s in over}

        def root(s: int) -> int:
            while parent[s] != s:
                parent[s] = parent[parent[s]]
                s = parent[s]
            return s

        for s in over:
            for jid in book.members[s]:
                for t in book.home[jid]:
                    if t in parent:
                        parent[root(t)] = root(s)
        size: Counter[int] = Counter(root(s) for s in over)
        hits: Counter[int] = Counter()
        for s in over:
            hits[root(s)] += self.touched[s]
        if over:
            quiet = [g for g in size if hits[g] == 0]
            self.rows.append((len(over), len(size), max(size.values()),
                              len(quiet) / len(size), sum(size[g] for g in quiet) / len(over)))
        self.touched.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="philly")
    ap.add_argument("--jobs", type=int, default=8000)
    ap.add_argument("--cluster", default="120x4")
    args = ap.parse_args()
    trace = load_trace(args.trace, jobs=args.jobs)
    policy = Watched()
    Simulator(Cluster.build(args.cluster), policy, trace.jobs, reference_gpu=trace.reference_gpu,
              config=SimConfig(timeline=False)).run()
    names = ("over-subscribed servers", "groups", "largest group (servers)",
             "quiet groups (share)", "servers in quiet groups (share)")
    cols = list(zip(*policy.rows, strict=True)) if policy.rows else [()] * len(names)
    stats = {n: round(statistics.mean(c), 3) if c else None for n, c in zip(names, cols,
                                                                             strict=True)}
    table = Table(title=f"{args.trace}: {len(trace.jobs):,} jobs on {args.cluster}, "
                        f"{len(policy.rows):,} rounds with time-slicing (means per round)")
    table.add_column("per round")
    table.add_column("mean", justify="right")
    for n, v in stats.items():
        table.add_row(n, "-" if v is None else f"{v:,.3f}")
    Console().print(table)
    print(json.dumps({"benchmark": "round_groups", "trace": args.trace, "jobs": len(trace.jobs),
                      "cluster": args.cluster, "rounds": len(policy.rows), "mean": stats}))


if __name__ == "__main__":
    main()
