"""A job that holds ``--gb`` of device memory and, from step ``--grow-at``, ``--grow-gb``
more: two of them packed on one GPU show what a memory cap does (gpu_checks.py pack)."""

import argparse

import torch

import gandiva.job as gj


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--grow-gb", type=float, default=0.0)
    ap.add_argument("--grow-at", type=int, default=-1)
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args()
    job = gj.init()
    model = torch.nn.Linear(512, 512).to(job.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    job.register(model=model, optimizer=opt)
    held = torch.empty(int(args.gb * 2**30), dtype=torch.uint8, device=job.device)
    more = None
    for step in job.steps(args.steps):
        if step == args.grow_at:
            print(f"step {step}: growing by {args.grow_gb} GB (cap {job.memory_cap_gb})",
                  flush=True)
            cap = job.memory_cap_gb
            if job.device.type == "cpu" and cap is not None and args.gb + args.grow_gb > cap:
                # a CPU slot standing in for a GPU (gpu_check.sh --dry-run) has no allocator
                # to hold a cap: what a GPU's would raise
                raise torch.OutOfMemoryError(f"CUDA out of memory: {args.gb + args.grow_gb} GB "
                                             f"held past a cap of {cap:.2f} GB (CPU stand-in)")
            more = torch.empty(int(args.grow_gb * 2**30), dtype=torch.uint8, device=job.device)
        loss = model(torch.randn(64, 512, device=job.device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.report(samples=64)
    del held, more


if __name__ == "__main__":
    main()
