"""A plain torchrun DDP script: it makes its own process group and wraps its model in
``DistributedDataParallel``, as scripts launched by torchrun do; its loop goes through the
job library (``job.steps``), which adopts the script's group instead of making a second one.

    torchrun --nproc-per-node=2 examples/ddp.py --steps 300     # alone, with torchrun
    # as a gandiva job spec: command: torchrun --nproc-per-node=2 ddp.py ...  gpus: 2
    # (gandiva is the launcher: it starts the two ranks itself, see gandiva/node/torchrun.py)

Each rank draws its own half of batch ``step`` from a generator seeded with (seed, step,
rank): the data position is the step, so a time-sliced, moved or restarted run sees the
batches an uninterrupted one does, and ends with the same parameters, bit for bit.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import gandiva.job as gj

IN, OUT = 20, 4


def batch(step: int, rank: int, size: int, seed: int, teacher: torch.Tensor):
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + rank)
    x = torch.randn(size, IN, generator=g)
    return x, (x @ teacher).tanh()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default=None, help="default: gloo on CPU, NCCL on GPUs")
    args = ap.parse_args()

    dist.init_process_group(args.backend)  # the script's own group
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    job = gj.init()
    torch.manual_seed(args.seed)  # every rank starts from the same parameters
    teacher = torch.randn(IN, OUT)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(IN, 64), nn.ReLU(), nn.Linear(64, OUT)).to(device))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    job.register(model=model, optimizer=opt)
    loss = torch.tensor(float("nan"))
    for step in job.steps(args.steps):
        x, y = batch(step, dist.get_rank(), args.batch, args.seed, teacher)
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        opt.step()
        job.report(samples=args.batch, loss=loss.item())
    print(f"done: {args.steps} steps on {dist.get_world_size()} ranks, "
          f"last loss {loss.item():.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
