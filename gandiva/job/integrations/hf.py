"""Hugging Face ``transformers.Trainer`` under gandiva: suspend, resume, checkpoint, move and
resize through the Trainer's own checkpoints.

The one changed line of a script::

    from gandiva.job.integrations import hf
    hf.train(trainer)                 # was: trainer.train()

``train`` adds ``GandivaCallback`` and calls ``trainer.train(resume_from_checkpoint=...)``
with the job's newest checkpoint, so the Trainer restores it itself: model, optimizer,
scheduler, RNG states and the position in the epoch (it skips the batches it had done).

Safe points. A suspend is obeyed at the end of each optimizer step (``on_step_end``). A
checkpoint is written once the step's logging, evaluation and the script's own save are over:
at the next ``on_step_begin`` (mid-epoch), ``on_epoch_begin`` (after an epoch's end, before
the next epoch's data loader draws its seed) or ``on_train_end``. That is the state a resumed
Trainer reproduces: it goes on with the next step and never repeats the step's evaluation,
so a checkpoint taken before it would lose it (and the best metric it found). gandiva writes
its checkpoint itself, through the Trainer's ``_save_checkpoint`` pointed at a staging
directory of its own: the script's ``control.should_save`` is never touched, so no
``save_strategy`` ("best" included, which overwrites that flag after evaluating) can drop
gandiva's save, and the script's ``output_dir`` gets exactly the checkpoints its own schedule
saves (an extra one there would also count against ``save_total_limit``).

The checkpoint file. A Trainer checkpoint is a directory, a gandiva checkpoint one file,
written atomically, checksummed and moved between nodes as one. Decision: the file is an
uncompressed tar of the directory (``tar xf`` opens it), streamed file by file from disk
into the scratch file and back out on restore, never held in memory whole (a 7B model with
AdamW is ~80 GB a rank). Its first member, ``gandiva.json``, records the width it was taken
at and its batch geometry. Checkpoints of the earlier format (one ``torch.save`` dict of the
files' bytes) still restore.

RNG states. The Trainer writes ``rng_state_<process_index>.pth`` per process into that
process's own directory (ranks on other nodes, or with their own ``output_dir``, see
others' files nowhere): each rank's file is gathered to rank 0 through the gang's process
group and packed with the rest, and on restore every rank finds its own again.

Resizing. The Trainer derives the data position from ``global_step`` alone: it skips
``global_step % steps_per_epoch`` optimizer steps' worth of batches, and the batch of a step
is ``per_device_train_batch_size * gradient_accumulation_steps * world_size`` samples. So a
job resumed at another width would start at the wrong sample (and its epochs and schedule
would change length). Decision: the global batch is kept. On restore at a new width the
per-device batch and gradient accumulation are chosen so that their product times the new
width is the checkpoint's global batch (the per-device batch never grows past the script's,
so memory does not either). With accelerate's seedable sampler (the Trainer's default) the
epoch's sample order does not depend on the width, and optimizer step ``s`` then trains on
exactly the samples it trained on at the old width: no sample is repeated or skipped, and
epochs, learning-rate schedule and logging/eval/save steps keep their meaning. What does not
hold across widths is bit-identity: gradients are summed in another order (all-reduce vs
accumulation) and each rank's dropout draws from its own RNG stream (rank ``i`` resumes with
the stream of old rank ``i mod old_width``), so the weights agree to rounding, and with
dropout statistically only. Where the global batch cannot be kept (not divisible by the new
width), or the new epoch has another number of steps (a dataset that is not a multiple of the
global batch, padded differently per width), resuming would silently move the data position,
so it fails with an error instead. Resumed at the same width, a job ends bit-identical to
the run alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import shutil
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

import gandiva.job as gj
from gandiva.job import checkpoint, wire

KEY = "transformers_checkpoint"  # the earlier format: torch.save({KEY: {name: bytes}})
META = "gandiva.json"
TRAINER_STATE = "trainer_state.json"
_CHUNK = 1 << 20


def train(trainer, **kwargs: Any):
    """``trainer.train(**kwargs)``, steered by gandiva and resumed from the job's newest
    checkpoint (unless ``resume_from_checkpoint`` is given)."""
    callback = next((cb for cb in trainer.callback_handler.callbacks
                     if isinstance(cb, GandivaCallback)), None)
    if callback is None:
        callback = GandivaCallback()
        trainer.add_callback(callback)
    callback.trainer = trainer
    if kwargs.get("resume_from_checkpoint") is None:
        kwargs["resume_from_checkpoint"] = callback.restore()
    try:
        return trainer.train(**kwargs)
    except _Over:
        # restored from the checkpoint of its last step (moved or restarted as it ended): the
        # Trainer's loop takes a step before it looks at max_steps, one more than alone
        from transformers.trainer_utils import TrainOutput

        state = trainer.state
        callback.job.finish(save=False)  # the checkpoint it restored is its last
        losses = [h["train_loss"] for h in state.log_history if "train_loss" in h]
        return TrainOutput(state.global_step, losses[-1] if losses else 0.0, {})


class _Over(Exception):
    """A step is about to begin past ``max_steps`` (see ``train``)."""


# ---- the checkpoint file ---------------------------------------------------------------------

def pack(folder: Path, into: Path, extra: dict[str, bytes] | None = None) -> None:
    """Stream the files of the Trainer checkpoint directory ``folder`` into ``into``, an
    uncompressed tar, after the small members ``extra`` (which replace files of the same
    name)."""
    extra = extra or {}
    # typeshed's tarfile.open leaves out copybufsize, which it passes on to TarFile
    with tarfile.open(into, "w", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                      copybufsize=_CHUNK) as tar:
        for name, data in extra.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for path in sorted(folder.rglob("*")):
            name = path.relative_to(folder).as_posix()
            if path.is_file() and name not in extra:
                tar.add(path, arcname=name, recursive=False)


def _is_tar(file: Path) -> bool:
    with open(file, "rb") as f:
        return f.read(512)[257:262] == b"ustar"


def unpack(file: Path, folder: Path) -> Path:
    """The Trainer checkpoint directory kept in ``file`` (either format), written out as
    ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    if _is_tar(file):
        with tarfile.open(file, "r:", copybufsize=_CHUNK) as tar:  # type: ignore[call-overload]
            tar.extractall(folder, filter="data")  # names stay inside ``folder``
        return folder
    for name, data in _legacy(file).items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return folder


def _legacy(file: Path) -> dict[str, bytes]:
    import torch

    return torch.load(file, weights_only=False)[KEY]


def read(file: Path, name: str) -> bytes:
    """One file of the Trainer checkpoint kept in ``file`` (tools and tests)."""
    if not _is_tar(file):
        return _legacy(file)[name]
    with tarfile.open(file, "r:") as tar:
        member = tar.extractfile(name)
        if member is None:
            raise KeyError(name)
        return member.read()


def _rng_name(world_size: int, rank: int) -> str:
    """The Trainer's name for a process's RNG file."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


def rng_for_width(folder: Path, old: int, new: int) -> None:
    """Give each rank of the new width an RNG file: rank ``i`` that of old rank ``i mod
    old`` (streams of different widths cannot correspond; every rank still gets one)."""
    for rank in range(new):
        source = folder / _rng_name(old, rank % old)
        target = folder / _rng_name(new, rank)
        if source.is_file() and not target.exists():
            shutil.copyfile(source, target)


@contextlib.contextmanager
def _overridden(args: Any, **values: Any) -> Iterator[None]:
    """``args`` with ``values`` set for the duration."""
    before = {name: getattr(args, name) for name in values}
    for name, value in values.items():
        setattr(args, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(args, name, value)


class GandivaCallback(TrainerCallback):
    """Safe points of the job in the Trainer's loop (see the module's docstring)."""

    def __init__(self) -> None:
        self.job = gj.init()
        self.trainer: Any = None  # set by ``train``: gandiva saves through it
        self.pending: wire.Checkpoint | None = None  # to write at the next safe point
        self.resumed: dict[str, Any] = {}  # the restored checkpoint's gandiva.json
        self.unpacked: Path | None = None  # removed once every rank has read it
        self.steps_per_epoch: int | None = None

    # ---- restore ---------------------------------------------------------------------------
    def restore(self) -> str | None:
        """The newest checkpoint, unpacked where the Trainer can resume from it (once per
        node: its ranks share the directory, each reads its own RNG file), with the batch
        geometry fitted to this width."""
        directory = self.job.checkpoint_dir
        if directory is None:
            return None
        found = checkpoint.newest_whole(directory)
        if found is None:
            return None
        step, file = found
        self.job.distributed()  # accelerate made the group (if there are ranks): adopt it
        node = directory / "resume" / f"node{self.job.rank - self.job.local_rank}"
        folder = node / f"checkpoint-{step}"
        if self.job.local_rank == 0:
            shutil.rmtree(node, ignore_errors=True)
            unpack(file, folder)
            meta = self._meta(folder)
            if meta:
                rng_for_width(folder, meta["world_size"], self.job.world_size)
        self.job.barrier()
        self.resumed, self.unpacked = self._meta(folder), node
        self.fit_width()
        self.job.restored(step)
        return str(folder)

    @staticmethod
    def _meta(folder: Path) -> dict[str, Any]:
        path = folder / META
        return json.loads(path.read_text()) if path.is_file() else {}

    def fit_width(self) -> None:
        """Keep the checkpoint's global batch at this width (see the module's docstring)."""
        args, meta = self.trainer.args, self.resumed
        width = max(1, args.world_size)
        if not meta or meta["world_size"] == width:
            return
        total = meta["global_batch"]
        if total % width:
            raise RuntimeError(
                f"gandiva: cannot resume a global batch of {total} samples on {width} ranks "
                f"(it was taken on {meta['world_size']}): the data position would move")
        per_rank = total // width
        batch = max(b for b in range(1, min(args.per_device_train_batch_size, per_rank) + 1)
                    if per_rank % b == 0)
        args.per_device_train_batch_size = batch
        args.gradient_accumulation_steps = per_rank // batch
        self.trainer._train_batch_size = args.train_batch_size
        print(f"gandiva: resized from {meta['world_size']} to {width} ranks: per-device batch "
              f"{batch}, gradient accumulation {per_rank // batch} (global batch {total})",
              file=sys.stderr, flush=True)

    # ---- hooks -----------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       train_dataloader=None, **_: Any):
        if self.trainer is None:
            raise TypeError("GandivaCallback needs the Trainer: call hf.train(trainer)")
        self.job.distributed()
        objects = {"model": model} if model is not None else {}
        if optimizer is not None:
            objects["optimizer"] = getattr(optimizer, "optimizer", optimizer)
        self.job.register(**objects)
        self.steps_per_epoch = _steps_per_epoch(train_dataloader,
                                                args.gradient_accumulation_steps)
        self._check_epoch()
        self.job.step = state.global_step
        self.job.started()

    def _check_epoch(self) -> None:
        """A resized job whose epoch changed length would resume at another sample."""
        old, new = self.resumed.get("steps_per_epoch"), self.steps_per_epoch
        if self.resumed.get("world_size") == self.trainer.args.world_size:
            return
        if old is not None and new is not None and old != new:
            raise RuntimeError(
                f"gandiva: an epoch is {new} optimizer steps at this width and was {old}: "
                "resuming would repeat or skip samples (make the dataset a multiple of the "
                "global batch, or set dataloader_drop_last)")

    def on_log(self, args, state, control, logs=None, **_: Any):
        if logs and "loss" in logs:
            self.job.report(at=state.global_step, loss=logs["loss"])

    def on_step_end(self, args, state, control, **_: Any):
        if self.unpacked is not None:  # every rank has loaded it (the step synchronised them)
            if self.job.local_rank == 0:
                shutil.rmtree(self.unpacked, ignore_errors=True)
            self.unpacked = None
        self.job.report(samples=args.per_device_train_batch_size
                        * args.gradient_accumulation_steps)
        command = self.job.next_command(step=state.global_step)
        while command is not None and not isinstance(command, wire.Checkpoint):
            command = self.job.obey(command)  # a suspend (waits here), or a stray resume
        if command is not None:
            self.job.wake()  # (after a suspend): the step's evaluation and saves come first
            self._defer(command)

    def on_prediction_step(self, args, state, control, **_: Any):
        self.job.pause_point(collective=True)  # an evaluation batch (as many on every rank)

    def _defer(self, command: wire.Checkpoint) -> None:
        """Write ``command``'s checkpoint at the next safe point (one write for several)."""
        if self.pending is not None:
            command = wire.Checkpoint(exit=command.exit or self.pending.exit,
                                      periodic=command.periodic and self.pending.periodic)
        self.pending = command

    def on_step_begin(self, args, state, control, **_: Any):
        if 0 < state.max_steps <= state.global_step:
            raise _Over
        self._write_pending(state)

    def on_epoch_begin(self, args, state, control, **_: Any):
        self._write_pending(state)

    def on_train_end(self, args, state, control, **_: Any):
        command = self.pending or wire.Checkpoint(periodic=True)  # the last one
        self.pending = None
        self._checkpoint(dataclasses.replace(command, exit=False), state)
        self.job.finish(save=False)  # written just now

    def _write_pending(self, state) -> None:
        if self.pending is None:
            return
        command, self.pending = self.pending, None
        self._checkpoint(command, state)

    # ---- checkpoints -----------------------------------------------------------------------
    def _checkpoint(self, command: wire.Checkpoint, state) -> None:
        """Write the Trainer's checkpoint into a staging directory, pack it as the job's
        checkpoint of this step, and carry out the rest of ``command``."""
        directory = self.job.checkpoint_dir
        if directory is None:
            self.job.obey(command)  # nowhere to write: the agent still gets its answer
            return
        staging = directory / "trainer" / f"node{self.job.rank - self.job.local_rank}"
        folder = staging / f"checkpoint-{state.global_step}"
        self._save_trainer(staging, folder)
        self.job.writer = lambda scratch: self._pack(folder, scratch)
        try:
            self.job.obey(dataclasses.replace(command, exit=False))  # every rank: see save
        finally:
            self.job.writer = None
            if self.job.local_rank == 0:  # (after save's last barrier: all have read)
                shutil.rmtree(staging, ignore_errors=True)
        if command.exit:
            self.job.exit()

    def _save_trainer(self, staging: Path, folder: Path) -> None:
        """The Trainer's own whole checkpoint (optimizer included even where the script saves
        the model only), into ``staging``, pushed nowhere; the Trainer state keeps the
        script's best checkpoint, not the staging copy."""
        trainer = self.trainer
        best = trainer.state.best_model_checkpoint
        with _overridden(trainer.args, output_dir=str(staging), push_to_hub=False,
                         save_only_model=False, save_total_limit=None):
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        trainer.state.best_model_checkpoint = best
        if trainer.args.should_save:
            trainer.state.save_to_json(str(folder / TRAINER_STATE))

    def _pack(self, folder: Path, scratch: Path) -> None:
        """Every rank: send this rank's RNG file to rank 0, which packs the directory with
        all of them and ``gandiva.json``."""
        args = self.trainer.args
        width = max(1, args.world_size)
        name = _rng_name(width, args.process_index)
        mine = {name: (folder / name).read_bytes()} if (folder / name).is_file() else {}
        every = self._gather(mine)
        if self.job.rank != 0:
            return
        extra = {META: json.dumps(self._meta_now(width)).encode()}
        for files in every:
            extra.update(files)
        pack(folder, scratch, extra)

    def _gather(self, files: dict[str, bytes]) -> list[dict[str, bytes]]:
        return self.job.gather(files) or []

    def _meta_now(self, width: int) -> dict[str, Any]:
        args = self.trainer.args
        return {"format": 1, "world_size": width,
                "per_device_batch": args.per_device_train_batch_size,
                "accumulation": args.gradient_accumulation_steps,
                "global_batch": args.train_batch_size * args.gradient_accumulation_steps * width,
                "steps_per_epoch": self.steps_per_epoch}


def _steps_per_epoch(loader: Any, accumulation: int) -> int | None:
    """Optimizer steps in an epoch of this rank's data loader, as the Trainer counts them."""
    try:
        return max(1, math.ceil(len(loader) / accumulation))
    except TypeError:  # no loader, or one without a length (an iterable dataset)
        return None
