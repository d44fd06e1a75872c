"""What a mini-batch boundary costs a gang: the job library's safe point at 1, 2 and 4 ranks.

At each boundary a rank polls its control channel (a non-blocking ``recv``) and, in a gang,
the ranks agree whether anyone has a command or a checkpoint due: one all-reduce of three
int32 through the CPU-capable control group (gloo; beside NCCL on GPUs), at most every
``AGREE_EVERY_S`` (counted in mini-batches). Each rank runs the job library's boundaries
with a real control channel and a rendezvous store hosted as the agent hosts it:

- bare: no training in between, so the number is the safe point alone (and the mini-batch
  is as short as it gets, so the agreement is spread over the most boundaries);
- with mini-batches of ``--work-ms`` (a sleep, standing in for GPU work): the time per
  mini-batch over that of the same sleeps without boundaries, measured in the same process.

The bare all-reduce of the same integers, every boundary, is timed in the same run: what
each boundary would cost if the ranks agreed at every one.

On this 2-core machine, 4 ranks share 2 cores: their numbers include waiting for a core.

Usage: python benchmarks/boundary_cost.py [--ranks 1,2,4] [--boundaries 3000] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table


def worker(boundaries: int, device: str, work_ms: float) -> None:
    import torch

    import gandiva.job as gj

    ours, theirs = socket.socketpair()  # the agent's end stays open and unread
    env = {**os.environ, "GANDIVA_CONTROL_FD": str(theirs.fileno()), "GANDIVA_DEVICE": device,
           "GANDIVA_CHECKPOINT_EVERY_S": "1e9"}
    job = gj.Job(env)
    job.distributed()
    warm = boundaries // 10
    for _ in range(warm):
        job.boundary()
    t0 = time.perf_counter()
    for _ in range(boundaries):
        job.boundary()
    boundary_us = (time.perf_counter() - t0) / boundaries * 1e6
    work, n = work_ms / 1e3, max(20, int(0.5 / (work_ms / 1e3)))  # half a second each
    extra = []
    for _ in range(5):  # alternating rounds, the median difference: sleeps jitter
        t0 = time.perf_counter()
        for _ in range(n):
            time.sleep(work)
        alone = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):
            time.sleep(work)
            job.boundary()
        extra.append((time.perf_counter() - t0) / n - alone)
    with_work_us = statistics.median(extra) * 1e6
    floor_us = 0.0
    if job._pg is not None:
        flag = torch.zeros(2, dtype=torch.int32)
        t0 = time.perf_counter()
        for _ in range(boundaries):
            job._pg.all_reduce(flag, op=job._pg.ReduceOp.MAX, group=job._control)
        floor_us = (time.perf_counter() - t0) / boundaries * 1e6
    print(json.dumps({"rank": job.rank, "boundary_us": boundary_us, "all_reduce_us": floor_us,
                      "with_work_us": with_work_us}), flush=True)
    ours.close()


def measure(ranks: int, boundaries: int, device: str, work_ms: float) -> dict:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
               "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1"}
        dev = f"cuda:{rank}" if device == "cuda" else f"cpu:{rank}"
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", "--boundaries", str(boundaries),
              "--device", dev, "--work-ms", str(work_ms)],
            env=env, stdout=subprocess.PIPE, text=True))
    rows = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    return {"ranks": ranks,
            "boundary_us": statistics.median(r["boundary_us"] for r in rows),
            "all_reduce_us": statistics.median(r["all_reduce_us"] for r in rows),
            "work_ms": work_ms,
            "with_work_us": statistics.median(r["with_work_us"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--boundaries", type=int, default=3000)
    ap.add_argument("--device", default="cpu", help="cpu (CPU slots) or cuda")
    ap.add_argument("--work-ms", type=float, default=20.0, help="a mini-batch, for the overhead")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.boundaries, args.device, args.work_ms)
        return
    results = [measure(int(n), args.boundaries, args.device, args.work_ms)
               for n in args.ranks.split(",")]
    table = Table(title=f"a mini-batch boundary, {args.device} (median over ranks; "
                        f"{args.boundaries} bare boundaries; {os.cpu_count()} cores)")
    for col in ("ranks", "bare boundary, µs", "all-reduce at every boundary, µs",
                f"boundary with {args.work_ms:g} ms mini-batches, µs", "overhead"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(str(r["ranks"]), f"{r['boundary_us']:.1f}",
                      f"{r['all_reduce_us']:.1f}" if r["ranks"] > 1 else "-",
                      f"{r['with_work_us']:.1f}",
                      f"{r['with_work_us'] / (args.work_ms * 1e3):.2%}")
    Console(width=120).print(table)
    print(json.dumps({"benchmark": "boundary_cost", "device": args.device,
                      "cores": os.cpu_count(), "results": results}))


if __name__ == "__main__":
    main()
