"""PyTorch Lightning under gandiva: suspend, resume, checkpoint and move at optimizer steps,
through Lightning's own checkpoints, for both of Lightning's packages.

An unmodified script gets this: when a job runs under gandiva, Lightning finds gandiva's
callback through its entry point (``lightning.pytorch.callbacks_factory`` for
``import lightning.pytorch``, ``pytorch_lightning.callbacks_factory`` for ``import
pytorch_lightning``; both declared in gandiva's package) and adds it to every ``Trainer``. A
script may also add it itself: ``Trainer(callbacks=[GandivaCallback()])`` (lightning.pytorch),
``callback_class("pytorch_lightning")()`` for the classic package, whose ``Trainer`` takes
only callbacks of its own package. Each package is imported only when asked for.

How it resumes: the callback is an ``OnExceptionCheckpoint``, Lightning's fault-tolerance
callback, whose ``ckpt_path`` ``Trainer.fit`` consults when it is given no ``ckpt_path``
("last"). Here ``ckpt_path`` is the job's newest whole checkpoint (checksum verified, as the
job library's), so ``fit`` restores it with Lightning's own machinery: model, optimizers,
schedulers, callbacks, loops, and the position in the epoch.

Safe points (``Job.boundary``) are the ends of the mini-batches on which the optimizer
stepped (``trainer.global_step`` moved: with ``accumulate_grad_batches`` never between the
accumulated batches; manual optimization too), and ``Job.step`` is ``global_step``, the name
of each checkpoint. Two optimizer steps are not safe points, so that a resume never differs
from the run it continues: the one that ends an epoch (Lightning would resume in the next
epoch, whose data order is drawn before any callback hook could restore the random state) and
one that validation follows (Lightning would resume past that validation, skipping it).
An epoch of no more batches than ``accumulate_grad_batches`` thus has no safe point.

What is exact, beyond Lightning's own rules:

- Random state: the torch CPU (and CUDA, on a GPU), Python ``random`` and NumPy states of
  every rank are in the checkpoint (gathered to the writing rank); each rank restores its
  own at the first mini-batch of the resumed run, so dropout draws what the uninterrupted run
  draws. A rank that the checkpoint has no state for (the job was resized) keeps its own.
- Mid-epoch data with a plain ``DataLoader`` (a map-style dataset, a ``BatchSampler``, no
  workers), shuffled or not, and with the ``DistributedSampler`` Lightning puts in under DDP:
  the loader's sampler is wrapped; it keeps the torch random state at which each epoch's order
  was drawn, and a resumed epoch draws the same order and skips the indices of the batches
  Lightning counts as done, without loading their data (Lightning itself restarts a plain
  loader's epoch from its beginning). A resumable loader (``state_dict``/``load_state_dict``,
  e.g. torchdata's ``StatefulDataLoader``) is left to Lightning, which resumes it itself.

Limits that remain: a loader with workers (``num_workers > 0``) is not wrapped (its order is
drawn when the epoch's iterator starts its workers, before any hook: Lightning's rule applies,
and its worker seeds differ anyway); nor an iterable dataset or a custom batch sampler.
Draws from the global random state while loading data (random augmentations in the main
process) or in epoch-start hooks are not replayed, and loaders reloaded every n epochs are
not wrapped. A
resize changes a ``DistributedSampler``'s split, so the resumed epoch is not the same. In a
gang, time-based validation (``val_check_interval`` as a duration) is not consulted (each
rank's clock would pick its own safe point): a resume may skip the validation then due.

Checkpoints are Lightning's ``.ckpt`` format, written by ``Trainer.save_checkpoint`` on every
rank (Lightning's strategy picks the writer) and committed by rank 0 under the job library's
name and checksum (``gandiva.job.checkpoint``): a ``.ckpt`` that ``torch.load`` and
``Trainer.fit(ckpt_path=...)`` open anywhere, and that gandiva moves between nodes as any.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import random
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import gandiva.job as gj
from gandiva.job import checkpoint

PACKAGES = ("lightning.pytorch", "pytorch_lightning")

# Lightning's words when fit() takes "last" from a fault-tolerance callback and when there is
# no checkpoint yet: both are the expected case under gandiva, not the user's mistake
for _message in (r".*ckpt_path=None.*was called without a model",
                 r".*ckpt_path=\"last\".*no last checkpoint available",
                 r".*ckpt_path='last'.*no last checkpoint available"):
    warnings.filterwarnings("ignore", message=_message)
# ...and its warning on a mid-epoch resume of a plain loader, which is not true of one whose
# sampler is wrapped here (set once every train loader is)
_NOT_RESUMABLE = r"You're resuming from a checkpoint that ended before the epoch ended"


def callbacks() -> list[Any]:
    """``lightning.pytorch``'s entry point: a callback for every ``Trainer`` of a job run by
    gandiva (or run alone with a checkpoint directory); none otherwise."""
    return _for_job("lightning.pytorch")


def pytorch_lightning_callbacks() -> list[Any]:
    """``pytorch_lightning``'s entry point, as ``callbacks``."""
    return _for_job("pytorch_lightning")


def _for_job(package: str) -> list[Any]:
    if "GANDIVA_JOB_ID" in os.environ or "GANDIVA_CHECKPOINT_DIR" in os.environ:
        return [callback_class(package)()]
    return []


@functools.cache
def callback_class(package: str) -> type:
    """The callback for ``package`` (one of ``PACKAGES``): a subclass of that package's
    ``OnExceptionCheckpoint``, since each package's ``Trainer`` accepts only its own
    callbacks. Imports the package."""
    if package not in PACKAGES:
        raise ValueError(f"not a Lightning package: {package!r}; one of {PACKAGES}")
    base = importlib.import_module(f"{package}.callbacks").OnExceptionCheckpoint
    return type("GandivaCallback", (_Steering, base),
                {"__module__": __name__, "__qualname__": "GandivaCallback",
                 "__doc__": f"gandiva's callback for {package}: see the module's doc."})


def __getattr__(name: str) -> Any:
    # GandivaCallback (lightning.pytorch's) without importing Lightning with this module
    if name == "GandivaCallback":
        return callback_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# what mypy checks _Steering against: the base ``callback_class`` adds when it builds the
# callback (either package's OnExceptionCheckpoint; the two are alike)
if TYPE_CHECKING:
    from lightning.pytorch.callbacks import OnExceptionCheckpoint as _Base
else:
    _Base = object


class _Steering(_Base):
    """The callback's hooks, the same for both packages (``callback_class`` adds the base)."""

    def __init__(self) -> None:
        self.job = gj.init()
        directory = self.job.checkpoint_dir
        super().__init__(dirpath=directory or Path.cwd(), filename="gandiva")
        self.active = False
        self.trainer: Any = None
        self.samplers: list[ResumableSampler | None] = []
        self.seen_step = 0  # global_step at the last mini-batch's end
        self.loaded: dict[str, Any] | None = None  # this rank's state from the checkpoint

    @property
    def ckpt_path(self) -> str | None:  # type: ignore[override]
        """The newest whole checkpoint, which ``Trainer.fit`` restores (see module doc)."""
        if self.job.checkpoint_dir is None:
            return None
        found = checkpoint.newest_whole(self.job.checkpoint_dir)
        return str(found[1]) if found else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # one callback steers the job, if a script also added its own
        mine = [cb for cb in trainer.callbacks if isinstance(cb, _Steering)]
        self.active = stage == "fit" and mine[0] is self
        if self.active:
            self.trainer = trainer
            self.job.distributed()  # Lightning's strategy made the group: adopt it
            self.job.writer = trainer.save_checkpoint

    def on_train_start(self, trainer, pl_module) -> None:
        if not self.active:
            return
        restored = _step_of(trainer.ckpt_path)
        if restored is not None:
            self.job.restored(restored)
        self.seen_step = trainer.global_step
        reloaded = getattr(trainer, "reload_dataloaders_every_n_epochs", 0)  # not ours then
        self.samplers = ([] if reloaded else
                         [self._wrap(i, loader) for i, loader in enumerate(_loaders(trainer))])
        if self.samplers and all(self.samplers):
            warnings.filterwarnings("ignore", message=_NOT_RESUMABLE)
        self.job.register(model=pl_module,
                          **{f"optimizer{i}": opt for i, opt in enumerate(trainer.optimizers)})
        self.job.started()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.active and self.loaded is not None:
            # the last draws before the step (on the device the strategy trains on: the
            # module's own says where it is now, the host while suspended)
            _set_rng(self.loaded["rng"], trainer.strategy.root_device)
            self.loaded = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.active:
            return
        stepped = trainer.global_step != self.seen_step
        self.seen_step = trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        metrics = {"loss": float(loss)} if torch.is_tensor(loss) and loss.numel() == 1 else {}
        # the optimizer step this mini-batch belongs to, counted from 1
        at = trainer.global_step + (0 if stepped else 1)
        self.job.report(samples=_batch_size(batch), at=at, **metrics)
        if stepped and _safe(trainer):
            self.job.boundary(step=trainer.global_step)

    def on_validation_batch_end(self, trainer, pl_module, *_: Any, **__: Any) -> None:
        if self.active:  # a suspend need not wait for the validation's end
            self.job.pause_point(collective=True)  # (every rank validates alike)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.active:
            self.job.step = trainer.global_step  # the final checkpoint's name
            self.job.finish()

    def on_exception(self, trainer, *_: Any, **__: Any) -> None:
        """Save nothing: a crash mid-step leaves no safe point; the job restarts from its
        last checkpoint (OnExceptionCheckpoint would save the half-done state)."""

    def teardown(self, trainer, *_: Any, **__: Any) -> None:
        """Keep the checkpoints (OnExceptionCheckpoint deletes its file here)."""

    # ---- what the checkpoint holds beyond Lightning's own ---------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every rank's random state and epoch order (Lightning calls this on every rank and
        writes rank 0's, so the ranks' are gathered here)."""
        if not self.active:
            return {}
        device = self.trainer.strategy.root_device  # (the module is on the host if suspended)
        mine = {"rng": _rng(device), "epoch": self.trainer.current_epoch,
                "orders": [s.order_rng if s else None for s in self.samplers]}
        return {"ranks": _gather(mine)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state.get("ranks", [])
        rank = self.trainer.global_rank if self.trainer is not None else self.job.rank
        self.loaded = dict(ranks[rank]) if rank < len(ranks) else None

    # ---- data order -------------------------------------------------------------------------
    def _wrap(self, index: int, loader: Any) -> ResumableSampler | None:
        """Wrap ``loader``'s sampler if replaying its order is exact (see the module doc)."""
        from torch.utils.data import BatchSampler, DataLoader, IterableDataset

        batches = getattr(loader, "batch_sampler", None)
        if (not isinstance(loader, DataLoader) or loader.num_workers
                or hasattr(loader, "load_state_dict")  # Lightning resumes it itself
                or isinstance(loader.dataset, IterableDataset)
                or not isinstance(batches, BatchSampler)):
            return None
        if not isinstance(batches.sampler, ResumableSampler):
            batches.sampler = ResumableSampler(batches.sampler)
        batches.sampler.plan = functools.partial(self._replay, index, batches.batch_size)
        return batches.sampler

    def _replay(self, index: int, batch_size: int) -> tuple[torch.Tensor, int] | None:
        """For a resumed epoch: the random state its order was drawn from, and how many
        indices the batches Lightning counts as done took; None for a new epoch."""
        loaded = self.loaded
        if loaded is None or loaded["epoch"] != self.trainer.current_epoch:
            return None
        orders = loaded["orders"]
        order, orders[index] = (orders[index] if index < len(orders) else None), None
        if order is None:
            return None
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.ready
        return order, done * batch_size


class ResumableSampler:
    """A sampler that remembers the torch random state each of its epochs drew its order
    from, and can draw an epoch's order again from it, beginning after the indices already
    done: what makes a plain ``DataLoader`` resume mid-epoch. ``plan`` says, as an epoch
    begins, whether it is a resumed one (the state and how many indices to skip)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.order_rng: torch.Tensor | None = None
        self.plan: Callable[[], tuple[torch.Tensor, int] | None] = lambda: None

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name == "sampler":  # not set yet (copying): no recursion
            raise AttributeError(name)
        return getattr(self.sampler, name)  # set_epoch, and what else a sampler offers

    def __iter__(self):
        replay = self.plan()
        if replay is None:
            self.order_rng = torch.get_rng_state()
            return iter(self.sampler)
        self.order_rng, skip = replay
        now = torch.get_rng_state()
        torch.set_rng_state(self.order_rng)
        # take one index more than the skipped: a lazy sampler (RandomSampler) draws its
        # order at its first index, which must come from the epoch's state
        order = iter(self.sampler)
        head = list(itertools.islice(order, skip + 1))[skip:]
        torch.set_rng_state(now)
        return itertools.chain(head, order)


def _loaders(trainer) -> list[Any]:
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    return list(getattr(combined, "flattened", None) or [])


def _safe(trainer) -> bool:
    """Whether the end of this mini-batch, after an optimizer step, is a safe point: not the
    end of the epoch, and no validation next (see the module doc)."""
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress
    if progress.is_last_batch or progress.current.ready >= trainer.num_training_batches:
        return False
    if trainer.world_size > 1 and getattr(trainer, "_val_check_time_interval", None):
        return True  # each rank's clock decides: ranks would disagree on the safe point
    try:
        return not loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
    except (AttributeError, TypeError):  # another Lightning's internals: no validation known
        return True


def _rng(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if "numpy" in sys.modules:  # as plain numbers: Lightning loads with weights_only
        name, keys, pos, has_gauss, gauss = sys.modules["numpy"].random.get_state()
        state["numpy"] = (str(name), keys.tolist(), int(pos), int(has_gauss), float(gauss))
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _gather(mine: Any) -> list[Any]:
    """``mine`` from every rank, in rank order (just ``[mine]`` alone)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


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
