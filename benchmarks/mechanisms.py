"""The paper's mechanisms on real processes: suspend/resume, migration, time-slicing, packing.

Every number is a ratio against a baseline measured in the same run on the same machine:

- suspend+resume latency against a plain copy of the same state out of and back into the
  device (on CPU slots there is no device: the state stays in host memory, so the copy is a
  host memcpy and suspend/resume costs only the wait for a mini-batch boundary and the
  messages);
- migration (checkpoint at a boundary, stop, start a new process, restore) against saving and
  loading the same checkpoint in-process, beside the paper's Fig 13;
- time-slicing overhead at quanta of 1, 10 (and with --full 60) s: the work lost to switching,
  against the same job running alone;
- packing: two jobs on one device, their normalised throughputs summed (1.0 = no better than
  time-slicing), for compute-bound and for input-bound jobs.

Usage: python benchmarks/mechanisms.py [--sizes 10,100,1000] [--full] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from gandiva.job import checkpoint
from gandiva.node.agent import Agent, Launch

JOB = Path(__file__).resolve().parent / "jobs" / "state_job.py"
FIG13 = {8: 0.22, 98: 0.43, 528: 1.15, 1405: 2.45}  # MB -> s, intra-server (paper Fig 13)
console = Console(width=150)


def launch(*args: str) -> Launch:
    return Launch(["{python}", str(JOB), *args])


def wait(agent: Agent, kind: str, *jobs: str, timeout: float = 300.0) -> None:
    """Until every one of ``jobs`` reported ``kind``."""
    left, deadline = set(jobs), time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        try:
            ev = agent.events.get(timeout=0.1)
        except Exception:
            continue
        if ev.job_id in left and ev.kind == kind:
            left.discard(ev.job_id)
        elif ev.job_id in left and ev.kind == "failed":
            raise RuntimeError(ev.data["reason"])
    if left:
        raise TimeoutError(f"{sorted(left)}: no {kind} in {timeout} s")


def rate(agent: Agent, job: str, seconds: float) -> float:
    """Mini-batches per second over ``seconds``, from the job's own profile reports."""
    steps, t_end = [], time.monotonic() + seconds
    while time.monotonic() < t_end:
        try:
            ev = agent.events.get(timeout=0.1)
        except Exception:
            continue
        if ev.job_id == job and ev.kind == "profile":
            steps.append((ev.time, ev.data.step))
    if len(steps) < 2:
        raise RuntimeError(f"{job}: too few profile reports to measure a rate")
    (t0, s0), (t1, s1) = steps[0], steps[-1]
    return (s1 - s0) / (t1 - t0)


def copy_time(mb: float, device: str) -> float:
    """Out of the device and back in: what suspend/resume must move, as a plain copy."""
    n = int(mb * 2**20 / 4)
    if device == "cuda":
        t = torch.zeros(n, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host = t.to("cpu")
        back = host.to("cuda")
        torch.cuda.synchronize()
        del back
        return time.perf_counter() - t0
    t = torch.zeros(n)
    t0 = time.perf_counter()
    host = t.clone()
    host.clone()
    return time.perf_counter() - t0


def save_load_time(mb: float, directory: Path) -> float:
    state = {"step": 0, "objects": {"model": {"bulk": torch.zeros(int(mb * 2**20 / 4))}}}
    t0 = time.perf_counter()
    checkpoint.save(directory, 1, state)
    checkpoint.latest(directory)
    return time.perf_counter() - t0


def suspend_and_migrate(agent: Agent, sizes: list[float], device: str, tmp: Path) -> list[dict]:
    rows = []
    for mb in sizes:
        job = f"state-{mb:g}"
        agent.start(job, launch("--mb", str(mb)), (0,))
        wait(agent, "started", job)
        time.sleep(1.0)
        sus, res = [], []
        for i in range(5):
            t0 = time.perf_counter()
            agent.suspend(job)
            t1 = time.perf_counter()
            agent.resume(job, ((i + 1) % 2,))
            res.append(time.perf_counter() - t1)
            sus.append(t1 - t0)
            time.sleep(0.3)
        copy = statistics.median(copy_time(mb, device) for _ in range(3))
        while not agent.warm_ready():  # the destination is warmed up first, as in the paper
            time.sleep(0.1)
        t0 = time.perf_counter()
        agent.restart(job, (0,))
        wait(agent, "started", job)
        migrate = time.perf_counter() - t0
        save_load = save_load_time(mb, tmp / job)
        agent.kill(job)
        paper = min(FIG13, key=lambda k: abs(k - mb))
        rows.append({"mb": mb, "suspend_s": statistics.median(sus),
                     "resume_s": statistics.median(res), "copy_s": copy,
                     "suspend_resume_over_copy": (statistics.median(sus)
                                                  + statistics.median(res)) / copy,
                     "migrate_s": migrate, "save_load_s": save_load,
                     "migrate_over_save_load": migrate / save_load,
                     "paper_fig13": f"{FIG13[paper]} s at {paper} MB"})
    return rows


def slicing(agent: Agent, quanta: list[float]) -> list[dict]:
    job = "sliced"
    agent.start(job, launch("--mb", "10"), (0,))
    wait(agent, "started", job)
    time.sleep(1.0)
    alone = rate(agent, job, 5.0)
    rows = []
    for q in quanta:
        cycles = max(2, int(30 / q))
        ran = lost = 0.0
        for _ in range(cycles):
            agent.suspend(job)
            before = agent.jobs[job].replies["suspended:0"].step
            time.sleep(min(q, 2.0))  # the other job's turn (its length does not matter here)
            t0 = time.perf_counter()
            agent.resume(job, (0,))
            time.sleep(q)
            agent.suspend(job)
            wall = time.perf_counter() - t0
            done = agent.jobs[job].replies["suspended:0"].step - before
            ran += wall
            lost += alone * wall - done
            agent.resume(job, (0,))
        rows.append({"quantum_s": q, "cycles": cycles, "overhead": lost / (alone * ran),
                     "switch_cost_s": lost / alone / cycles})
    agent.kill(job)
    return rows


def packing(agent: Agent) -> list[dict]:
    rows = []
    for kind, args in (("compute-bound", ("--matmuls", "20")),
                       ("input-bound", ("--matmuls", "2", "--sleep-ms", "5"))):
        alone = []
        for j in ("a", "b"):
            agent.start(j, launch("--mb", "10", *args), (0,))
            wait(agent, "started", j)
            time.sleep(1.0)
            alone.append(rate(agent, j, 4.0))
            agent.kill(j)
        for j in ("a", "b"):
            agent.start(j, launch("--mb", "10", *args), (0,))  # both on slot 0
        wait(agent, "started", "a", "b")
        time.sleep(1.0)
        together = rate_pair(agent, 6.0)
        for j in ("a", "b"):
            agent.kill(j)
        gain = together["a"] / alone[0] + together["b"] / alone[1]
        rows.append({"jobs": kind, "normalised_throughput_sum": gain})
    return rows


def rate_pair(agent: Agent, seconds: float) -> dict[str, float]:
    seen: dict[str, list] = {"a": [], "b": []}
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        try:
            ev = agent.events.get(timeout=0.1)
        except Exception:
            continue
        if ev.kind == "profile" and ev.job_id in seen:
            seen[ev.job_id].append((ev.time, ev.data.step))
    return {j: (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0]) for j, s in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,100,1000", help="state sizes, MB")
    ap.add_argument("--full", action="store_true", help="also measure the 60 s quantum")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    sizes = [float(x) for x in args.sizes.split(",")]
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no GPU visible")
    devices = ([f"cuda:{i}" for i in range(min(2, torch.cuda.device_count()))]
               if args.device == "cuda" else ["cpu:0", "cpu:1"])
    if len(devices) < 2:
        devices = devices * 2  # one GPU: "moves" land on the same one
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(Path(tmp) / "agent", devices, checkpoint_every_s=1e9)
        try:
            mech = suspend_and_migrate(agent, sizes, args.device, Path(tmp))
            sl = slicing(agent, [1.0, 10.0] + ([60.0] if args.full else []))
            pk = packing(agent)
        finally:
            agent.close()

    t = Table(title=f"suspend/resume and migration on {args.device} (medians of 5)")
    for c in ("state", "suspend", "resume", "plain copy", "(s+r)/copy", "migrate",
              "save+load", "migrate/(save+load)", "paper Fig 13"):
        t.add_column(c, justify="right")
    for r in mech:
        t.add_row(f"{r['mb']:g} MB", f"{r['suspend_s'] * 1e3:.1f} ms",
                  f"{r['resume_s'] * 1e3:.1f} ms", f"{r['copy_s'] * 1e3:.1f} ms",
                  f"{r['suspend_resume_over_copy']:.1f}x", f"{r['migrate_s']:.2f} s",
                  f"{r['save_load_s']:.2f} s", f"{r['migrate_over_save_load']:.1f}x",
                  r["paper_fig13"])
    console.print(t)
    t = Table(title="time-slicing overhead (paper: <=2% at 60 s; negative = within the noise)")
    for c in ("quantum", "cycles", "overhead", "cost per switch"):
        t.add_column(c, justify="right")
    for r in sl:
        t.add_row(f"{r['quantum_s']:g} s", str(r["cycles"]), f"{100 * r['overhead']:.1f}%",
                  f"{r['switch_cost_s'] * 1e3:.0f} ms")
    if not args.full:
        cost = statistics.mean(r["switch_cost_s"] for r in sl)
        t.add_row("60 s (from the cost)", "-", f"{100 * cost / 60:.2f}%", f"{cost * 1e3:.0f} ms")
    console.print(t)
    t = Table(title="packing two jobs on one device (sum of normalised throughputs)")
    t.add_column("jobs")
    t.add_column("packed / time-sliced", justify="right")
    for r in pk:
        t.add_row(r["jobs"], f"{r['normalised_throughput_sum']:.2f}")
    console.print(t)
    print(json.dumps({"benchmark": "mechanisms", "device": args.device, "suspend_migrate": mech,
                      "time_slicing": sl, "packing": pk}))


if __name__ == "__main__":
    main()
