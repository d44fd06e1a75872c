"""What a move to another GPU costs a job: by a warm restart (the default: checkpoint at the
step it is suspended at, exit, a fork of the zygote on the new GPU, restore) against in place
(a job whose loop declared ``steps(in_place=True)``), for 10 MB, 100 MB and 1 GB of state,
measured in one run on the same agent.

Each move is timed from the agent's ``resume`` on the other GPU to the job going on there: the
``started`` report of its new process (restart), or its ``resumed`` acknowledgement (in
place). Both begin from a job suspended by the library, whose state is in host memory.

The agent's GPUs are CPU-backed here (``Agent(cpu_backed=True)``): every GPU rule of the
agent holds (visibility, restart on a move), but no byte crosses a PCIe link, so the in-place
column is the protocol alone. What an in-place move adds on a GPU is a copy of the state to
the new device: the "state copy" column is a copy of as many bytes in host memory, measured
in the same run (a PCIe link moves 12-25 GB/s, the same order). A restart on a GPU also makes
a CUDA context (~0.3 s).

Usage: python benchmarks/move_cost.py [--sizes 10,100,1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gandiva.node.agent import Agent, Launch

JOB = Path(__file__).resolve().parent / "jobs" / "state_job.py"


def wait(agent: Agent, kind: str, job_id: str, timeout: float = 300.0) -> float:
    """The time the next ``kind`` event of ``job_id`` was taken off the queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = agent.events.get(timeout=timeout)
        if ev.job_id == job_id and ev.kind == kind:
            return time.perf_counter()
        if ev.job_id == job_id and ev.kind == "failed":
            raise RuntimeError(ev.data["reason"])
    raise TimeoutError(f"no {kind} for {job_id}")


def moves(agent: Agent, job_id: str, mb: float, in_place: bool, repeats: int) -> list[float]:
    extra = ["--in-place"] if in_place else []
    agent.start(job_id, Launch([sys.executable, str(JOB), "--mb", str(mb), "--matmuls", "2",
                                *extra]), (0,))
    wait(agent, "started", job_id)
    here, there = (0,), (1,)
    if in_place:  # its first process sees its own GPU only: one restart, then it sees both
        agent.suspend(job_id)
        agent.resume(job_id, there)
        wait(agent, "started", job_id)
        here, there = there, here
    took = []
    for _ in range(repeats):
        time.sleep(0.3)
        agent.suspend(job_id)
        t0 = time.perf_counter()
        agent.resume(job_id, there)
        t1 = time.perf_counter() if in_place else wait(agent, "started", job_id)
        took.append(t1 - t0)
        here, there = there, here
    agent.kill(job_id)
    return took


def copy_s(mb: float, repeats: int) -> float:
    """A copy of ``mb`` megabytes in host memory: the median of ``repeats``."""
    import torch

    src = torch.ones(int(mb * 2**20 / 4))
    dst = torch.empty_like(src)
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,1000", help="state sizes in MB")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(Path(tmp), ["cuda:0", "cuda:1"], checkpoint_every_s=1e9,
                      cpu_backed=True)
        try:
            while not agent.warm_ready():
                time.sleep(0.1)
            for mb in (float(s) for s in args.sizes.split(",")):
                restart = moves(agent, f"r{mb:g}", mb, False, args.repeats)
                in_place = moves(agent, f"i{mb:g}", mb, True, args.repeats)
                rows.append({"state_mb": mb, "restart_s": statistics.median(restart),
                             "in_place_s": statistics.median(in_place),
                             "state_copy_s": copy_s(mb, args.repeats)})
        finally:
            agent.close()
    table = Table(title="a move to another GPU (CPU-backed GPUs), median of "
                        f"{args.repeats}")
    for col in ("state", "warm restart (s)", "in place (s)", "state copy (s)",
                "restart / (in place + copy)"):
        table.add_column(col, justify="right")
    for r in rows:
        in_place = r["in_place_s"] + r["state_copy_s"]
        table.add_row(f"{r['state_mb']:g} MB", f"{r['restart_s']:.3f}",
                      f"{r['in_place_s']:.4f}", f"{r['state_copy_s']:.4f}",
                      f"{r['restart_s'] / in_place:.0f}x")
    Console().print(table)
    print(json.dumps({"benchmark": "move_cost", "rows": rows}))


if __name__ == "__main__":
    main()
