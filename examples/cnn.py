"""A small CNN learning to classify synthetic 16x16 "digits" (fixed templates plus noise).

The data is generated, so the example needs no download: batch ``step`` is drawn from a
generator seeded with (seed, step), which is what makes a suspended, moved or restarted run
see exactly the batches an uninterrupted one sees.

    python examples/cnn.py --steps 400 --lr 0.05        # alone, or submitted to gandiva
"""

import argparse
import time

import torch
from torch import nn

import gandiva.job as gj

CLASSES, SIDE = 10, 16


def templates(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(CLASSES, 1, SIDE, SIDE, generator=g) > 0.5).float()


def batch(step: int, size: int, seed: int, base: torch.Tensor):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    labels = torch.randint(0, CLASSES, (size,), generator=g)
    images = base[labels] + 0.8 * torch.randn(size, 1, SIDE, SIDE, generator=g)
    return images, labels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=16, help="channels of the conv layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="wait this long after each mini-batch: a bigger model's step time "
                         "without its work (a CPU slot standing in for a GPU)")
    args = ap.parse_args()

    job = gj.init()
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Conv2d(1, args.width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(args.width, args.width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(args.width * (SIDE // 4) ** 2, CLASSES),
    ).to(job.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    job.register(model=model, optimizer=opt, lr_schedule=sched)
    base = templates(args.seed)
    loss = torch.tensor(float("nan"))
    for step in job.steps(args.steps):
        x, y = batch(step, args.batch, args.seed, base)
        x, y = x.to(job.device), y.to(job.device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        acc = (model(x).argmax(1) == y).float().mean() if step % 50 == 0 else None
        job.report(samples=args.batch, loss=loss.item(),
                   **({"accuracy": acc.item()} if acc is not None else {}))
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000)
    print(f"done: {args.steps} steps, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
