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
            more = torch.empty(int(args.grow_gb * 2**30), dtype=torch.uint8, device=job.device)
        loss = model(torch.randn(64, 512, device=job.device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.report(samples=64)
    del held, more


if __name__ == "__main__":
    main()
