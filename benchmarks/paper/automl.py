"""Paper §6.3: hyper-parameter search (AutoML) on one 4-GPU server, Gandiva vs FIFO.

A search starts N configurations of one model at once. Each configuration's accuracy follows
a learning curve acc(b) = A * (1 - exp(-b / TAU)) over mini-batches b, with its final
accuracy A drawn at random; the search wants the first configuration to reach TARGET. FIFO runs
the configurations four at a time, each to its full budget. With Gandiva, the search gives
the top-M configurations (by the final accuracy extrapolated from their curves so far) a higher
priority, so they run exclusively, while the rest are time-sliced on the remaining GPUs; it
re-ranks every 1,000 mini-batches. Paper (Table 3): 5.5x to 7x faster to the target on 4 GPUs.

Usage: python benchmarks/paper/automl.py [--configs 50] [--seeds 5] [--top 2]
"""

from __future__ import annotations

import argparse
import math
import random

from common import compare, emit

from gandiva import events as E
from gandiva.policies import make_policy
from gandiva.sim.engine import SimConfig, Simulator
from gandiva.spec import JobSpec
from gandiva.state import Cluster

TAU = 1500.0  # mini-batches for a curve to cover 63% of its way
TARGET = 0.9
BUDGET = 20_000  # mini-batches each configuration is trained for if nobody stops it
RERANK_EVERY = 1000  # the paper's re-prioritisation period, in mini-batches
MODEL = "resnet50"


class Search:
    """The AutoML controller: watches progress reports, re-prioritises, notes the target."""

    def __init__(self, finals: dict[str, float], top: int, reprioritise: bool) -> None:
        self.finals, self.top, self.reprioritise = finals, top, reprioritise
        self.progress: dict[str, int] = {}
        self.next_rerank: dict[str, int] = {}
        self.reached: float | None = None
        self.priority: dict[str, int] = {}

    def needed(self, job: str) -> float:
        a = self.finals[job]
        return -TAU * math.log(1 - TARGET / a) if a > TARGET else math.inf

    def __call__(self, sample: E.ProfileSample, cluster: Cluster) -> list[tuple[str, int]]:
        self.progress[sample.job_id] = sample.mini_batches_done
        if self.reached is None and sample.mini_batches_done >= self.needed(sample.job_id):
            self.reached = sample.time
        if not self.reprioritise:
            return []
        due = self.next_rerank.get(sample.job_id, RERANK_EVERY)
        if sample.mini_batches_done < due:
            return []
        self.next_rerank[sample.job_id] = due + RERANK_EVERY
        return self.rerank()

    def rerank(self) -> list[tuple[str, int]]:
        # extrapolate each curve to its final accuracy (what curve-fitting searches do)
        seen = {j: b for j, b in self.progress.items() if b >= RERANK_EVERY}
        ranked = sorted(seen, key=lambda j: -self.finals[j])
        want = {j: (1 if i < self.top else 0) for i, j in enumerate(ranked)}
        changes = [(j, p) for j, p in want.items() if self.priority.get(j, 0) != p]
        self.priority.update(want)
        return changes


def finals_for(configs: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    finals = {f"c{i}": rng.uniform(0.4, 0.95) for i in range(configs)}
    if max(finals.values()) <= TARGET:  # make sure the search has something to find
        finals[f"c{configs - 1}"] = 0.95
    return finals


def run(policy: str, configs: int, seed: int, top: int) -> float:
    finals = finals_for(configs, seed)
    jobs = [JobSpec(j, 0.0, 1, MODEL, mini_batches=BUDGET) for j in finals]
    search = Search(finals, top, reprioritise=policy.startswith("gandiva"))
    sim = Simulator(Cluster.build("1x4:P40"), make_policy(policy, seed), jobs,
                    reference_gpu="P40",
                    config=SimConfig(seed=seed, report_every=100, controller=search,
                                     timeline=False))
    sim.run()
    assert search.reached is not None
    return search.reached


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--top", type=int, default=2)
    args = ap.parse_args()
    # all configurations share one server: let it hold them all (the search owns the server)
    gandiva = f"gandiva:max_height={args.configs}:-pack"
    per_seed = []
    for seed in range(args.seeds):
        fifo_t = run("fifo", args.configs, seed, args.top)
        gandiva_t = run(gandiva, args.configs, seed, args.top)
        finals = list(finals_for(args.configs, seed).values())
        first_good = next(i for i, a in enumerate(finals) if a > TARGET)
        per_seed.append({"seed": seed, "fifo_s": round(fifo_t), "gandiva_s": round(gandiva_t),
                         "speedup": round(fifo_t / gandiva_t, 2), "first_good": first_good})
    speedups = sorted(r["speedup"] for r in per_seed)
    median = speedups[len(speedups) // 2]
    late = [r["speedup"] for r in per_seed if r["first_good"] >= 8]
    early = [r for r in per_seed if r["first_good"] < 4]
    why_range = (
        f"FIFO's time is set by where the first good configuration sits in its queue: in "
        f"{len(early)} of {len(per_seed)} seeds it is among the first 4, which FIFO starts at "
        f"once, and gandiva's exploration of all {args.configs} costs more than it saves; "
        f"when it sits 8th or later the median speed-up is "
        f"{sorted(late)[len(late) // 2] if late else float('nan'):.1f}x")
    why = {"median speed-up to target": why_range, "min speed-up": why_range,
           "max speed-up": (f"grows with each configuration's budget ({BUDGET:,} mini-batches "
                            "here; the paper does not give its own) and the queue position")}
    rows = [("median speed-up to target", 6.25, median, "x"),
            ("min speed-up", 5.5, speedups[0], "x"), ("max speed-up", 7.0, speedups[-1], "x")]
    record = compare(f"Gandiva §6.3: AutoML, {args.configs} configurations on 4 GPUs, top "
                     f"{args.top} prioritised", rows, why)
    for r in per_seed:
        print(f"  seed {r['seed']}: first good configuration is #{r['first_good']} in FIFO's "
              f"queue; FIFO {r['fifo_s']:,} s, gandiva {r['gandiva_s']:,} s, {r['speedup']}x")
    emit("paper-automl", {"rows": record, "per_seed": per_seed})


if __name__ == "__main__":
    main()
