"""Hugging Face ``transformers.Trainer`` under gandiva: suspend, resume, checkpoint and move
at the end of each optimizer step, through the Trainer's own checkpoints.

The one changed line of a script::

    from gandiva.job.integrations import hf
    hf.train(trainer)                 # was: trainer.train()

``train`` adds ``GandivaCallback`` and calls ``trainer.train(resume_from_checkpoint=...)``
with the job's newest checkpoint, so the Trainer restores it itself: model, optimizer,
scheduler, RNG states and the position in the epoch (it skips the batches it had done).

Checkpoints: when the agent asks for one (or one is due), the callback sets
``control.should_save``, the Trainer writes its ``checkpoint-<step>`` directory as it always
does, and the callback then keeps it as the job's checkpoint. Decision: a Trainer checkpoint
is a directory, a gandiva checkpoint one file, written atomically, checksummed and moved
between nodes as one; so the directory's files go, byte for byte, into one ``torch.save``
dict (``{"transformers_checkpoint": {name: bytes}}``; ``torch.load`` opens it, ``unpack``
gives the directory back), and the Trainer's directory is removed unless the script's own
save schedule asked for it at that step.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

import gandiva.job as gj
from gandiva.job import checkpoint, wire

KEY = "transformers_checkpoint"


def train(trainer, **kwargs: Any):
    """``trainer.train(**kwargs)``, steered by gandiva and resumed from the job's newest
    checkpoint (unless ``resume_from_checkpoint`` is given)."""
    callback = next((cb for cb in trainer.callback_handler.callbacks
                     if isinstance(cb, GandivaCallback)), None)
    if callback is None:
        callback = GandivaCallback()
        trainer.add_callback(callback)
    if kwargs.get("resume_from_checkpoint") is None:
        kwargs["resume_from_checkpoint"] = callback.restore()
    return trainer.train(**kwargs)


def pack(folder: Path, into: Path) -> None:
    """Write the Trainer checkpoint directory ``folder`` as one ``torch.save`` file."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    torch.save({KEY: files}, into)


def unpack(file: Path, folder: Path) -> Path:
    """The Trainer checkpoint directory kept in ``file``, written out as ``folder``."""
    files = torch.load(file, weights_only=False)[KEY]
    for name, data in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return folder


class GandivaCallback(TrainerCallback):
    """The end of each optimizer step is a safe point of the job."""

    def __init__(self) -> None:
        self.job = gj.init()
        self.pending: wire.Checkpoint | None = None  # a checkpoint the Trainer is to write
        self.theirs = False  # the script's own schedule saves at this step too

    def restore(self) -> str | None:
        """The newest checkpoint, unpacked where the Trainer can resume from it."""
        directory = self.job.checkpoint_dir
        found = checkpoint.newest_whole(directory) if directory else None
        if found is None:
            return None
        step, file = found
        mine = directory / "resume" / f"rank{self.job.rank}"  # (ranks share the directory)
        shutil.rmtree(mine, ignore_errors=True)
        folder = unpack(file, mine / f"checkpoint-{step}")
        self.job.restored(step)
        return str(folder)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **_: Any):
        self.job.distributed()  # accelerate made the group (if there are ranks): adopt it
        objects = {"model": model} if model is not None else {}
        if optimizer is not None:
            objects["optimizer"] = getattr(optimizer, "optimizer", optimizer)
        self.job.register(**objects)
        self.job.step = state.global_step
        self.job.started()

    def on_log(self, args, state, control, logs=None, **_: Any):
        if logs and "loss" in logs:
            self.job.report(at=state.global_step, loss=logs["loss"])

    def on_step_end(self, args, state, control, **_: Any):
        self.job.report(samples=args.per_device_train_batch_size
                        * args.gradient_accumulation_steps)
        command = self.job.next_command()
        if state.global_step >= state.max_steps and command is None:
            command = wire.Checkpoint(periodic=True)  # the last one
        while command is not None and not isinstance(command, wire.Checkpoint):
            command = self.job.obey(command)  # a suspend (waits here), or a stray resume
        if command is not None:  # the Trainer writes it next, then calls on_save
            self.pending, self.theirs = command, control.should_save
            control.should_save = True
        return control

    def on_save(self, args, state, control, **_: Any):
        if self.pending is None:
            return control  # the script's own save
        command, self.pending = self.pending, None
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        mine = not self.theirs
        self.job.writer = lambda scratch: pack(folder, scratch) if self.job.rank == 0 else None
        try:
            self.job.obey(dataclasses.replace(command, exit=False))  # saves through the writer
        finally:
            if mine and self.job.rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
        if command.exit:
            self.job.exit()
        return control

    def on_train_end(self, args, state, control, **_: Any):
        self.job.finish(save=False)  # the last step's checkpoint is written already

