"""Paper §6.1: 180 GPUs, 1,000 jobs of the Table-1 models over 2 hours.

45 servers x 4 GPUs, half P100 half P40. Jobs are low / mid / high GPU utilisation with
p = 0.3 / 0.25 / 0.45; ResNet-50 and ResNeXt-50 take 2 or 4 GPUs, the rest 1; each runs 30-45
minutes alone. Gandiva (time-slicing and packing, no migration) against FIFO bin-packing
without over-subscription. Paper: GPU utilisation 62.8% vs 50.1%, time to the first 100
mini-batches 498 s vs 2,203 s.

Usage: python benchmarks/paper/cluster180.py [--seed 0] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import random

from common import PAPER, compare, emit, run_policies

from gandiva.spec import JobSpec, Trace

LOW, MID, HIGH = ["vae", "superresolution"], ["rhn", "scrnn", "milstm"], [
    "lstm", "resnet50", "resnext50"]
CLUSTER = "23x4:P100+22x4:P40"  # 92 + 88 GPUs: 45 servers, as near half and half as 4 allow
POLICIES = {"fifo": "fifo", "gandiva": f"{PAPER}:-migration:-defrag"}


def workload(jobs: int, seed: int) -> Trace:
    rng = random.Random(seed)
    specs = []
    for i in range(jobs):
        model = rng.choice(rng.choices([LOW, MID, HIGH], [0.3, 0.25, 0.45])[0])
        gpus = rng.choice([2, 4]) if model in ("resnet50", "resnext50") else 1
        specs.append(JobSpec(f"j{i}", rng.uniform(0, 7200), gpus, model,
                             duration=rng.uniform(30 * 60, 45 * 60)))
    specs.sort(key=lambda j: j.submit_time)
    # Table 1's speeds were measured on P40s: durations "alone" are on a P40
    return Trace("paper-180", specs, source="Gandiva §6.1 workload", reference_gpu="P40")


def offered_hours(trace: Trace, gpus: int) -> float:
    """Hours the whole cluster needs for the trace's work, at solo speed."""
    return sum(j.duration * j.num_gpus for j in trace.jobs) / 3600 / gpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    trace = workload(args.jobs, args.seed)
    res = run_policies(trace, POLICIES, CLUSTER)
    f, g = res["fifo"], res["gandiva"]
    load = offered_hours(trace, 180)
    # the paper's FIFO waited far less than ours: find the load at which our FIFO matches it
    sweep = {}
    for n in (250, 400, 550, 700):
        light = workload(n, args.seed)
        r = run_policies(light, POLICIES, CLUSTER)
        sweep[n] = {"offered_cluster_hours": round(offered_hours(light, 180), 2),
                    "fifo_first_feedback_s": round(r["fifo"]["mean_first_feedback_s"]),
                    "gandiva_first_feedback_s": round(r["gandiva"]["mean_first_feedback_s"]),
                    "fifo_sm_util": round(r["fifo"]["sm_utilization"], 3),
                    "gandiva_sm_util": round(r["gandiva"]["sm_utilization"], 3)}
    near = min(sweep, key=lambda n: abs(sweep[n]["fifo_first_feedback_s"] - 2203))
    light = sweep[near]
    heavy = (f"the workload as described offers {load:.1f} hours of the whole cluster's work "
             f"in 2 hours of arrivals, so FIFO queues; with {near} jobs "
             f"({light['offered_cluster_hours']} h) our FIFO waits "
             f"{light['fifo_first_feedback_s']} s, near the paper's 2,203 s")
    why = {
        "FIFO first 100 mini-batches": heavy,
        "gandiva first 100 mini-batches": (
            f"time-slicing starts a job within one 60 s quantum while the height cap allows it "
            f"({light['gandiva_first_feedback_s']} s at {near} jobs); the simulator models no "
            "process start-up or data loading, and the paper does not break its 498 s down"),
        "gandiva GPU utilisation": (
            f"our cluster stays saturated for {load:.1f} h, so packing turns into utilisation; at "
            f"{near} jobs ours is {100 * light['gandiva_sm_util']:.1f}% vs FIFO "
            f"{100 * light['fifo_sm_util']:.1f}%"),
    }
    rows = [
        ("FIFO GPU utilisation", 50.1, 100 * f["sm_utilization"], "%"),
        ("gandiva GPU utilisation", 62.8, 100 * g["sm_utilization"], "%"),
        ("FIFO first 100 mini-batches", 2203, f["mean_first_feedback_s"], "s"),
        ("gandiva first 100 mini-batches", 498, g["mean_first_feedback_s"], "s"),
        ("FIFO GPUs allocated", None, 100 * f["utilization"], "%"),
        ("gandiva GPUs allocated", None, 100 * g["utilization"], "%"),
        ("FIFO mean JCT", None, f["mean_jct_s"] / 60, "min"),
        ("gandiva mean JCT", None, g["mean_jct_s"] / 60, "min"),
        ("gandiva packs", None, g["packs"], ""),
        ("gandiva suspends", None, g["suspends"], ""),
    ]
    record = compare(f"Gandiva §6.1: {args.jobs} jobs on 180 GPUs (seed {args.seed}); GPU "
                     "utilisation = useful GPU time x the model's utilisation", rows, why)
    emit("paper-cluster180", {"seed": args.seed, "offered_cluster_hours": round(load, 2),
                              "rows": record, "policies": res, "load_sweep": sweep})


if __name__ == "__main__":
    main()
