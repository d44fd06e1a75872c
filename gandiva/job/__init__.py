"""The job library: what a training script imports.

    import gandiva.job as gj

    job = gj.init()                                  # torchrun-style env: RANK, WORLD_SIZE...
    model = Net().to(job.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.register(model=model, optimizer=opt)         # anything with state_dict/load_state_dict
    for step in job.steps(1000):                     # restores the latest checkpoint first
        loss = train_one_batch(model, opt, batch(step))
        job.report(samples=64, loss=loss.item())

The script owns what is in its state; the scheduler owns where and when it runs. Each pass
through ``steps`` is a mini-batch boundary, a safe point: the job checks its control channel
(without blocking: microseconds) and obeys the agent:

- ``suspend``: move the registered state to host memory, free what device memory can be
  freed (the caching allocator's blocks, cuBLAS workspaces), report what the process still
  holds (NVML: its CUDA context and what the script keeps), block; ``resume`` on the same
  device. A job moved to other devices is restarted from a checkpoint there (see the agent),
  unless its loop reads ``job.device`` at every step and says so: ``steps(n, in_place=True)``;
- ``limit``: keep the caching allocator within a cap (a job packed with another on a GPU);
- ``checkpoint``: write the state atomically to the job's checkpoint directory, then go on or
  exit (migration, preemption, resize);
- it reports mini-batch time, samples/s and memory, batched to one message a second.

The data position is the step: a script draws its batch ``step`` from it (see ``examples/``),
so that a job restored at step k sees exactly the batches an uninterrupted run sees. The RNG
states (torch, Python, NumPy) travel in the checkpoint too.

In a gang, the ranks act at the same boundary: they agree through one small all-reduce on a
CPU-capable group (``distributed``), at most every ``AGREE_EVERY_S``. A script that makes its
own process group (torchrun style) keeps it: the library adopts it.

Loops that are not ours (Lightning, the HF Trainer: ``gandiva.job.integrations``) call
``started``, ``boundary`` (or ``next_command`` and ``obey``) and ``finish`` from the
framework's hooks, and checkpoint through the framework's own save (``writer``). An
evaluation loop calls ``pause_point`` at each of its batches, so that a suspend does not wait
for the evaluation's end.

Without an agent (no ``GANDIVA_CONTROL_FD``), the same script runs on its own; it still
checkpoints to ``GANDIVA_CHECKPOINT_DIR`` and restores from it, if that is set.
"""

from __future__ import annotations

import math
import os
import random
import resource
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from gandiva.job import checkpoint, nvml, wire

# What a process holds of its GPU outside its caching allocator before that can be measured
# (a memory cap may come before its first CUDA call): a CUDA context with lazy module
# loading takes 0.3 to 0.6 GB on current GPUs; a cap allows for this much at least.
CONTEXT_GB = 0.5
REPORT_INTERVAL_S = 1.0  # profile messages are batched: one a second at most...
# ...but after a start or a resume, the first windows are shorter (this, then twice this, up
# to REPORT_INTERVAL_S): what a turn's first mini-batches show reaches the scheduler, and a
# sweep judging a trial at its first rung, in a quarter of a second rather than one. Two more
# messages a turn.
FIRST_WINDOW_S = 0.25
# between boundaries (evaluation batches, a checkpoint written) the job says it is alive this
# often, far inside the agent's hang limit (gandiva.node.agent.HANG_S; an agent sets a tenth
# of its own in GANDIVA_ALIVE_EVERY_S)
ALIVE_EVERY_S = 60.0
# Before its first boundary (loading, compiling, autotuning: minutes where no boundary comes)
# a job says it is alive from a thread of its own, for at most this long: a first
# mini-batch that never ends (a deadlocked first all-reduce) is still a hang after it
FIRST_BOUNDARY_S = 3600.0
# Every value ``report`` is given is kept by step and sent with the next profile message;
# a window keeps at most this many points of a metric, evenly spaced by step, the last one
# always (a job reporting its loss at every one of 1,000 mini-batches a second sends 64
# of them: a learning curve's shape, at a store write cost that does not grow with speed)
POINTS_PER_WINDOW = 64
# A gang agrees on commands (one all-reduce, ~1 ms through gloo on 2 cores) at the first
# boundary this long after the last agreement, counted in mini-batches so every rank picks
# the same one: a command waits at most this much longer (nothing, against a 60 s quantum),
# and the all-reduce costs at most ~2% of any mini-batch (benchmarks/boundary_cost.py)
AGREE_EVERY_S = 0.05
AGREE_MAX_STEPS = 1000


class Job:
    """This process's view of its job (one rank of it)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.id = env.get("GANDIVA_JOB_ID", "standalone")
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.threads = int(env.get("GANDIVA_THREADS", "1"))
        ckpt = env.get("GANDIVA_CHECKPOINT_DIR")
        self.checkpoint_dir = Path(ckpt) if ckpt else None
        self.checkpoint_every_s = float(env.get("GANDIVA_CHECKPOINT_EVERY_S", "300"))
        self.alive_every_s = float(env.get("GANDIVA_ALIVE_EVERY_S", ALIVE_EVERY_S))
        self.checkpoints_refused = 0  # checkpoints the disk refused (``_refused``)
        self._alive_at = 0.0  # when the agent was last told the job is alive (``_alive``)
        self.objects: dict[str, Any] = {}
        self.step = 0
        self.restored_from: int | None = None
        self.metrics: dict[str, float] = {}
        self._points: dict[str, dict[int, float]] = {}  # metric -> step -> value, unsent
        self._sock: socket.socket | None = None
        self._sending = threading.Lock()  # one line on the channel at a time
        self._first_boundary = threading.Event()
        self._buf = b""
        fd = env.get("GANDIVA_CONTROL_FD")
        if fd is not None:
            self._sock = socket.socket(fileno=int(fd))
            self._sock.setblocking(False)
        # the cores this process may use, before it pins itself to its slot's share of them
        self._cores = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                       else [])
        # GPUs that are CPU slots underneath (the agent's ``cpu_backed``: tests without GPUs)
        self._cpu_backed = env.get("GANDIVA_CPU_BACKED") == "1"
        # what such a stand-in GPU is to say the process holds while suspended (NVML's
        # part), "unknown" as NVML in a container says nothing
        said = env.get("GANDIVA_CPU_BACKED_HELD_GB", "0")
        self._stand_in_held_gb = None if said == "unknown" else float(said)
        self.in_place = False  # the loop reads job.device at every step (see ``steps``)
        self.memory_cap_gb: float | None = None  # the agent's cap while packed (``limit``)
        self._peak_gb = 0.0
        self._deferred: wire.Checkpoint | None = None  # came at a pause point: see there
        self._asleep = False  # suspended: the registered state is in host memory
        self.device = self._use_device(env.get("GANDIVA_DEVICE", "cpu"))
        try:  # started beside another job on its GPU: capped before its first allocation
            cap = float(env["GANDIVA_MEMORY_CAP_GB"])
        except (KeyError, ValueError):
            cap = math.nan
        if math.isfinite(cap) and cap >= 0:
            self.limit(cap)
        self._pg: Any = None  # torch.distributed, once the gang's group exists
        self._collective_timeout_s: float | None = None  # its group's (see ``distributed``)
        self._control: Any = None  # the group ranks agree through (None: the default group)
        # how a framework writes its own checkpoint (every rank calls it; see ``save``)
        self.writer: Callable[[Path], None] | None = None
        if self.world_size <= 1:
            self._hello()  # (a gang's ranks say it once they have met: see ``distributed``)
        if self._sock is not None:
            threading.Thread(target=self._alive_until_first_boundary, daemon=True,
                             name="gandiva-alive").start()
        self._new_window(first=True)
        self._last_ckpt = time.monotonic()
        self._steps = _Cadence()  # when a gang's ranks agree at training boundaries...
        self._pauses = _Cadence()  # ...and at the pause points of collective evaluations

    # ---- devices ------------------------------------------------------------------------
    def _use_device(self, name: str):
        """``cuda:N`` (a GPU), or ``cpu:S``: CPU slot S, standing in for a GPU, i.e. this
        process pinned to ``threads`` cores of its own."""
        import torch

        kind, _, index = name.partition(":")
        torch.set_num_threads(self.threads)  # torch's pool was sized before (a warm start)
        if kind == "cuda" and not self._cpu_backed:
            torch.cuda.set_device(int(index or 0))
            return torch.device("cuda", int(index or 0))
        if kind == "cuda":
            return torch.device("cpu")
        if index and self._cores:
            first = int(index) * self.threads
            cores = self._cores
            os.sched_setaffinity(0, {cores[(first + i) % len(cores)] for i in range(self.threads)})
        return torch.device("cpu")

    def distributed(self) -> None:
        """Join the gang's process group: the script's own, if it made one (a torchrun
        script calls ``init_process_group`` itself), else one made here. Commands are
        agreed on through a group that works on CPU tensors: the default group if it has
        gloo (``"cpu:gloo,cuda:nccl"``, what this makes on GPUs), else a gloo group beside
        the script's NCCL one. Called by ``steps`` and the integrations, on every rank."""
        if self._pg is not None:
            return
        import torch.distributed as dist

        if self.world_size <= 1 and not dist.is_initialized():
            return  # alone, and no group of the script's: nothing to agree with
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        if not _cpu_capable(str(dist.get_backend())):
            self._control = dist.new_group(backend="gloo")
        self._pg = dist
        self._collective_timeout_s = _group_timeout_s(dist)
        if self.world_size > 1:
            self._hello()

    def barrier(self) -> None:
        """Every rank of the gang meets here (through the control group); alone: nothing."""
        if self._pg is not None:
            self._pg.barrier(group=self._control)

    def gather(self, mine: Any) -> list[Any] | None:
        """Every rank's ``mine`` (a picklable object), in rank order, at rank 0; None at the
        others. Alone: ``[mine]``."""
        if self._pg is None:
            return [mine]
        into = [None] * self.world_size if self.rank == 0 else None
        self._pg.gather_object(mine, into, dst=0, group=self._control)
        return into

    def _hello(self) -> None:
        """Tell the agent this rank obeys commands at its boundaries. Decision: a gang's
        ranks say so only once the gang has met, so that the agent never has some of them
        obeying and others (still meeting) stopped by signal."""
        self._send(wire.Hello(os.getpid(), self.rank))

    # ---- state --------------------------------------------------------------------------
    def register(self, **objects: Any) -> None:
        """Name what makes up the job's state: objects with ``state_dict``/``load_state_dict``."""
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"register({name}=...): {type(obj).__name__} has no "
                                "state_dict/load_state_dict; wrap it in an object that has")
            self.objects[name] = obj

    def state(self) -> dict[str, Any]:
        import torch

        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if "numpy" in sys.modules:
            rng["numpy"] = sys.modules["numpy"].random.get_state()
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        return {"step": self.step, "world_size": self.world_size, "rng": rng,
                "objects": {k: o.state_dict() for k, o in self.objects.items()}}

    def load(self, state: dict[str, Any]) -> None:
        import torch

        missing = set(self.objects) - set(state["objects"])
        if missing:
            raise ValueError(f"checkpoint has no state for {sorted(missing)}; was the script "
                             "changed to register other objects?")
        for name, obj in self.objects.items():
            obj.load_state_dict(state["objects"][name])
        self.step = int(state["step"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "numpy" in rng and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(rng["numpy"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"])

    def restore(self) -> int | None:
        """Load the newest whole checkpoint, if any; the step it was taken at."""
        if self.checkpoint_dir is None:
            return None
        found = checkpoint.latest(self.checkpoint_dir)
        if found is None:
            return None
        self.load(found[1])
        self.restored(found[0])
        return found[0]

    def restored(self, step: int) -> None:
        """The job goes on from its checkpoint of ``step`` (restored here or by a framework)."""
        self.step = self.restored_from = step
        print(f"gandiva: restored from checkpoint at step {step}", file=sys.stderr, flush=True)

    def save(self) -> Path | None:
        """Write a checkpoint of this step: the registered state (rank 0 writes it), or
        through ``writer``, a framework's own save, which every rank calls (the framework
        decides which rank writes). Rank 0 then commits it; the others wait for that."""
        path = None
        directory = self.checkpoint_dir
        self._alive()  # a big checkpoint may take minutes to write
        if directory is not None and self.writer is not None:
            if self._pg is not None:  # what each rank writes for the framework is written
                self._pg.barrier(group=self._control)
            try:
                scratch = checkpoint.scratch(directory, self.step, self.writer)
                if self.rank == 0:
                    path = checkpoint.commit(directory, self.step, scratch)
            except checkpoint.CheckpointError as e:
                self._refused(e)
        elif directory is not None and self.rank == 0:
            try:
                path = checkpoint.save(directory, self.step, self.state())
            except checkpoint.CheckpointError as e:
                self._refused(e)
        if self._pg is not None:
            self._pg.barrier(group=self._control)
        self._last_ckpt = time.monotonic()
        return path

    def _alive(self) -> None:
        """Tell the agent, at most every ``alive_every_s``, that the job is not stuck though
        it is not at a boundary (an evaluation, a checkpoint being written)."""
        now = time.monotonic()
        if self._sock is not None and now - self._alive_at >= self.alive_every_s:
            self._alive_at = now
            self._send(wire.Alive(self.step))

    def _refused(self, e: BaseException) -> None:
        """A checkpoint the disk refused fails alone: the job goes on, its newest checkpoint
        stays the one to restart from, and its log says so (the next try is a cadence
        later, not at every boundary)."""
        self.checkpoints_refused += 1
        newest = checkpoint.steps(self.checkpoint_dir) if self.checkpoint_dir else []
        kept = f"step {newest[0]}" if newest else "none"
        why = f"checkpoint of step {self.step} failed ({e}); training goes on, the newest "
        why += f"checkpoint is {kept}"
        self._send(wire.CheckpointRefused(self.step, why))
        try:
            print(f"gandiva: {why}", file=sys.stderr, flush=True)
        except OSError:
            pass  # the log is on the disk that refused: the agent has been told

    # ---- data parallelism that survives resizing ------------------------------------------
    def shards(self, count: int) -> range:
        """Which of the ``count`` fixed shards of a global batch this rank computes."""
        return range(self.rank, count, self.world_size)

    def sum_shards(self, parts: dict[int, Any], count: int):
        """The sum over all ranks of per-shard tensors (``parts``: shard -> tensor), added in
        shard order. Unlike an all-reduce, whose order depends on the number of ranks, this
        gives bit-identical results at any width: what makes grow and shrink exact."""
        import torch

        mine = [parts[s] for s in self.shards(count)]
        if self._pg is None:
            ordered = mine
        else:
            per_rank = -(-count // self.world_size)
            local = torch.zeros(per_rank, *mine[0].shape, dtype=mine[0].dtype,
                                device=mine[0].device)
            for i, t in enumerate(mine):
                local[i] = t
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            self._pg.all_gather(gathered, local)
            ordered = [gathered[s % self.world_size][s // self.world_size] for s in range(count)]
        total = ordered[0].clone()
        for t in ordered[1:]:
            total += t
        return total

    # ---- the loop -----------------------------------------------------------------------
    def steps(self, total: int, in_place: bool = False) -> Iterator[int]:
        """Mini-batch indices from the restored step to ``total``; a safe point between each.
        ``in_place``: the loop reads ``job.device`` at every step (nothing of the state is
        bound to a device elsewhere), so the job may be moved to another GPU without a
        restart; otherwise a move restarts it from a checkpoint of the step it is at."""
        self.in_place = in_place
        self.distributed()
        self.restore()
        self.started()
        while self.step < total:
            yield self.step
            self.boundary()
        self.finish()

    # what ``steps`` does, for loops that are not ours (the framework integrations)
    def started(self) -> None:
        """Training begins (after any restore): the agent may steer the job from here on."""
        self._send(wire.Started(self.step, self.restored_from, self.in_place))

    def boundary(self, step: int | None = None) -> None:
        """A mini-batch has ended: a safe point, where the job obeys the agent. ``step``: the
        steps done now, where a framework counts them itself (else one more than before)."""
        command = self.next_command(step)
        while command is not None:
            command = self.obey(command)

    def finish(self, save: bool = True) -> None:
        """Training is over: report, take the final checkpoint (unless the caller just
        did), say done."""
        self._flush_report(force=True)
        if save and self.checkpoint_dir is not None:
            self.save()
        self._send(wire.Done(self.step))

    def report(self, samples: int = 0, *, at: int | None = None, **metrics: float) -> None:
        """Count ``samples`` for the throughput and record ``metrics`` (e.g. loss) as
        measured ``at`` a step: by default the mini-batch under way, counted from 1 (call it
        before the mini-batch's boundary, as ``steps`` loops do); a framework that reports
        after its step counter moved passes its own. The latest value of each is
        ``metrics``; each value goes to the server as a point of the metric's series."""
        self._window_samples += samples
        step = self.step + 1 if at is None else int(at)
        for name, value in metrics.items():
            value = float(value)
            self.metrics[name] = value
            self._points.setdefault(name, {})[step] = value  # a step's latest value

    def next_command(self, step: int | None = None) -> wire.Command | None:
        """Count the mini-batch that just ended (``step``: the steps done now, if the caller
        counts them), and say what the job must do at this boundary (the same on every
        rank), if anything: the agent's command, or a periodic checkpoint. ``boundary``
        obeys it at once; an integration whose framework must write the checkpoint itself
        obeys it once the framework has (see ``hf``)."""
        self.step = self.step + 1 if step is None else step
        self._first_boundary.set()
        self._window_steps += 1
        self._flush_report()
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            return deferred
        self._steps.count = self.step
        if self._pg is not None and self._steps.count < self._steps.at:
            return None  # a gang acts at agreed boundaries only (see AGREE_EVERY_S)
        command = self._poll()
        due = time.monotonic() - self._last_ckpt >= self.checkpoint_every_s
        if self._pg is not None:  # the ranks of a gang act at the same boundary
            command, due = self._agree(command, due, self._steps)
        if command is None and due:
            command = wire.Checkpoint(periodic=True)
        return command

    def pause_point(self, collective: bool = False) -> None:
        """A point between training steps that is not a boundary (the end of an evaluation
        batch): the job obeys a suspend here at once, rather than after the whole evaluation
        (or by signal, mid-collective, after the agent's wait). A checkpoint waits for the
        next boundary, the one point whose state a restore can go on from. A gang's ranks
        act at the same point, so they agree here as at boundaries: only where the caller
        says every rank passes these points alike (``collective``: Lightning's and the HF
        Trainer's evaluations, whose distributed samplers give each rank as many batches);
        elsewhere a gang does nothing here, since an evaluation of a script's own may run
        on some ranks only."""
        self._alive()
        if self._pg is not None or self.world_size > 1:
            if self._pg is None or not collective:
                return
            self._pauses.count += 1
            if self._pauses.count < self._pauses.at:
                return
            command, _ = self._agree(self._poll(), False, self._pauses)
        else:
            command = self._poll()
        while command is not None:
            if isinstance(command, wire.Checkpoint):
                self.wake()  # (it came instead of a resume): the evaluation goes on first
                self._deferred = command
                return
            command = self.obey(command)

    def obey(self, command: wire.Command) -> wire.Command | None:
        """Carry out ``command``; the next one, if the agent sent it while the job waited
        (a suspended job may be told to checkpoint and stop instead of resuming)."""
        if isinstance(command, wire.Checkpoint):
            path = self.save()
            if not command.periodic:
                self._send(wire.Checkpointed(self.step, str(path) if path else None))
            if command.exit:
                self.exit()
            return None
        if isinstance(command, wire.Resume):  # one that crossed a signal-based suspend
            return None  # (already running)
        if isinstance(command, wire.Suspend):
            # what this turn measured goes out now, not after the next turn's first second:
            # with short turns, a sweep would otherwise judge trials a turn late
            self._flush_report(force=True)
            t0 = time.perf_counter()
            self._to("cpu")
            self._asleep = True
            held = (nvml.held_gb() if self.device.type == "cuda"
                    else self._stand_in_held_gb if self._cpu_backed else 0.0)
            self._send(wire.Suspended(self.step, time.perf_counter() - t0, held))
            command = self._wait()  # blocked until the agent says what next
            if isinstance(command, wire.Resume):
                t0 = time.perf_counter()
                old = self.device
                self.device = self._use_device(command.device)
                if old.type == self.device.type == "cuda" and old != self.device:
                    _carry_cuda_rng(old, self.device)
                if self.memory_cap_gb is not None:  # (a cap is per device: the new one's)
                    self.limit(self.memory_cap_gb)
                self.wake()
                self._send(wire.Resumed(self.step, command.device, time.perf_counter() - t0))
                self._new_window(first=True)
                return None
            return command
        raise ValueError(f"unknown command {command!r}")

    def wake(self) -> None:
        """Put the registered state back on the device after a suspend that ended in a
        checkpoint the caller does not take at once (a framework that writes it at its next
        safe point, after work that needs the model where it trains); else nothing."""
        if self._asleep:
            self._to(self.device)
            self._asleep = False

    def limit(self, memory_gb: float | None) -> None:
        """Keep this process within ``memory_gb`` of its GPU as the driver counts it (None:
        the whole GPU): its caching allocator gets the cap less what the process holds
        outside it (``outside_gb``), applied again at every profile as that grows. Past
        it, an allocation raises ``torch.OutOfMemoryError`` in this job only; its partner's
        memory is never taken."""
        self.memory_cap_gb = memory_gb
        if self.device.type == "cuda":
            self._bind_allocator(None if memory_gb is None else nvml.held_gb())

    def _bind_allocator(self, held: float | None) -> None:
        """Set the caching allocator's share for ``memory_cap_gb``, ``held`` being NVML's
        reading of this process (None: unknown)."""
        import torch

        cap = self.memory_cap_gb
        total = torch.cuda.get_device_properties(self.device).total_memory / 2**30
        fraction = 1.0 if cap is None else allocator_fraction(cap, self.outside_gb(held), total)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)

    def outside_gb(self, held: float | None) -> float:
        """What this process holds of its GPU outside the caching allocator (its CUDA
        context, NCCL's buffers, cuBLAS' handles), NVML reading ``held`` of it: that less
        the allocator's reserve, at least a context's (CONTEXT_GB), the most NVML cannot
        tell (``held`` None)."""
        import torch

        inside = (torch.cuda.memory_reserved(self.device) / 2**30
                  if torch.cuda.is_initialized() else 0.0)
        return CONTEXT_GB if held is None else max(CONTEXT_GB, held - inside)

    def _to(self, device) -> None:
        """Move the registered state between the device and host memory: modules, then
        each optimizer's state as ``load_state_dict`` places it beside its parameters
        (``step`` with them for fused and capturable optimizers, on the CPU otherwise)."""
        import torch

        if self.device.type != "cuda":
            return  # CPU slots: the state is in host memory already
        for obj in self.objects.values():
            if isinstance(obj, torch.nn.Module):
                obj.to(device)
        for obj in self.objects.values():
            if not (isinstance(obj, torch.optim.Optimizer) and obj.state):
                continue
            if type(obj).state_dict is torch.optim.Optimizer.state_dict:
                obj.load_state_dict(obj.state_dict())
            else:  # its own state_dict (ZeroRedundancyOptimizer's needs every rank): by hand
                for per_param in obj.state.values():
                    for k, v in per_param.items():
                        if torch.is_tensor(v) and k != "step":
                            per_param[k] = v.to(device)
        if str(device).startswith("cpu"):
            torch.cuda.synchronize()
            # the workspaces are the caching allocator's blocks: freed first, so that the
            # cache's emptying gives them back to the driver too
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()

    # ---- the channel --------------------------------------------------------------------
    def _send(self, message: wire.Report) -> None:
        if self._sock is None:
            return
        data = wire.encode(message)
        with self._sending:
            self._sock.setblocking(True)
            try:
                self._sock.sendall(data)
            except OSError:
                self._agent_gone()
            finally:
                self._sock.setblocking(False)

    def _alive_until_first_boundary(self) -> None:
        """Say the job is alive every ``alive_every_s`` until its first boundary, for at
        most ``FIRST_BOUNDARY_S`` (see there). The channel stays non-blocking here (the main
        thread may be reading it); a line is sent whole, under the sending lock."""
        deadline = time.monotonic() + FIRST_BOUNDARY_S
        while not self._first_boundary.wait(self.alive_every_s):
            if time.monotonic() > deadline or self._sock is None:
                return
            with self._sending:
                if self._first_boundary.is_set():
                    return
                rest = memoryview(wire.encode(wire.Alive(self.step)))
                try:
                    while rest:
                        try:
                            rest = rest[self._sock.send(rest):]
                        except BlockingIOError:  # (the agent reads: room comes)
                            select.select([], [self._sock], [], 1.0)
                except OSError:
                    return  # the agent is gone: the main thread finds out

    def _poll(self) -> wire.Command | None:
        """The agent's next command, if one has come. A memory cap (``Limit``) is this
        process's own affair: it is applied as it is read and never returned, so that it
        neither takes part in a gang's agreement nor ends a suspension."""
        if self._sock is None:
            return None
        while True:
            if b"\n" not in self._buf:
                try:
                    chunk = self._sock.recv(65536)
                except BlockingIOError:
                    return None
                except OSError:
                    self._agent_gone()
                if not chunk:
                    self._agent_gone()
                self._buf += chunk
            if b"\n" not in self._buf:
                return None
            line, self._buf = self._buf.split(b"\n", 1)
            command = wire.command(line)
            if not isinstance(command, wire.Limit):
                return command
            self.limit(command.memory_gb)

    def _wait(self) -> wire.Command:
        sock = self._sock
        if sock is None:  # commands come only from an agent
            raise RuntimeError("gandiva: no agent channel to wait for a command on")
        while True:
            command = self._poll()
            if command is not None:
                return command
            sock.setblocking(True)
            try:
                chunk = sock.recv(65536)
            finally:
                sock.setblocking(False)
            if not chunk:
                self._agent_gone()
            self._buf += chunk

    def _agree(self, command: wire.Command | None, due: bool,
               cadence: _Cadence) -> tuple[wire.Command | None, bool]:
        """All ranks act at the same point: if any rank has a command, all wait for theirs
        (the agent sends it to every rank); if any rank's checkpoint is due, all take it.
        ``cadence``: the points counted (boundaries or pause points) and when to agree next."""
        import torch

        per_step = ((time.perf_counter() - cadence.last_time)
                    / max(1, cadence.count - cadence.last_count))
        every = max(1, min(AGREE_MAX_STEPS, int(AGREE_EVERY_S / max(per_step, 1e-9))))
        # one MAX all-reduce: any rank's command, any rank's checkpoint due, and the
        # smallest proposed interval to the next agreement (as the max of its negation)
        flag = torch.tensor([command is not None, due, -every], dtype=torch.int32)
        self._pg.all_reduce(flag, op=self._pg.ReduceOp.MAX, group=self._control)
        pending, any_due, least = (int(v) for v in flag.tolist())
        if pending and command is None:
            command = self._wait()
        cadence.at = cadence.count + (1 if command is not None else -least)
        cadence.last_count, cadence.last_time = cadence.count, time.perf_counter()
        return command, bool(any_due)

    def exit(self) -> None:
        """Stop here, at once, after a checkpoint the agent asked for (no clean-up of the
        framework's: its state is in the checkpoint)."""
        self._close()
        os._exit(0)

    def _agent_gone(self) -> NoReturn:
        # the agent died: stop here; the work since the last checkpoint is what is lost
        print("gandiva: agent channel closed; exiting", file=sys.stderr)
        os._exit(3)

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def _flush_report(self, force: bool = False) -> None:
        now = time.perf_counter()
        elapsed = now - self._window_start
        if self._sock is None or not self._window_steps or (
                elapsed < self._window_s and not force):
            return
        cpu = time.process_time() - self._window_cpu
        self._send(wire.Profile(
            self.step, mini_batch_time=elapsed / self._window_steps,
            memory_gb=self._memory_gb(), utilization=self._utilization(cpu, elapsed),
            samples_per_s=self._window_samples / elapsed if elapsed else 0.0,
            metrics={k: v for k, v in self.metrics.items() if math.isfinite(v)},
            series=self._series(),  # (NaN and infinities left out of both: see _series)
            collective_timeout_s=self._collective_timeout_s))
        self._new_window(first=False)

    def _new_window(self, first: bool) -> None:
        """Start a profile window: short after a (re)start, then longer (FIRST_WINDOW_S)."""
        self._window_s: float = (FIRST_WINDOW_S if first
                                 else min(REPORT_INTERVAL_S, 2 * self._window_s))
        if first:  # (a span of utilisation starts anew: on its device, running)
            self._span = nvml.Span(time.time())
        self._window_start = time.perf_counter()
        self._window_steps = self._window_samples = 0
        self._window_cpu = time.process_time()

    def _series(self) -> dict[str, list[list[float]]]:
        """The points reported since the last message, at most POINTS_PER_WINDOW a metric
        (evenly thinned by position, the last kept); NaN and infinities are left out (JSON
        has no such numbers, and a diverged trial reports them)."""
        out = {}
        for name, points in self._points.items():
            kept = [[s, v] for s, v in sorted(points.items()) if math.isfinite(v)]
            if len(kept) > POINTS_PER_WINDOW:
                last = len(kept) - 1
                kept = [kept[last - round(i * last / (POINTS_PER_WINDOW - 1))]
                        for i in reversed(range(POINTS_PER_WINDOW))]
            if kept:
                out[name] = kept
        self._points = {}
        return out

    def _memory_gb(self) -> float:
        """The most device memory the process held so far: NVML's count (context, caching
        allocator's reserve) where it has one, else the allocator's own reserve."""
        import torch

        if self.device.type == "cuda":
            seen = nvml.held_gb()
            held = (seen if seen is not None
                    else torch.cuda.max_memory_reserved(self.device) / 2**30)
            self._peak_gb = max(self._peak_gb, held)
            if self.memory_cap_gb is not None:  # what it holds outside the allocator grew
                self._bind_allocator(seen)  # (from the same reading)
            return self._peak_gb
        # Linux reports ru_maxrss in KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    def _utilization(self, cpu_s: float, wall_s: float) -> float | None:
        """The share of the window this process computed: on a GPU, its own samples in
        NVML (not a packed partner's), over a span of at least the driver's sampling period
        (a shorter window says the last span's; None before the first: unknown, which the
        scheduler packs on memory alone); on CPU slots, its CPU time over its threads."""
        import torch

        if self.device.type == "cuda":
            uuid = f"GPU-{torch.cuda.get_device_properties(self.device).uuid}"
            return self._span.read(time.time(), lambda since: nvml.utilization(uuid, since))
        return min(1.0, cpu_s / (wall_s * self.threads)) if wall_s else 0.0


@dataclass
class _Cadence:
    """When a gang's ranks next agree, counted in points every rank passes alike (training
    boundaries, or pause points), so that every rank picks the same one."""

    count: int = 0  # points passed
    at: int = 0  # the point of the next agreement
    last_count: int = 0  # the point of the last one...
    last_time: float = field(default_factory=time.perf_counter)  # ...and when it was


def _cpu_capable(backend: str) -> bool:
    """Whether a process group of ``backend`` (e.g. ``nccl``, ``gloo``,
    ``cpu:gloo,cuda:nccl``) can all-reduce a CPU tensor."""
    return any(b in backend.lower() for b in ("gloo", "mpi"))


def _carry_cuda_rng(old: Any, new: Any) -> None:
    """A job moved in place from GPU ``old`` to ``new`` draws on from where its random
    stream was: each GPU has a generator of its own (the old one stays, unused, in the
    context the process keeps on the old GPU until it exits)."""
    import torch

    torch.cuda.set_rng_state(torch.cuda.get_rng_state(old), new)


def allocator_fraction(cap_gb: float, outside_gb: float, total_gb: float) -> float:
    """The share of a GPU of ``total_gb`` a caching allocator may reserve so that its
    process, holding ``outside_gb`` beside it, stays within ``cap_gb``."""
    return max(0.0, min(1.0, (cap_gb - outside_gb) / total_gb))


def _group_timeout_s(dist: Any) -> float | None:
    """The shortest collective timeout of the default process group's backends (10 min
    for NCCL, 30 for gloo unless the script said otherwise), if torch tells it."""
    import torch

    try:
        group = dist.distributed_c10d._get_default_group()
        return min(group._get_backend(torch.device(kind)).options._timeout.total_seconds()
                   for kind in group._device_types)
    except Exception:  # noqa: BLE001 - private API of torch's: if it moves, unknown
        return None


_job: Job | None = None


def init() -> Job:
    """This process's job, created on first call from the environment the agent set."""
    global _job
    if _job is None:
        _job = Job()
    return _job
