"""A job-library job with mixed precision and a compiled model: its GradScaler's state and
the compiled graph go through suspend, resume and a restart (benchmarks/gpu_checks.py amp).
Deterministic given --seed, so a run that was interrupted ends bit-identical to one that was
not."""

import argparse

import torch

import gandiva.job as gj


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    job = gj.init()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(512, 16)).to(job.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=job.device.type == "cuda")
    scaler = torch.amp.GradScaler(job.device.type)
    job.register(model=model, optimizer=opt, scaler=scaler)
    run = torch.compile(model) if args.compile else model
    for step in job.steps(args.steps):
        g = torch.Generator().manual_seed(args.seed * 100_003 + step)
        x = torch.randn(64, 256, generator=g).to(job.device)
        y = torch.randn(64, 16, generator=g).to(job.device)
        with torch.autocast(job.device.type, dtype=torch.float16,
                            enabled=job.device.type == "cuda"):
            loss = torch.nn.functional.mse_loss(run(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        job.report(samples=64, loss=loss.item())


if __name__ == "__main__":
    main()
