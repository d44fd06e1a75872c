"""An elastic data-parallel job: an MLP fitting a fixed random teacher network.

Each global batch is ``--shards`` fixed shards; rank r of W computes shards r, r+W, ... and
the gradients are summed in shard order (``job.sum_shards``), so the run is bit-identical at
any number of ranks: gandiva can grow it into idle devices and shrink it back exactly.

    python examples/elastic_mlp.py --steps 300          # alone, 1 rank
    # submitted with min_gpus=1, max_gpus=4, gandiva may run it on 1 to 4 devices
"""

import argparse

import torch
from torch import nn

import gandiva.job as gj

IN, HIDDEN, OUT = 32, 64, 8


def shard_batch(step: int, shard: int, size: int, seed: int, teacher: nn.Module):
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + shard)
    x = torch.randn(size, IN, generator=g)
    with torch.no_grad():
        y = teacher(x)
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--shards", type=int, default=8, help="shards per global batch")
    ap.add_argument("--shard-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    job = gj.init()
    torch.manual_seed(args.seed)
    teacher = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Linear(HIDDEN, OUT)).to(job.device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    job.register(model=model, optimizer=opt)
    params = list(model.parameters())
    loss = torch.tensor(float("nan"))
    for step in job.steps(args.steps):
        parts = {}
        for s in job.shards(args.shards):
            x, y = shard_batch(step, s, args.shard_size, args.seed, teacher)
            loss = nn.functional.mse_loss(model(x.to(job.device)), y.to(job.device))
            grads = torch.autograd.grad(loss, params)
            parts[s] = torch.cat([g.reshape(-1) for g in grads])
        flat = job.sum_shards(parts, args.shards) / args.shards
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
        job.report(samples=args.shards * args.shard_size // job.world_size, loss=loss.item())
    print(f"done: {args.steps} steps on {job.world_size} rank(s), last loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
