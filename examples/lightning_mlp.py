"""A PyTorch Lightning script that knows nothing of gandiva: a small MLP fitting a fixed
random teacher, with a ``LightningModule``, a ``Trainer`` and ``trainer.fit``.

    python examples/lightning_mlp.py --epochs 3          # alone
    # submitted to gandiva as is: Lightning finds gandiva's callback through its
    # entry point, and the job is time-sliced, moved and restarted at mini-batch boundaries

The one thing it does for exact resumes is Lightning's own rule: its train data is
resumable (``state_dict``/``load_state_dict``), so a run restored mid-epoch goes on from
the batch it stopped at. Batch i of epoch e is drawn from a generator seeded with
(seed, e, i): no download, and the same batches in every run.
"""

import argparse

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import nn

IN, OUT = 16, 4


class Batches:
    """``batches`` batches per epoch; remembers where it is, for Lightning's checkpoints."""

    def __init__(self, batches: int, size: int, seed: int) -> None:
        self.batches, self.size, self.seed = batches, size, seed
        g = torch.Generator().manual_seed(seed)
        self.teacher = torch.randn(IN, OUT, generator=g)
        self.epoch = self.position = self._resume_at = 0

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        start, self._resume_at = self._resume_at, 0
        rank = dist.get_rank() if dist.is_initialized() else 0  # each rank its own share
        for i in range(start, self.batches):
            self.position = i + 1
            g = torch.Generator().manual_seed(
                ((self.seed * 1_000_003 + self.epoch) * 10_007 + i) * 101 + rank)
            x = torch.randn(self.size, IN, generator=g)
            yield x, (x @ self.teacher).tanh()
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._resume_at = state["epoch"], state["position"]


class Regressor(pl.LightningModule):
    def __init__(self, lr: float, width: int) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(IN, width), nn.ReLU(), nn.Linear(width, OUT))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        return {"optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=100, help="per epoch")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--devices", type=int, default=1, help="data-parallel ranks (DDP)")
    args = ap.parse_args()

    pl.seed_everything(args.seed, verbose=False)
    model = Regressor(args.lr, args.width)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="auto", devices=args.devices,
                         strategy="ddp" if args.devices > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, Batches(args.batches, args.batch, args.seed))
    # no loss when fit() resumed from a checkpoint taken after the last step: nothing left to run
    loss = trainer.callback_metrics.get("loss", float("nan"))
    print(f"done: {trainer.global_step} steps, last loss {loss:.5f}")


if __name__ == "__main__":
    main()
