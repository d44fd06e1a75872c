"""An unmodified torchrun DDP script: it never imports gandiva, so gandiva time-slices it with
signals (SIGSTOP/SIGCONT) and can move it only by restarting it. Like many real scripts, it
leaves its process group for the interpreter to clean up at exit (no
``destroy_process_group``).

    torchrun --nproc-per-node=2 examples/ddp_plain.py --steps 300
    # as a gandiva job spec: command: torchrun --nproc-per-node=2 ddp_plain.py  gpus: 2
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN, OUT = 20, 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)  # every rank starts from the same parameters
    teacher = torch.randn(IN, OUT)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(IN, 64), nn.ReLU(),
                                                  nn.Linear(64, OUT)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(1 + rank)
    loss = torch.tensor(float("nan"))
    for _ in range(args.steps):
        x = torch.randn(args.batch, IN, generator=g)
        loss = nn.functional.mse_loss(model(x), (x @ teacher).tanh())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank} of {dist.get_world_size()} (pid {os.getpid()}): {args.steps} steps, "
          f"last loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
