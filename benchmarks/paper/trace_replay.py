"""Paper §6.2: replay a Philly-derived trace on 100 GPUs (50 P100 + 50 P40), Gandiva vs FIFO.

The paper replayed 8,800 jobs of a Philly trace against YARN's capacity scheduler (our `fifo`
stands in for it): mean JCT 656 vs 832 min, makespan 11,349 vs 13,371 min, 470 migrations.
Which Philly jobs it used is not published. Ours: the first 8,800 jobs of the largest Philly
virtual cluster (vc_6214e9) in the public job list, leaving out jobs longer than the paper's
whole makespan (they alone would set it), with arrivals compressed so that the trace's work
is offered over about the paper's makespan.

Usage: python benchmarks/paper/trace_replay.py [--jobs 8800] [--vc vc_6214e9]
"""

from __future__ import annotations

import argparse
import bisect

from common import PAPER, compare, console, emit, run_policies

from gandiva.sim.engine import SimConfig, SimResult
from gandiva.spec import Trace
from gandiva.traces import load_trace

CLUSTER = "13x4:P100+12x4:P40"  # 52 + 48 GPUs in 4-GPU servers: as near 50/50 as 4 allow
PAPER_MAKESPAN_S = 11_349 * 60
POLICIES = {"fifo": "fifo", "gandiva": PAPER}
# one mechanism off at a time, to explain where the differences from the paper come from
ABLATIONS = {"no packing": f"{PAPER}:-packing",
             "no over-subscription": f"{PAPER}:-placement.oversubscribe",
             "no migration/defrag": f"{PAPER}:-migration:-defrag"}


def workload(jobs: int, vc: str) -> tuple[Trace, dict]:
    philly = load_trace("philly")
    picked = [j for j in philly.jobs if j.user == vc and j.duration <= PAPER_MAKESPAN_S][:jobs]
    t0 = picked[0].submit_time
    span = picked[-1].submit_time - t0
    work = sum(j.duration * j.num_gpus for j in picked)
    # arrivals spread over the time 100 GPUs need for the work at 90% utilisation
    target = work / 100 / 0.9
    scale = span / target
    specs = [j.__class__(j.id, (j.submit_time - t0) / scale, j.num_gpus, j.model, j.user,
                         j.duration) for j in picked]
    info = {"vc": vc, "jobs": len(specs), "gpu_hours": round(work / 3600),
            "arrival_compression": round(scale, 2), "arrival_span_h": round(target / 3600, 1)}
    return Trace(f"philly-{vc}", specs, source=philly.source,
                 reference_gpu=philly.reference_gpu), info


def held_back(result: SimResult, gpus: int) -> dict:
    """Where the job that ends last spent its time: alone, sharing a GPU, suspended; and how
    much of the sharing/suspended time some GPU in the cluster stood free (when migration could
    have moved it)."""
    last = max(result.jobs, key=lambda r: r.finish or 0.0)
    segments = sorted((s, e, shared) for _, j, s, e, shared in result.timeline
                      if j == last.spec.id)
    alone = sum(e - s for s, e, shared in segments if not shared)
    shared = sum(e - s for s, e, sh in segments if sh)
    span = last.finish - last.start
    times = [p[0] for p in result.series]
    hurt = free = 0
    t, k = last.start, 0
    while t < last.finish:  # sample every 10 minutes
        while k + 1 < len(segments) and segments[k][1] <= t:
            k += 1
        s, e, sh = segments[k]
        if not (s <= t < e and not sh):
            hurt += 1
            free += gpus - result.series[bisect.bisect_right(times, t) - 1][1] > 0
        t += 600
    return {"job": last.spec.id, "submit_min": round(last.spec.submit_time / 60),
            "alone_duration_min": round(last.solo_time / 60), "span_min": round(span / 60),
            "alone_min": round(alone / 60), "shared_min": round(shared / 60),
            "suspended_min": round((span - alone - shared) / 60),
            "held_back_with_a_gpu_free": round(free / hurt, 3) if hurt else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8800)
    ap.add_argument("--vc", default="vc_6214e9")
    args = ap.parse_args()
    trace, info = workload(args.jobs, args.vc)
    results: dict = {}
    res = run_policies(trace, POLICIES, CLUSTER, config=SimConfig(timeline=True), keep=results)
    f, g = res["fifo"], res["gandiva"]
    last = held_back(results["gandiva"], 100)
    bound = max(j.submit_time + j.duration for j in trace.jobs) / 60
    abl = run_policies(trace, ABLATIONS, CLUSTER)
    durations = sorted(j.duration for j in trace.jobs)
    median_min = durations[len(durations) // 2] / 60
    multi = sum(1 for j in trace.jobs if j.num_gpus > 1)
    jct = {k: round(v["mean_jct_s"] / 60) for k, v in abl.items()}
    why = {
        "FIFO mean JCT": (
            f"the paper's 8,800 jobs are not published; in our stand-in (median {median_min:.0f} "
            f"min alone, {info['gpu_hours']:,} GPU-h, arrivals compressed "
            f"{info['arrival_compression']}x to offer 90% of 100 GPUs) FIFO queues less"),
        "gandiva mean JCT": (
            f"time-slicing lets short jobs finish past long ones (half of ours run under "
            f"{median_min:.0f} min): without over-subscription {jct['no over-subscription']} min, "
            f"without packing {jct['no packing']} min, without migration "
            f"{jct['no migration/defrag']} min"),
        "JCT gain (FIFO/gandiva)": "see the two JCT rows: our FIFO queues less and our gandiva "
                                   "gains more from time-slicing short jobs",
        "gandiva makespan": (
            f"no schedule can end before the trace's longest job alone ({bound:,.0f} min: "
            f"submit + duration); our FIFO never queues it and ends "
            f"{f['makespan_s'] / 60 - bound:,.0f} min after that bound (the paper's YARN "
            f"queued). Under gandiva the last job "
            f"(#{last['job']}, {last['alone_duration_min']:,} min alone) took "
            f"{last['span_min']:,} min: {last['suspended_min']:,} suspended and "
            f"{last['shared_min']:,} sharing a GPU while the cluster was overloaded (a GPU "
            f"was free in {last['held_back_with_a_gpu_free']:.0%} of that time, so migration "
            f"had nowhere to move it): fair shares for short jobs cost the longest ones"),
        "gandiva migrations": (
            f"only {multi} of our jobs ({100 * multi / len(trace.jobs):.1f}%) use more than one "
            "GPU, and only those can be spread; the paper also migrated for defragmentation of "
            "a busier cluster"),
    }
    rows = [
        ("FIFO mean JCT", 832, f["mean_jct_s"] / 60, "min"),
        ("gandiva mean JCT", 656, g["mean_jct_s"] / 60, "min"),
        ("FIFO makespan", 13_371, f["makespan_s"] / 60, "min"),
        ("gandiva makespan", 11_349, g["makespan_s"] / 60, "min"),
        ("makespan lower bound (longest job alone)", None, bound, "min"),
        ("gandiva migrations", 470, g["migrations"], ""),
        ("JCT gain (FIFO/gandiva)", 832 / 656, f["mean_jct_s"] / g["mean_jct_s"], "x"),
        ("FIFO first 100 mini-batches", None, f["mean_first_feedback_s"] / 60, "min"),
        ("gandiva first 100 mini-batches", None, g["mean_first_feedback_s"] / 60, "min"),
        ("gandiva suspends", None, g["suspends"], ""),
        ("gandiva packs", None, g["packs"], ""),
    ]
    record = compare(f"Gandiva §6.2: {info['jobs']:,} Philly jobs ({args.vc}) on 100 GPUs",
                     rows, why)
    console.print(f"Why gandiva's makespan is longer: {why['gandiva makespan']}")
    emit("paper-trace-replay", {"trace": info, "rows": record, "policies": res,
                                "last_job_under_gandiva": last,
                                "ablations": abl})


if __name__ == "__main__":
    main()
