"""PyTorch Lightning under gandiva: suspend, resume, checkpoint and move at
``on_train_batch_end``, through Lightning's own checkpoints.

An unmodified script gets this: when a job runs under gandiva, Lightning finds
``callbacks()`` through its ``lightning.pytorch.callbacks_factory`` entry point (declared in
gandiva's package) and adds ``GandivaCallback`` to every ``Trainer``. A script may also add
it itself, ``Trainer(callbacks=[GandivaCallback()])``.

How it resumes: the callback is an ``OnExceptionCheckpoint``, Lightning's fault-tolerance
callback, whose ``ckpt_path`` ``Trainer.fit`` consults when it is given no ``ckpt_path``
("last"). Here ``ckpt_path`` is the job's newest whole checkpoint (checksum verified, as the
job library's), so ``fit`` restores it with Lightning's own machinery: model, optimizers,
schedulers, callbacks, loops, and the position in the epoch. That position is exact when the
train dataloader is resumable (``state_dict``/``load_state_dict``, e.g. torchdata's
``StatefulDataLoader``); with a plain ``DataLoader`` Lightning restarts the epoch's data from
its beginning and says so (its rule, not ours).

Checkpoints are Lightning's ``.ckpt`` format, written by ``Trainer.save_checkpoint`` on every
rank (Lightning's strategy picks the writer) and committed by rank 0 under the job library's
name and checksum (``gandiva.job.checkpoint``): a ``.ckpt`` that ``torch.load`` and
``Trainer.fit(ckpt_path=...)`` open anywhere, and that gandiva moves between nodes as any.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import OnExceptionCheckpoint

import gandiva.job as gj
from gandiva.job import checkpoint

# Lightning's words when fit() takes "last" from a fault-tolerance callback and when there is
# no checkpoint yet: both are the expected case under gandiva, not the user's mistake
for _message in (r".*ckpt_path=None.*was called without a model",
                 r".*ckpt_path=\"last\".*no last checkpoint available",
                 r".*ckpt_path='last'.*no last checkpoint available"):
    warnings.filterwarnings("ignore", message=_message)


def callbacks() -> list[Any]:
    """Lightning's entry point: a ``GandivaCallback`` for every ``Trainer`` of a job run by
    gandiva (or run alone with a checkpoint directory); none otherwise."""
    if "GANDIVA_JOB_ID" in os.environ or "GANDIVA_CHECKPOINT_DIR" in os.environ:
        return [GandivaCallback()]
    return []


class GandivaCallback(OnExceptionCheckpoint):
    """Each training mini-batch's end is a safe point of the job (``Job.boundary``)."""

    def __init__(self) -> None:
        self.job = gj.init()
        directory = self.job.checkpoint_dir
        super().__init__(dirpath=directory or Path.cwd(), filename="gandiva")
        self.active = False

    @property
    def ckpt_path(self) -> str | None:  # type: ignore[override]
        """The newest whole checkpoint, which ``Trainer.fit`` restores (see module doc)."""
        if self.job.checkpoint_dir is None:
            return None
        found = checkpoint.newest_whole(self.job.checkpoint_dir)
        return str(found[1]) if found else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # one callback steers the job, if a script also added its own
        mine = [cb for cb in trainer.callbacks if isinstance(cb, GandivaCallback)]
        self.active = stage == "fit" and mine[0] is self
        if self.active:
            self.job.distributed()  # Lightning's strategy made the group: adopt it
            self.job.writer = trainer.save_checkpoint

    def on_train_start(self, trainer, pl_module) -> None:
        if not self.active:
            return
        restored = _step_of(trainer.ckpt_path)
        if restored is not None:
            self.job.restored(restored)
        self.job.register(model=pl_module,
                          **{f"optimizer{i}": opt for i, opt in enumerate(trainer.optimizers)})
        self.job.started()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.active:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        metrics = {"loss": float(loss)} if torch.is_tensor(loss) and loss.numel() == 1 else {}
        self.job.report(samples=_batch_size(batch), **metrics)
        self.job.boundary()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.active:
            self.job.finish()

    def on_exception(self, trainer, *_: Any, **__: Any) -> None:
        """Save nothing: a crash mid-step leaves no safe point; the job restarts from its
        last checkpoint (OnExceptionCheckpoint would save the half-done state)."""

    def teardown(self, trainer, *_: Any, **__: Any) -> None:
        """Keep the checkpoints (OnExceptionCheckpoint deletes its file here)."""

    def state_dict(self) -> dict[str, Any]:
        return {}


def _step_of(path: str | None) -> int | None:
    m = re.search(r"ckpt-(\d{12})\.pt$", str(path or ""))
    return int(m[1]) if m else None


def _batch_size(batch: Any) -> int:
    """The length of the first tensor in ``batch`` (a tensor, or a tuple, list or dict)."""
    if torch.is_tensor(batch):
        return len(batch) if batch.dim() else 1
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple)) or isinstance(batch, dict):
        for item in items:
            if (n := _batch_size(item)):
                return n
    return 0
