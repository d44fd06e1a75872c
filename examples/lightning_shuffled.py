"""A Lightning script as people write them, knowing nothing of gandiva: a plain shuffled
``DataLoader`` over a ``TensorDataset``, a model with dropout, gradient accumulation.

    python examples/lightning_shuffled.py --epochs 3     # import lightning.pytorch as pl
    python examples/pl_shuffled.py --epochs 3            # import pytorch_lightning as pl

Nothing in it is resumable by Lightning's rules (its loader has no ``state_dict``, and
Lightning's checkpoints hold no random state): under gandiva it is suspended, moved and
restarted mid-epoch all the same, and ends as if it had run alone (gandiva's callback replays
the epoch's order and the random state; see ``gandiva.job.integrations.lightning``).
"""

import argparse
import time
from types import ModuleType

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IN, OUT = 16, 4


def regressor(pl: ModuleType) -> type:
    """The model, a ``LightningModule`` of the package ``pl`` (each package's ``Trainer``
    takes only its own)."""

    class Regressor(pl.LightningModule):
        def __init__(self, lr: float, width: int, val_ms: float = 0.0) -> None:
            super().__init__()
            self.lr, self.val_ms = lr, val_ms
            self.net = nn.Sequential(nn.Linear(IN, width), nn.ReLU(), nn.Dropout(0.2),
                                     nn.Linear(width, OUT))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            time.sleep(self.val_ms / 1000)  # an evaluation that takes its time
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=self.lr)
            return {"optimizer": opt,
                    "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 20, gamma=0.5)}

    return Regressor


def main(pl: ModuleType) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--accumulate", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--devices", type=int, default=1, help="data-parallel ranks (DDP)")
    ap.add_argument("--val-batches", type=int, default=0, help="validation batches (0: none)")
    ap.add_argument("--val-ms", type=float, default=0.0, help="time each validation batch takes")
    args = ap.parse_args()

    pl.seed_everything(args.seed, verbose=False)
    x = torch.randn(args.samples, IN)
    y = (x @ torch.randn(IN, OUT)).tanh() + 0.1 * torch.randn(args.samples, OUT)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True)
    model = regressor(pl)(args.lr, args.width, args.val_ms)
    val = (DataLoader(TensorDataset(x[:args.val_batches * args.batch],
                                    y[:args.val_batches * args.batch]), batch_size=args.batch)
           if args.val_batches else None)
    trainer = pl.Trainer(max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
                         num_sanity_val_steps=args.val_batches,
                         accelerator="auto", devices=args.devices,
                         strategy="ddp" if args.devices > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader, val)
    print(f"done: {trainer.global_step} steps")


if __name__ == "__main__":
    import lightning.pytorch

    main(lightning.pytorch)
