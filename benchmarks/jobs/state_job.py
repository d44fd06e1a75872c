"""A synthetic training job for the mechanism benchmarks: a state of a chosen size and a
mini-batch of a chosen cost, compute-bound (a matmul) or input-bound (a sleep)."""

import argparse
import time

import torch

import gandiva.job as gj


class Blob(torch.nn.Module):
    """``mb`` megabytes of float32 parameters, and a small layer that does the work."""

    def __init__(self, mb: float) -> None:
        super().__init__()
        self.bulk = torch.nn.Parameter(torch.zeros(max(1, int(mb * 2**20 / 4))))
        self.layer = torch.nn.Linear(256, 256)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--matmuls", type=int, default=20, help="compute per mini-batch")
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="input wait per mini-batch")
    ap.add_argument("--in-place", action="store_true", help="may move to another GPU in place")
    args = ap.parse_args()
    job = gj.init()
    model = Blob(args.mb).to(job.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    job.register(model=model, optimizer=opt)
    x = torch.randn(64, 256, device=job.device)
    for _ in job.steps(args.steps, in_place=args.in_place):
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)
        h = x
        for _ in range(args.matmuls):
            h = torch.tanh(model.layer(h))
        loss = h.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.report(samples=64)


if __name__ == "__main__":
    main()
