"""The node agent: runs job processes on this machine's devices and carries out actions.

One process per rank, each with a control channel (a socket pair) to the agent, its own log
file, and a torchrun-compatible environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT).
Devices are GPUs (``cuda``) or, on a machine without GPUs, CPU slots standing in for them.

A job that imports the job library says hello on its channel; the agent then suspends,
resumes, checkpoints and moves it through the library at mini-batch boundaries. A script that
never says hello is handled coarsely: SIGSTOP/SIGCONT for time-slicing, SIGTERM then SIGKILL
after a grace period for preemption.

A job whose process dies without being asked to (a crash, the OOM killer, SIGKILL) restarts
from its last checkpoint, up to ``max_restarts`` times, as torchrun does; after that it fails,
with its exit status and the end of its log as the reason. The agent itself never dies of a
job's failure.

Decision: on GPUs, every process of a job sees its job's GPUs and no others, the rank with
LOCAL_RANK r its own as ``cuda:r``, as under torchrun, so unmodified scripts use the right
one (a one-GPU script's ``cuda:0``, a torchrun script's ``cuda:LOCAL_RANK``), and the names
go through the agent's own CUDA_VISIBLE_DEVICES (see ``gandiva.node.devices``). A job moves
to other GPUs by a restart from a checkpoint of the step it stopped at: frameworks keep
their device in places the library cannot reach (Lightning's root device, HF's
``args.device``, DDP's ``device_ids``, fused optimizers' ``step``). Only a one-process job
that declared it reads ``job.device`` at every step (``Job.steps(in_place=True)``) moves in
place. A one-process job whose command is not torchrun gets no torchrun environment, as
when its user runs ``python script.py`` (HF's Trainer would wrap it in DDP otherwise).
"""

from __future__ import annotations

import os
import queue
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gandiva.backends.nodes import AgentEvent, Launch
from gandiva.job import checkpoint, nvml, wire
from gandiva.job.warm import OUT_OF_MEMORY
from gandiva.node import accounts, cgroups, environment, torchrun
from gandiva.node import devices as gpus
from gandiva.node.accounts import Account
from gandiva.node.zygote import Forked, Zygote, warm_compatible

MAX_RESTARTS = 3  # torchrun's --max-restarts: enough for a transient fault, not a crash loop
ACK_TIMEOUT_S = 60.0  # a suspend waits for the next mini-batch boundary at most this long
GRACE_S = 10.0  # SIGTERM before SIGKILL, for scripts that save on SIGTERM
# Once a gang's rank 0 has ended well, the others have this long to end too: the ranks of a
# data-parallel job end together, up to a final save; past it, one is hung (in a collective,
# or at exit) and the job would hold its devices for ever
EXIT_GRACE_S = 60.0
# ...but ranks that said their training was over (the library's Done) and sit on in the
# interpreter's teardown this long are hung on the way out (a gloo group's destructor that
# waits for a thread that waits for the GIL): they are killed, counted, and the job is done
TEARDOWN_GRACE_S = 10.0
# A running job of the library reports at its mini-batch boundaries (every second at most);
# one that has said nothing for this long is hung (a rank stuck in a collective holds every
# rank of its gang there) and is killed and restarted from its checkpoint, as after a crash.
# Ten minutes: far above a mini-batch, below the hours a hung gang held its GPUs.
HANG_S = 600.0
# A job on GPUs stopped by signal (SIGSTOP: it does not speak the protocol, or its mini-batch
# outlasted ACK_TIMEOUT_S) stays stopped at most this long, then is preempted instead (a
# checkpoint, or SIGTERM) and started again when resumed: NCCL's watchdog measures its
# collectives' timeout (10 min by default) on a clock that runs while the process is
# stopped, and aborts the communicators when it wakes past it
SIGNAL_STOP_MAX_S = 300.0
# A packed rank's cap binds its caching allocator, the rest of what the driver counts to
# its process (its CUDA context, NCCL's buffers) allowed for (``Job.limit``). A rank that
# NVML sees holding more than its cap and this margin on two readings in a row (one every
# CAP_READ_S) has outgrown its share with memory no allocator limit stops: the scheduler is
# told (``out-of-memory``) and unpacks it, before its GPU-mate runs out.
CAP_MARGIN_GB = 0.5
CAP_READ_S = 1.0
# A start waits this long at most for a zygote still importing: a cold start would spend the
# same seconds on the same imports, beside the zygote's, on the same cores.
ZYGOTE_WAIT_S = 60.0
HUNG = "hung:"  # how a hung job's reason begins (the server counts them by it)
STRAGGLED = "killed at exit:"  # how a done job's note begins when ranks hung at its end
BAD_REPORT = "bad report:"  # how the reason of a job failed for what it sent begins
AWAY_S = 1.0  # the reader looks every 0.05 s: a longer gap means this process was stopped
# What processes suspended by the library may keep of one GPU together (NVML's count): half
# of the GPU's headroom (node.devices.HEADROOM), which no job's profile counts on (4 GB of
# an 80 GB H100, 0.8 GB of a 16 GB V100), or HELD_MAX_GB where the agent is not told its
# GPUs' memory. Beyond it, the one holding most is checkpointed and stopped instead, and
# started again where it is resumed. A CUDA context with cuBLAS and cuDNN is 0.3-0.6 GB: the
# suspended jobs of a GPU keep theirs and switch back in place, while one that keeps more
# (NCCL communicators, compile pools, the script's own buffers) gives it to the job placed
# next on its GPU
HELD_SHARE_OF_HEADROOM = 0.5
HELD_MAX_GB = 1.0
LOG_TAIL_LINES = 20
TAIL_READ_BYTES = 64 * 1024  # a failed job's reason quotes its log's end from this much


@dataclass(frozen=True)
class Gang:
    """This node's part of a gang spread over several nodes: ranks ``first`` to
    ``first + len(devices) - 1`` of ``world``, meeting at rank 0's node (torchrun's
    MASTER_ADDR/MASTER_PORT). Whoever spreads the gang (the ray backend) restarts it as one:
    a part whose rank crashes reports ``crashed`` instead of restarting alone."""

    first: int
    world: int
    master_addr: str
    master_port: int
    run: int = 0  # which start of the gang: its parts' end events carry it
    node: int = 0  # this part's place among the gang's nodes (torchrun's GROUP_RANK)
    nodes: int = 1  # how many nodes the gang spans (GROUP_WORLD_SIZE)


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen | Forked
    sock: socket.socket
    visible: list[int]  # the devices it can see, in order (GPUs: cuda:i is visible[i])
    buf: bytes = b""
    exit: int | None = None
    cap_gb: float | None = None  # the memory cap it was last sent (packed), if any
    over_cap: int = 0  # NVML's readings in a row above its cap and margin (CAP_MARGIN_GB)
    done: bool = False  # it said its training is over (``wire.Done``)


@dataclass
class _Job:
    id: str
    launch: Launch
    devices: tuple[int, ...]
    ranks: list[_Rank] = field(default_factory=list)
    aware: bool = False  # said hello: speaks the job library's protocol
    stopping: bool = False  # we asked it to exit (checkpoint-and-stop or kill)
    done: bool = False
    suspended: bool = False
    signalled: bool = False  # suspended with SIGSTOP
    restarts: int = 0
    ooms: int = 0  # restarts for running out of a memory cap (not counted as restarts)
    over_cap: bool = False  # said to hold more than its cap (until it is resumed again)
    step: int = 0
    memory_gb: float | None = None  # the most device memory it was seen to hold
    lingering_since: float | None = None  # when some ranks had ended well and others not
    stopped_at: float | None = None  # when it was stopped by signal (``SIGNAL_STOP_MAX_S``)
    collective_timeout_s: float | None = None  # its process group's, as it reported
    idle_since: float | None = None  # since when its running ranks used no CPU (``_idle_for``)
    cpu_seen: int = 0  # ...and the CPU ticks they had used then
    heard: float = field(default_factory=time.monotonic)  # its last report, or its (re)start
    parked: bool = False  # suspended by checkpoint-and-exit: a resume starts it again
    acks: dict[str, threading.Event] = field(default_factory=dict)
    replies: dict[str, wire.Report] = field(default_factory=dict)  # "suspended:0" -> it
    gang: Gang | None = None  # a part of a gang over several nodes
    store: Any = None  # the rendezvous store its ranks meet at, if this part hosts it
    tmp: Path | None = None  # its TMPDIR while its processes run
    cgroup: Path | None = None  # its processes' cgroup while they run, where there are

    @property
    def first(self) -> int:
        """The global rank of its first process here."""
        return self.gang.first if self.gang else 0

    @property
    def run(self) -> int:
        return self.gang.run if self.gang else 0


class AgentError(RuntimeError):
    pass


class Agent:
    """Runs and steers the job processes of one node. Thread-safe; events go to ``events``."""

    def __init__(self, workdir: Path, devices: list[str], threads: int = 1,
                 max_restarts: int = MAX_RESTARTS, checkpoint_every_s: float = 300.0,
                 python: str = sys.executable, warm: bool = True,
                 cpu_backed: bool = False, memory_gb: float | None = None,
                 exit_grace_s: float = EXIT_GRACE_S, hang_s: float = HANG_S,
                 signal_stop_max_s: float = SIGNAL_STOP_MAX_S,
                 zygote: Zygote | None = None) -> None:
        """``devices``: CPU slots (``cpu:<i>``) or GPUs (``cuda:<i>``, or ``cuda:<id>`` by
        UUID or MIG id). ``cpu_backed``: GPUs whose jobs compute on the CPU, every other
        rule of GPUs kept (what each process sees, moves by restart): the agent's device
        decisions, testable on a machine without GPUs. ``memory_gb``: what jobs may use of
        each device, divided among jobs packed on one (see ``_cap``); None: no caps.
        ``zygote``: one of this machine's (``start_zygote``), shared with other agents and
        closed by whoever made it; by default the agent starts its own."""
        self.workdir = Path(workdir).resolve()
        self.devices = devices  # e.g. ["cpu:0", "cpu:1"] or ["cuda:0", "cuda:1"]
        self.cpu_backed = cpu_backed
        self.memory_gb = memory_gb
        self.exit_grace_s = exit_grace_s
        self.signal_stop_max_s = signal_stop_max_s
        self.hang_s = hang_s
        # what CUDA_VISIBLE_DEVICES calls each GPU, through the agent's own: by UUID where
        # NVML says (an index is read under each job's CUDA_DEVICE_ORDER)
        self.gpu_ids = (gpus.by_uuid(gpus.gpu_ids(devices,
                                                  os.environ.get("CUDA_VISIBLE_DEVICES")))
                        if devices and devices[0].startswith("cuda") else [])
        self.in_place: set[str] = set()  # jobs that said they move in place (see Job.steps)
        self.threads = threads
        self.max_restarts = max_restarts
        self.checkpoint_every_s = checkpoint_every_s
        self.python = python
        self.warm = warm
        self._zygote = zygote
        self._own_zygote = zygote is None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._cgroups = cgroups.Runs(self.workdir)  # (ends an earlier agent's runs)
        self._made = 0  # cgroups made: each run's is new
        for pids in self.workdir.glob("jobs/*/pids"):  # an earlier agent's, if it crashed
            _kill_leftovers(pids)
            _remove_left_tmp(pids.with_name("tmp"))
        self.events: queue.Queue[AgentEvent] = queue.Queue()
        self.jobs: dict[str, _Job] = {}
        self.ended: set[str] = set()  # finished or failed: actions on them are no-ops
        self._stores: dict[str, Any] = {}  # rendezvous stores made before their job starts
        self._lock = threading.RLock()
        self._sel = selectors.DefaultSelector()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._sel.register(self._wakeup_r, selectors.EVENT_READ, None)
        self._closed = False
        self._reads = Looks()  # the reader's looks at its jobs' reports and exits
        self._caps_read = 0.0  # when NVML was last asked what capped ranks hold
        self._thread = threading.Thread(target=self._loop, name="gandiva-agent", daemon=True)
        self._thread.start()
        self._warm_up()

    @property
    def gpu(self) -> bool:
        return self.devices[0].startswith("cuda")

    def job_dir(self, job_id: str) -> Path:
        return self.workdir / "jobs" / job_id

    def checkpoint_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "checkpoints"

    def newest_checkpoint(self, job_id: str) -> Path | None:
        """The job's newest checkpoint here (its name: nothing of it is read)."""
        directory = self.checkpoint_dir(job_id)
        steps = checkpoint.steps(directory)
        return checkpoint.path(directory, steps[0]) if steps else None

    def rendezvous(self, job_id: str) -> int:
        """Host a fresh rendezvous store for the next start of ``job_id`` here, and say
        its port (the gang's MASTER_PORT): the part of the job started on this node next
        keeps it open while it runs. See ``_store``."""
        store = _store()
        with self._lock:
            self._stores[job_id] = store
        return store.port

    # ---- actions ------------------------------------------------------------------------
    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...],
              gang: Gang | None = None) -> None:
        """Start (or restart, from its latest checkpoint) ``job_id`` on ``devices``; with
        ``gang``, only this node's part of it."""
        zygote = self._zygote
        if zygote is not None and zygote.alive and not zygote.ready:
            zygote.wait_ready(ZYGOTE_WAIT_S)  # (not under the lock: the reader goes on)
        with self._lock:
            old = self.jobs.get(job_id)
            if old is not None:  # stopped (a restart): its run's TMPDIR goes with it
                _remove_tmp(old)
            job = _Job(job_id, launch, tuple(devices), restarts=old.restarts if old else 0,
                       gang=gang)
            self.jobs[job_id] = job
            self.ended.discard(job_id)
            self._spawn(job)
            self._cap(job.devices)

    def suspend(self, job_id: str) -> None:
        job = self._job(job_id)
        if job is None:
            return
        if job.aware and self._command(job, lambda r: wire.Suspend(), wire.Suspended):
            job.suspended = True
            stopped = self._stop_holders(job.devices)
            if job_id not in stopped:
                self.events.put(AgentEvent("suspended", job.id, {
                    "held_gb": self.held_gb(job_id), "stopped": False}))
        else:
            # not (or not yet) speaking the protocol, or a mini-batch longer than the
            # timeout: stop it with a signal. A library job may still act on the suspend
            # when it wakes, so resume will send it a resume message as well.
            self._signal(job, signal.SIGSTOP)
            job.suspended = job.signalled = True
            job.stopped_at = time.monotonic()
        self._cap(job.devices)

    def resume(self, job_id: str, devices: tuple[int, ...]) -> None:
        job = self._job(job_id)
        if job is None:
            return
        devices = tuple(devices)
        if job.parked:  # suspended by checkpoint-and-exit
            self.start(job_id, job.launch, devices, job.gang)
            return
        if self.gpu and devices != job.devices and not self._moves_in_place(job, devices):
            # a process keeps its GPUs: it moves through a checkpoint of the step it stopped
            # at (a suspended rank takes the command where it waits, a signalled one once
            # continued; a script without the library is preempted: SIGTERM)
            self._log(job, f"moved from devices {job.devices} to {devices} by restart")
            self.restart(job_id, devices)
            return
        job.heard = time.monotonic()  # its silence while suspended was ours
        job.over_cap = False
        if job.signalled:
            self._signal(job, signal.SIGCONT)
            job.suspended = job.signalled = False
            job.stopped_at = None
            if job.aware:
                for r in job.ranks:
                    self._send(r, wire.Resume(self._device_name(job, r)))
            if not self.gpu:
                self._pin(job, devices)
            self._cap(job.devices)
            return
        old, job.devices = job.devices, devices
        self._command(job, lambda r: wire.Resume(self._device_name(job, r)), wire.Resumed)
        job.suspended = False
        self._cap(old + devices)

    @property
    def held_budget_gb(self) -> float:
        """What the suspended processes on one device may hold together (see
        HELD_SHARE_OF_HEADROOM)."""
        if self.memory_gb is None:
            return HELD_MAX_GB
        return self.memory_gb / (1 - gpus.HEADROOM) * gpus.HEADROOM * HELD_SHARE_OF_HEADROOM

    def _stop_holders(self, devices: tuple[int, ...]) -> list[str]:
        """Keep what suspended processes hold of each of ``devices`` within the budget (see
        HELD_SHARE_OF_HEADROOM): checkpoint and stop those holding most until it is (gangs
        over several nodes stay: they restart only whole). The jobs stopped."""
        budget = self.held_budget_gb
        stopped = []
        for d in set(devices):
            while True:
                with self._lock:
                    here = [j for j in self.jobs.values() if d in j.devices and j.suspended
                            and not (j.signalled or j.parked or j.stopping or j.gang)]
                held = [(h, j) for j in here if (h := self._counted_held(j))]
                if sum(h for h, _ in held) <= budget:
                    break
                most, job = max(held, key=lambda hj: hj[0])
                unknown = " (unknown: counted as its peak)" if self.held_gb(job.id) is None else ""
                self._log(job, f"suspended holding {most:.2f} GB of device memory{unknown}: "
                               "checkpointed and stopped instead")
                self.stop(job.id, checkpoint=True)
                job.parked = True
                stopped.append(job.id)
                self.events.put(AgentEvent("suspended", job.id, {"held_gb": most,
                                                                 "stopped": True}))
        return stopped

    def held_gb(self, job_id: str) -> float | None:
        """Device memory the job's processes still held when last suspended by the library
        (NVML's count, over its ranks), if known: what a job placed beside it cannot have."""
        job = self._job(job_id)
        if job is None:
            return None
        held = [_held(job, r) for r in job.ranks]
        known = [h for h in held if h is not None]
        return max(known) if held and len(known) == len(held) else None

    def _counted_held(self, job: _Job, rank: _Rank | None = None) -> float:
        """What a suspended job (or one of its ranks) is counted to hold of its device: what
        it said, else (unknown) the most it was seen to hold, else the whole device: never
        0 for not knowing."""
        held = self.held_gb(job.id) if rank is None else _held(job, rank)
        if held is not None:
            return held
        if job.memory_gb is not None:
            return job.memory_gb
        return HELD_MAX_GB if self.memory_gb is None else self.memory_gb

    def _cap(self, devices: tuple[int, ...]) -> None:
        """Divide each of ``devices`` among the running jobs on it (``_division``) and send
        each rank its cap where it changed. The job applies its cap as it reads it
        (``Job.limit``); a rank that starts beside others gets its cap in its start
        environment, applied before any of its code allocates."""
        if self.memory_gb is None:
            return
        with self._lock:
            for d in set(devices):
                for _, r, cap in self._division(d):
                    if r is None or cap == r.cap_gb:
                        continue
                    data = wire.encode(wire.Limit(cap))
                    try:  # never blocks: a job that reads nothing keeps its old cap
                        sent = r.sock.send(data)
                    except OSError:
                        continue
                    if sent < len(data):  # the line must not be torn: finish it
                        self._send_rest(r, data[sent:])
                    r.cap_gb, r.over_cap = cap, 0

    def _division(self, d: int, newcomer: _Job | None = None
                  ) -> list[tuple[_Job, _Rank | None, float | None]]:
        """Each running rank's cap on device ``d`` (and ``newcomer``'s, about to start
        there: its rank None): each gets the most it was seen to hold and an even part of
        what is left; while some are unprofiled, the others keep their peaks and the
        unprofiled share the rest. So a packed pair cannot take each other's memory, and no
        job is capped below what it holds; a job alone on its GPU is uncapped (None)."""
        assert self.memory_gb is not None
        ranks: list[tuple[_Job, _Rank | None]] = [
            (job, r) for job in self.jobs.values() if not job.stopping
            for r in job.ranks if r.exit is None and job.devices[r.rank] == d]
        if newcomer is not None and d in newcomer.devices:
            ranks.append((newcomer, None))
        # a job stopped by signal keeps all it had; one suspended by the library, what it
        # reported
        here = [(job, r) for job, r in ranks if job.signalled or not job.suspended]
        held = sum(self._counted_held(job, r)
                   for job, r in ranks if job.suspended and not job.signalled)
        memory = max(0.0, self.memory_gb - held)
        peaks = [job.memory_gb for job, _ in here]
        known = [p for p in peaks if p is not None]
        rest = max(0.0, memory - sum(known))
        caps: list[float | None]
        if len(here) < 2:
            caps = [memory if held else None] * len(here)
        elif len(known) < len(peaks):
            share = rest / (len(peaks) - len(known))
            caps = [share if p is None else p for p in peaks]
        else:
            caps = [p + rest / len(peaks) for p in known]
        return [(job, r, cap) for (job, r), cap in zip(here, caps, strict=True)]

    def _moves_in_place(self, job: _Job, devices: tuple[int, ...]) -> bool:
        """A one-process job that said it reads ``job.device`` at every step, suspended by
        the library, onto a GPU its process can see."""
        return (job.id in self.in_place and job.gang is None and len(job.ranks) == 1
                and not job.signalled and all(d in job.ranks[0].visible for d in devices))

    def restart(self, job_id: str, devices: tuple[int, ...]) -> None:
        """Checkpoint at the next boundary, stop, and start again on ``devices`` (maybe a
        different number of them): migration, grow and shrink."""
        job = self._job(job_id)
        if job is None:
            return
        self.stop(job_id, checkpoint=True)
        if job_id not in self.ended:
            self.start(job_id, job.launch, devices)

    def stop(self, job_id: str, checkpoint: bool = False) -> None:
        """Stop the job's processes: after a checkpoint (library jobs), else by signal."""
        job = self._job(job_id)
        if job is None:
            return
        job.stopping = True
        if checkpoint and job.aware:
            if job.signalled:
                self._signal(job, signal.SIGCONT)
            for r in job.ranks:  # a job suspended by the library takes it while blocked
                self._send(r, wire.Checkpoint(exit=True))
            if self._wait_exit(job, ACK_TIMEOUT_S):
                return
        self._terminate(job)

    def _stop_bound(self, job: _Job) -> float:
        """How long ``job`` may stay stopped by signal on a GPU: ``signal_stop_max_s``, or
        half its process group's timeout if that is shorter (its watchdog must not find a
        collective timed out when it wakes)."""
        return stop_bound(self.signal_stop_max_s, job.collective_timeout_s)

    def _preempt(self, job: _Job) -> None:
        """A job stopped by signal for ``_stop_bound``: checkpointed and stopped (a
        script without the library: SIGTERM), to start again where it is resumed."""
        if self.jobs.get(job.id) is not job or not job.signalled or job.stopping:
            return  # resumed or stopped meanwhile
        self._log(job, f"stopped by signal for {self._stop_bound(job):g} s, past what a "
                       "GPU job's NCCL timeout allows: checkpointed and stopped instead")
        self.stop(job.id, checkpoint=True)
        job.parked = True
        self.events.put(AgentEvent("suspended", job.id, {"held_gb": None, "stopped": True}))

    def park(self, job_id: str) -> None:
        """Checkpoint and stop the job, and forget it until it is started again (a job its
        user holds: it keeps no device and no memory)."""
        if job_id in self.jobs:
            self.stop(job_id, checkpoint=True)
            self._forget(job_id)

    def kill(self, job_id: str) -> None:
        if job_id in self.jobs:
            self.stop(job_id, checkpoint=False)
            self._forget(job_id)

    def _forget(self, job_id: str) -> None:
        """A stopped job leaves the agent (the reader no longer reaps it): its TMPDIR too."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            _remove_tmp(job)
        self.ended.add(job_id)

    def close(self) -> None:
        with self._lock:
            for job in list(self.jobs.values()):
                if any(r.exit is None for r in job.ranks):
                    job.stopping = True
                    self._terminate(job, grace=2.0)
            if self._zygote is not None and self._own_zygote:  # after the jobs: it hears
                self._zygote.close()                              # their exit statuses
            self._closed = True
        self._wakeup_w.send(b"x")
        self._thread.join(timeout=5)
        for job in list(self.jobs.values()):  # (those the reader did not reap before it ended)
            _remove_tmp(job)
        self._cgroups.close()

    # ---- processes ----------------------------------------------------------------------
    def _device_name(self, job: _Job, r: _Rank) -> str:
        dev = job.devices[r.rank]
        return f"cuda:{r.visible.index(dev)}" if self.gpu else f"cpu:{dev}"

    def _spawn(self, job: _Job) -> None:
        job.heard = time.monotonic()
        account = job.launch.account
        if account is not None and (why := accounts.problem(account)):
            self._finish(job, f"cannot start: {why}")
            return
        directory = self._layout(job.id, account)
        if job.tmp is None:  # its own, made anew (0700, a name no one could take before it),
            # short: a socket's path, ``multiprocessing``'s under TMPDIR, fits in 107 bytes
            job.tmp = Path(tempfile.mkdtemp(prefix="gandiva-"))
            accounts.chown(job.tmp, account, 0o700)
            (directory / "tmp").write_text(str(job.tmp))  # for the next agent, if this crashes
        if job.cgroup is None:
            self._made += 1
            job.cgroup = self._cgroups.make(job.id, self._made)
        _kill_leftovers(directory / "pids")
        try:
            command = torchrun.unwrap(job.launch.command, self.python)
        except ValueError as err:
            self._finish(job, str(err))
            return
        if command is not job.launch.command:
            self._log(job, "torchrun unwrapped: gandiva starts one process per rank itself")
        # torchrun's environment for a gang, or a command that was torchrun's
        elastic = (job.gang is not None or len(job.devices) > 1
                   or command is not job.launch.command)
        command = [self.python if c == "{python}" else c for c in command]
        # its ranks all here, each a Python script (which gandiva.job.warm runs, warm or
        # cold): they meet at a file in the job's TMPDIR (``warm.rendezvous_in_a_file``),
        # which only its account can reach; a TCP store listens on every interface
        in_a_file = job.gang is None and _runs_through_warm(command, self.python)
        if job.gang is not None:
            gang = job.gang
            job.store = self._stores.pop(job.id, None)  # this node hosts the rendezvous
        else:
            job.store = _store() if elastic and not in_a_file else None
            gang = Gang(0, len(job.devices), "127.0.0.1", job.store.port if job.store else 0)
        mig = self.gpu and any(gpus.is_mig(self.gpu_ids[d]) for d in job.devices)
        if mig and (len(job.devices) > 1 or job.gang is not None):
            self._finish(job, f"{len(job.devices)} device(s) of a gang on MIG instances "
                              f"({', '.join(self.gpu_ids[d] for d in job.devices)}): CUDA "
                              "shows a process one MIG instance and NCCL joins none of them; "
                              "run it on one MIG instance, or on whole GPUs")
            return
        # (a MIG instance is the only one its process sees: no in-place moves there)
        visible = gpus.visible(job.devices, len(self.devices),
                               job.id in self.in_place and not mig)
        starts_capped = {} if self.memory_gb is None or not self.gpu else {
            d: cap for d in set(job.devices) for j, r, cap in self._division(d, job)
            if j is job and r is None}
        for rank in range(len(job.devices)):
            env = {**environment.for_jobs(), "TMPDIR": str(job.tmp), **job.launch.env,
                   "GANDIVA_JOB_ID": job.id,
                   "GANDIVA_CHECKPOINT_DIR": str(self.checkpoint_dir(job.id)),
                   "GANDIVA_CHECKPOINT_EVERY_S": str(self.checkpoint_every_s),
                   "GANDIVA_ALIVE_EVERY_S": str(self.hang_s / 10),
                   "GANDIVA_THREADS": str(self.threads),
                   "PYTHONUNBUFFERED": "1",
                   "OMP_NUM_THREADS": str(self.threads)}
            if elastic:
                env.update(torchrun_env(job.id, gang, rank, len(job.devices), job.restarts,
                                        self.max_restarts))
                if in_a_file:
                    env["GANDIVA_RENDEZVOUS_FILE"] = str(job.tmp / "rendezvous")
                env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # torchrun's default
            else:
                for name in TORCHRUN_VARIABLES:  # not inherited from the agent's own
                    env.pop(name, None)
            if account is not None:
                env.update(HOME=account.home, USER=account.user, LOGNAME=account.user)
            if self.gpu:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_ids[d] for d in visible)
                env["GANDIVA_DEVICE"] = f"cuda:{rank}"  # visible[rank] is its own
                if (cap := starts_capped.get(job.devices[rank])) is not None:
                    env["GANDIVA_MEMORY_CAP_GB"] = repr(cap)  # (before its first allocation)
                if self.cpu_backed:
                    env["GANDIVA_CPU_BACKED"] = "1"
            else:
                env["GANDIVA_DEVICE"] = f"cpu:{job.devices[rank]}"
            # logs go by global rank; the agent's files, which a job gets open, never by name
            log = _open_log(directory / f"rank{job.first + rank}.log")
            where = (f"GPU {self.gpu_ids[job.devices[rank]]}" if self.gpu
                     else env["GANDIVA_DEVICE"])
            os.write(log, f"--- gandiva: start on {where} "
                          f"(attempt {job.restarts + 1}) ---\n".encode())
            cwd = str(Path(job.launch.cwd or directory).resolve())
            # (read after _warmable, which may replace a dead zygote)
            zygote = self._zygote if self._warmable(job, command, env) else None
            warm = zygote.fork() if zygote is not None else None
            proc: subprocess.Popen[bytes] | Forked
            if warm is not None:
                proc, ours = warm
                cgroup = str(job.cgroup) if job.cgroup else None
                become = wire.Become(command[1:], env, cwd, cgroup=cgroup)
                if account is not None:
                    become = wire.Become(command[1:], env, cwd, account.uid, account.gid,
                                         list(account.groups), cgroup)
                _send_with(ours, wire.encode(become), log)
                os.close(log)
            else:
                ours, theirs = socket.socketpair()
                env["GANDIVA_CONTROL_FD"] = str(theirs.fileno())
                who: dict[str, Any] = {}
                cold = _cold(command, self.python)
                if account is not None and os.geteuid() == 0:
                    who = {"user": account.uid, "group": account.gid,
                           "extra_groups": list(account.groups)}
                    cold = accounts.cold_command(cold, self.python)
                try:
                    proc = subprocess.Popen(
                        cold, cwd=cwd, env=env, stdout=log,
                        stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                        start_new_session=True, **who)
                    cgroups.join(job.cgroup, proc.pid)  # (before its code runs, as a rule:
                    killable_first(proc.pid)  # an interpreter takes ~20 ms to start)
                except OSError as err:
                    ours.close()
                    self._finish(job, f"cannot start {command[0]!r}: {err}")
                    return
                finally:
                    theirs.close()
                    os.close(log)
            ours.setblocking(False)
            r = _Rank(rank, proc, ours, visible)
            r.cap_gb = starts_capped.get(job.devices[rank])  # (in its environment)
            job.ranks.append(r)
            self._sel.register(ours, selectors.EVENT_READ, (job, r))
        _record_pids(directory / "pids", [r.proc.pid for r in job.ranks])
        self._wakeup_w.send(b"x")

    def _layout(self, job_id: str, account: Account | None) -> Path:
        """The job's directory: the agent's (its logs and pid file, which the job never
        opens by name), with ``checkpoints`` in it the job's own. For a job of another
        account, the directories above it let the account pass (0711), never list."""
        directory = self.job_dir(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        checkpoints = self.checkpoint_dir(job_id)
        checkpoints.mkdir(exist_ok=True)
        accounts.chown(checkpoints, account, 0o700)
        if account is not None and account.uid != os.geteuid():
            for passed in (directory, directory.parent, self.workdir):
                os.chmod(passed, 0o711)
        return directory

    # ---- warm starts (see gandiva.job.warm) ---------------------------------------------
    def _warmable(self, job: _Job, command: list[str], env: dict[str, str]) -> bool:
        """A Python script can start warm once the zygote is ready, unless its environment
        differs from the zygote's in a variable that acts only when an interpreter or a
        library starts (PYTHONPATH, OMP_*, LD_*, TORCH*: ``zygote.warm_compatible``). (``start``
        waits for a zygote still importing.) A zygote that died is replaced; the start that
        found it dead goes cold."""
        if not (self.warm and len(command) > 1 and command[0] == self.python
                and command[1].endswith(".py")):
            return False
        if self._zygote is not None and not self._zygote.alive and not self._closed:
            if self._own_zygote:
                self._zygote.close()
            self._own_zygote = True  # a shared one that died is replaced by one of ours
            self._zygote = None
            self._warm_up()
        zygote = self._zygote
        if zygote is None or not zygote.ready:  # (``warm_ready``)
            return False
        differs = warm_compatible(zygote.env, env)
        if differs is not None:
            self._log(job, f"starts cold: its {differs} differs from the warm zygote's")
            return False
        return True

    def warm_ready(self) -> bool:
        """Would a job start warm now (the zygote has its imports done)?"""
        return self._zygote is not None and self._zygote.ready

    def _warm_up(self) -> None:
        if self.warm and self._zygote is None:
            self._zygote = start_zygote(self.workdir, self.threads, self.python)

    def _pin(self, job: _Job, devices: tuple[int, ...]) -> None:
        job.devices = tuple(devices)
        cores = sorted(os.sched_getaffinity(0))
        for r in job.ranks:
            first = job.devices[r.rank] * self.threads
            try:
                os.sched_setaffinity(r.proc.pid, {cores[(first + i) % len(cores)]
                                                  for i in range(self.threads)})
            except OSError:
                pass

    def _signal(self, job: _Job, sig: int) -> None:
        for r in job.ranks:
            if r.exit is None:
                try:
                    os.killpg(r.proc.pid, sig)
                except ProcessLookupError:
                    pass

    def _terminate(self, job: _Job, grace: float = GRACE_S) -> None:
        job.stopping = True
        self._signal(job, signal.SIGCONT)
        self._signal(job, signal.SIGTERM)
        if not self._wait_exit(job, grace):
            self._signal(job, signal.SIGKILL)
            self._wait_exit(job, 10.0)

    def _wait_exit(self, job: _Job, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for r in job.ranks:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    # ---- the channel --------------------------------------------------------------------
    def _job(self, job_id: str) -> _Job | None:
        """The job, or None if it has ended (the scheduler learns it from the event)."""
        with self._lock:
            job = self.jobs.get(job_id)
        if job is None and job_id not in self.ended:
            raise AgentError(f"no job {job_id!r} on this agent")
        return job

    def _send(self, r: _Rank, command: wire.Command) -> None:
        self._send_rest(r, wire.encode(command))  # (if it died, the loop notices the exit)

    def _send_rest(self, r: _Rank, data: bytes) -> None:
        try:
            r.sock.setblocking(True)
            r.sock.sendall(data)
        except OSError:
            pass
        finally:
            try:
                r.sock.setblocking(False)
            except OSError:
                pass

    def _command(self, job: _Job, msg: Callable[[_Rank], wire.Command],
                 reply: type[wire.Report]) -> bool:
        """Send ``msg(rank)`` to every rank and wait for their ``reply`` (a report type);
        False on timeout."""
        ack = reply.ev
        with self._lock:
            for r in job.ranks:  # forget a late ack of an earlier command
                job.acks.pop(f"{ack}:{r.rank}", None)
        for r in job.ranks:
            self._send(r, msg(r))
        return self._wait_ack(job, ack)

    def _wait_ack(self, job: _Job, ack: str) -> bool:
        """Wait until every rank acknowledged ``ack``; False if one did not in time, or a
        process ended meanwhile (the job finished or crashed: the reaper reports it)."""
        deadline = time.monotonic() + ACK_TIMEOUT_S
        looks = Looks()
        for r in job.ranks:
            key = f"{ack}:{r.rank}"
            with self._lock:
                ev = job.acks.setdefault(key, threading.Event())
            while not ev.wait(0.02):
                deadline += looks.away()  # this process was stopped, not the job slow
                if r.proc.poll() is not None or time.monotonic() > deadline:
                    return False
            with self._lock:
                job.acks.pop(key, None)
        return True

    def _loop(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=0.05):
                if key.data is None:
                    self._wakeup_r.recv(4096)
                    continue
                job, r = key.data
                try:
                    chunk = r.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self._sel.unregister(r.sock)
                    r.sock.close()
                    continue
                r.buf += chunk
                try:
                    while b"\n" in r.buf:
                        line, r.buf = r.buf.split(b"\n", 1)
                        if len(line) > wire.LINE_BYTES:
                            raise wire.BadReport(f"a line of {len(line)} bytes, more than "
                                                 f"{wire.LINE_BYTES}")
                        self._on_message(job, r, wire.report(line))
                    if len(r.buf) > wire.LINE_BYTES:  # (never held whole: the job fails)
                        raise wire.BadReport(f"a line of more than {wire.LINE_BYTES} bytes")
                except Exception as e:  # noqa: BLE001 - the job's fault fails the job only
                    self._reject(job, r, e)
            self._reap()

    def _on_message(self, job: _Job, r: _Rank, msg: wire.Report) -> None:
        first = job.first + r.rank == 0  # what a gang reports, its global rank 0 says
        with self._lock:
            job.heard = time.monotonic()
            if isinstance(msg, wire.Hello):
                job.aware = True
            elif isinstance(msg, wire.Profile) and first:
                job.step = msg.step
                job.collective_timeout_s = msg.collective_timeout_s
                if msg.memory_gb > (job.memory_gb or 0.0):
                    job.memory_gb = msg.memory_gb
                    self._cap(job.devices)  # its GPU-mates' parts follow its new peak
                self.events.put(AgentEvent("profile", job.id, msg))
            elif isinstance(msg, wire.CheckpointRefused):
                self.events.put(AgentEvent("checkpoint-refused", job.id,
                                           {"step": msg.step, "reason": msg.reason}))
            elif isinstance(msg, wire.Done):
                job.done = r.done = True
                job.step = msg.step
            elif isinstance(msg, wire.Started) and first:
                if msg.in_place:
                    self.in_place.add(job.id)
                self.events.put(AgentEvent("started", job.id, msg))
            elif isinstance(msg, wire.Suspended | wire.Resumed | wire.Checkpointed):
                job.replies[f"{msg.ev}:{r.rank}"] = msg
                job.acks.setdefault(f"{msg.ev}:{r.rank}", threading.Event()).set()

    def _reject(self, job: _Job, r: _Rank, error: Exception) -> None:
        """What rank ``r`` sent is not a report of the protocol (or could not be acted on):
        the job is killed and fails, saying what it sent; the reader goes on."""
        with self._lock:
            r.buf = b""
            if self.jobs.get(job.id) is not job or job.stopping:
                return
            self._kill(job)
            why = f"{BAD_REPORT} rank {job.first + r.rank} sent {error}"
            self._log(job, why)
            self._finish(job, why)

    def _kill(self, job: _Job) -> None:
        """Kill every rank of the job now, wait for each (its status kept), and let go of
        its channels and its store."""
        job.stopping = True
        self._signal(job, signal.SIGKILL)
        for r in job.ranks:
            r.exit = r.proc.wait()
        self._drop(job)

    def _read_caps(self) -> None:
        """Every CAP_READ_S, what each capped running rank holds of its GPU (NVML), against
        its cap and CAP_MARGIN_GB: two readings above in a row and the job is said to be
        out of memory, once. Unknown readings count as neither."""
        now = time.monotonic()
        if not self.gpu or now - self._caps_read < CAP_READ_S:
            return
        self._caps_read = now
        capped = [(job, r) for job in self.jobs.values()
                  if not (job.suspended or job.stopping or job.over_cap)
                  for r in job.ranks if r.cap_gb is not None and r.exit is None]
        if not capped:
            return
        reading = nvml.held_gb_of(r.proc.pid for _, r in capped)
        for job, r in capped:
            held, cap = reading[r.proc.pid], r.cap_gb
            if job.over_cap or cap is None:
                continue
            r.over_cap = r.over_cap + 1 if held is not None and held > cap + CAP_MARGIN_GB else 0
            if r.over_cap >= 2:
                why = (f"rank {r.rank} held {held:.2f} GB of its GPU on two readings, more "
                       f"than its cap of {cap:.2f} GB and {CAP_MARGIN_GB:g} GB over")
                self._log(job, why)
                self.events.put(AgentEvent("out-of-memory", job.id, {"reason": why}))
                job.over_cap = True

    def _reap(self) -> None:
        with self._lock:
            self._read_caps()
            away = self._reads.away()  # what the jobs said meanwhile waits unread, so the
            for job in self.jobs.values():  # time this process was stopped is not their
                job.heard += away  # silence
            for job in list(self.jobs.values()):
                if not job.ranks or all(r.exit is not None for r in job.ranks):
                    continue
                for r in job.ranks:
                    if r.exit is None:
                        r.exit = r.proc.poll()
                codes = [r.exit for r in job.ranks]
                if all(c is None for c in codes):
                    if (job.aware and not (job.suspended or job.stopping or job.done)
                            and time.monotonic() - job.heard >= self.hang_s):
                        self._crashed(job, codes, hung=True)
                    elif (self.gpu and job.signalled and job.stopped_at is not None
                          and time.monotonic() - job.stopped_at >= self._stop_bound(job)):
                        job.stopped_at = None  # (a stop waits on the reader: not here)
                        threading.Thread(target=self._preempt, args=(job,), daemon=True,
                                         name=f"gandiva-preempt-{job.id}").start()
                    continue
                if job.stopping:
                    if all(c is not None for c in codes):
                        self._drop(job)
                    continue
                if all(c == 0 for c in codes):  # finished (or stopped early on its own)
                    self._drop(job)
                    self.ended.add(job.id)
                    del self.jobs[job.id]
                    self.events.put(AgentEvent("done", job.id, {"step": job.step,
                                                                "run": job.run}))
                    continue
                if any(c not in (None, 0) for c in codes) or all(c is not None for c in codes):
                    self._crashed(job, codes)
                    continue
                # the wait starts when the gang's rank 0 has ended (here, or on its node):
                # other ranks may end first while rank 0 saves or evaluates at the end...
                if job.first == 0 and job.ranks[0].exit is None:
                    # ...but a rank 0 that computes nothing for the grace, the others gone,
                    # is hung on its way out (issue 54's stack: its group's destructor joins
                    # a thread that waits for the GIL it holds)
                    if _idle_for(job, self.exit_grace_s):
                        self._lingered(job, self.exit_grace_s, idle=True)
                    continue
                job.lingering_since = job.lingering_since or time.monotonic()
                finished = all(r.done for r in job.ranks if r.exit is None)
                grace = min(self.exit_grace_s, TEARDOWN_GRACE_S) if finished else self.exit_grace_s
                if time.monotonic() - job.lingering_since >= grace:
                    self._lingered(job, grace)

    def _lingered(self, job: _Job, grace: float, idle: bool = False) -> None:
        """Rank 0 (on a node without it: some rank) ended well and the others did not follow
        within ``grace`` (or, ``idle``, the others ended well and rank 0 computed nothing for
        ``grace``): kill them.
        If each had said its training was over, or sat idle with its gang gone, they hung on
        the way out: the job is done, the stragglers counted (``stragglers`` in its event);
        else it fails, naming them (a restart would hang again where they hang)."""
        late = [job.first + r.rank for r in job.ranks if r.exit is None]
        finished = idle or all(r.done for r in job.ranks if r.exit is None)
        self._kill(job)
        self.jobs.pop(job.id, None)
        self.ended.add(job.id)
        gone = (f"rank(s) {late} idle {grace:g} s after the others ended well" if idle else
                f"rank(s) {late} still running {grace:g} s after the others ended")
        self._log(job, f"{gone}: killed")
        if finished:
            self.events.put(AgentEvent("done", job.id, {"step": job.step, "run": job.run,
                                                        "stragglers": len(late)}))
            return
        self.events.put(AgentEvent("failed", job.id, {
            "reason": f"{gone} (hung in a collective or at exit): killed; end of the log of "
                      f"rank {late[0]}:\n" + self.log_tail(job.id, late[0]),
            "run": job.run}))

    def _crashed(self, job: _Job, codes: list[int | None], hung: bool = False) -> None:
        """A rank died unasked, or the job is ``hung`` (silent for ``hang_s``): stop the
        gang, restart it from its checkpoint or fail it. A packed job that ran out of its
        share of the GPU (``warm.OUT_OF_MEMORY``, with a cap) is restarted without counting
        it, up to ``max_restarts`` times, and the scheduler told (``out-of-memory``): it
        should take the job off the GPU."""
        capped = any(r.cap_gb is not None for r in job.ranks)
        self._kill(job)
        if (not hung and capped and job.gang is None and job.ooms < self.max_restarts
                and OUT_OF_MEMORY in [r.exit for r in job.ranks]):
            why = "ran out of its share of a GPU it shares (its memory cap)"
            self._log(job, f"{why}: started again from its checkpoint")
            self.events.put(AgentEvent("out-of-memory", job.id, {"reason": why}))
            self._start_again(job, ooms=job.ooms + 1)
            return
        if hung:
            why = (f"{HUNG} no report from any rank for {self.hang_s:g} s (a rank stuck in a "
                   "collective, or a loop without boundaries); killed")
            self._log(job, why)
        else:
            bad = next(r.exit for r in job.ranks if r.exit)  # (all have exited: waited above)
            why = (f"killed by signal {-bad}" if bad < 0 else f"exited with status {bad}")
        if job.gang is not None:  # the whole gang restarts, on every node: not ours to do
            self.jobs.pop(job.id, None)
            self.ended.add(job.id)
            self.events.put(AgentEvent("crashed", job.id, {
                "reason": f"{why}; end of its log:\n" + self.log_tail(job.id, job.first),
                "run": job.run}))
            return
        if job.restarts < self.max_restarts:
            job.restarts += 1
            self.events.put(AgentEvent("restarted", job.id, {"reason": why,
                                                             "attempt": job.restarts + 1}))
            self._start_again(job, ooms=job.ooms)
            return
        self._finish(job, f"{why} after {job.restarts} restarts; end of its log:\n"
                          + self.log_tail(job.id))

    def _start_again(self, job: _Job, ooms: int) -> None:
        """A new run of a crashed job, on its devices. It keeps its peak, and is capped again
        at once beside its GPU-mates (not at its next profile: until then both would run
        uncapped)."""
        fresh = _Job(job.id, job.launch, job.devices, restarts=job.restarts,
                     memory_gb=job.memory_gb, ooms=ooms)
        self.jobs[job.id] = fresh
        self._spawn(fresh)
        self._cap(fresh.devices)

    def _finish(self, job: _Job, reason: str) -> None:
        _remove_tmp(job)  # (one that never started, too)
        self.jobs.pop(job.id, None)
        self.ended.add(job.id)
        self.events.put(AgentEvent("failed", job.id, {"reason": reason, "run": job.run}))

    def _drop(self, job: _Job) -> None:
        job.store = None  # its server stops with the last reference
        for r in job.ranks:
            try:
                self._sel.unregister(r.sock)
            except (KeyError, ValueError):
                pass
            r.sock.close()
        self._cap(job.devices)  # its GPU-mates have its memory now
        _remove_tmp(job)

    def _log(self, job: _Job, text: str) -> None:
        fd = _open_log(self.job_dir(job.id) / f"rank{job.first}.log")
        try:
            os.write(fd, f"--- gandiva: {text} ---\n".encode())
        finally:
            os.close(fd)

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0, size: int = -1) -> bytes:
        """One rank's log from byte ``offset``: all of the rest, or at most ``size`` bytes."""
        path = self.job_dir(job_id) / f"rank{rank}.log"
        if not path.exists():
            return b""
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def log_size(self, job_id: str, rank: int = 0) -> int:
        path = self.job_dir(job_id) / f"rank{rank}.log"
        return path.stat().st_size if path.exists() else 0

    def log_tail(self, job_id: str, rank: int = 0, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines, from at most the last ``TAIL_READ_BYTES`` of the log (a
        job may write gigabytes, or one endless line)."""
        start = max(0, self.log_size(job_id, rank) - TAIL_READ_BYTES)
        data = self.read_log(job_id, rank, start, TAIL_READ_BYTES)
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _open_log(path: Path) -> int:
    """Open a rank's log to append to (the agent's: a link put in its place is refused)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                   0o600)


def _send_with(sock: socket.socket, data: bytes, fd: int) -> None:
    """Send ``data`` with ``fd`` (SCM_RIGHTS, on its first byte)."""
    sent = socket.send_fds(sock, [data], [fd])
    if sent < len(data):
        sock.sendall(data[sent:])


def _remove_tmp(job: _Job) -> None:
    """A run leaves the agent: what is left of its processes (in its cgroup) is killed, and
    its TMPDIR removed."""
    if job.cgroup is not None:
        cgroups.kill(job.cgroup)
        job.cgroup = None
    if job.tmp is not None:
        shutil.rmtree(job.tmp, ignore_errors=True)
        job.tmp = None


def stop_bound(most_s: float, collective_timeout_s: float | None) -> float:
    """How long a GPU job may stay stopped by signal: ``most_s``, or half its process
    group's collective timeout where it reported a shorter one."""
    if collective_timeout_s is None or collective_timeout_s <= 0:
        return most_s
    return min(most_s, collective_timeout_s / 2)


def _held(job: _Job, r: _Rank) -> float | None:
    """What rank ``r`` said it still held when last suspended by the library, if known."""
    reply = job.replies.get(f"suspended:{r.rank}")
    return reply.held_gb if isinstance(reply, wire.Suspended) else None


def start_zygote(workdir: Path, threads: int = 1, python: str = sys.executable) -> Zygote:
    """A zygote whose forks start as an agent with ``threads`` per job starts an ordinary
    job: with what every job gets in its environment."""
    zygote = Zygote(python, workdir, env={**environment.for_jobs(),
                                          "OMP_NUM_THREADS": str(threads),
                                          "PYTHONUNBUFFERED": "1"})
    killable_first(zygote.proc.pid)  # and its forks, the warm jobs
    return zygote


def killable_first(pid: int) -> None:
    """A job's process is the OOM killer's before the server and the agent: its score is
    raised (``JOB_OOM_SCORE_ADJ``, which needs no privilege; a root server also lowers its
    own and its daemon's where the machine lets it: ``OOM_SCORE_ADJ``)."""
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(JOB_OOM_SCORE_ADJ))
    except OSError:
        pass


JOB_OOM_SCORE_ADJ = 500
OOM_SCORE_ADJ = -500  # the server's and its node daemon's (needs CAP_SYS_RESOURCE)


def rank_logs(directory: Path) -> list[tuple[int, Path]]:
    """The ranks' logs in a job's directory (``rank<digits>.log``), by rank: a file of
    another name there, one the job made, is none of them."""
    found = [(int(m[1]), path) for path in directory.glob("rank*.log")
             if (m := re.fullmatch(r"rank([0-9]{1,6})\.log", path.name))]
    return sorted(found)


def _runs_through_warm(command: list[str], python: str) -> bool:
    """A Python script: run by ``gandiva.job.warm``, forked warm or started cold."""
    return len(command) > 1 and command[0] == python and command[1].endswith(".py")


def _cold(command: list[str], python: str) -> list[str]:
    """A cold start of a Python script goes through ``gandiva.job.warm --cold``, so it ends
    as a warm one does (its process groups destroyed before the interpreter finalizes)."""
    if _runs_through_warm(command, python):
        return [python, "-m", "gandiva.job.warm", "--cold", *command[1:]]
    return command


def _stat(path: str) -> list[str] | None:
    """The fields of a /proc ``stat`` file after the command's name (from the state on),
    None if the process is gone."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux), to tell a process from a later one that
    reuses its number."""
    fields = _stat(f"/proc/{pid}/stat")
    return fields[19] if fields else None


class Looks:
    """The time between one thread's looks at something; a gap over ``AWAY_S`` is this
    process stopped (SIGSTOP, a paused VM), and no one else's delay or silence."""

    def __init__(self) -> None:
        self._at = time.monotonic()

    def away(self) -> float:
        """How long this process was stopped since the last look (0.0: it was not)."""
        now = time.monotonic()
        gap, self._at = now - self._at, now
        return gap if gap > AWAY_S else 0.0


def _record_pids(path: Path, pids: list[int]) -> None:
    path.write_text("".join(f"{pid} {_start_time(pid)}\n" for pid in pids))


def _kill_leftovers(path: Path) -> None:
    """Kill what an earlier agent of this job left running: after an agent crash, a job it
    had stopped with SIGSTOP never notices that its channel closed. Only processes whose
    number and start time both match are killed, never a stranger that reuses the number."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        pid, _, started = line.partition(" ")
        if pid.isdigit() and _start_time(int(pid)) == started:
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _idle_for(job: _Job, seconds: float) -> bool:
    """Whether the main threads of the job's running ranks have used no CPU time for
    ``seconds`` (asked at each look; a rank that computes, or one stopped by signal, starts
    the count again). The main thread alone: gloo's own threads tick on (its transport
    loop, a worker polling for the GIL) while the main thread sits in a join."""
    if job.signalled:
        job.idle_since = None
        return False
    used = sum(_cpu_ticks(r.proc.pid) for r in job.ranks if r.exit is None)
    now = time.monotonic()
    if job.idle_since is None or used != job.cpu_seen:
        job.idle_since, job.cpu_seen = now, used
        return False
    return now - job.idle_since >= seconds


def _cpu_ticks(pid: int) -> int:
    """The CPU time (user and system, in clock ticks) of ``pid``'s main thread so far."""
    fields = _stat(f"/proc/{pid}/task/{pid}/stat")
    return int(fields[11]) + int(fields[12]) if fields else 0


def _remove_left_tmp(record: Path) -> None:
    """Remove the TMPDIR an earlier agent recorded for a job (``tmp`` in the job's directory,
    the agent's own): only one of the agent's names, never another path."""
    try:
        tmp = Path(record.read_text())
        record.unlink()
    except OSError:
        return
    if tmp.parent == Path(tempfile.gettempdir()) and re.fullmatch(r"gandiva-\w+", tmp.name):
        shutil.rmtree(tmp, ignore_errors=True)


def torchrun_env(job_id: str, gang: Gang, local_rank: int, local_world: int,
                 restarts: int, max_restarts: int) -> dict[str, str]:
    """torchrun's contract with the processes it starts, for one rank: what scripts,
    Lightning (``TorchElasticEnvironment``) and ``init_process_group("env://")`` read.
    ``TORCHELASTIC_USE_AGENT_STORE``: the agent hosts the rendezvous store (``_store``),
    so no rank has to bind a port that was free a moment ago."""
    rank = str(gang.first + local_rank)
    return {"RANK": rank, "LOCAL_RANK": str(local_rank), "ROLE_RANK": rank,
            "WORLD_SIZE": str(gang.world), "LOCAL_WORLD_SIZE": str(local_world),
            "ROLE_WORLD_SIZE": str(gang.world), "ROLE_NAME": "default",
            "GROUP_RANK": str(gang.node), "NODE_RANK": str(gang.node),
            "GROUP_WORLD_SIZE": str(gang.nodes),
            "MASTER_ADDR": gang.master_addr, "MASTER_PORT": str(gang.master_port),
            "TORCHELASTIC_RUN_ID": job_id, "TORCHELASTIC_RESTART_COUNT": str(restarts),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "True"}


# what torchrun sets: a one-process job that is not torchrun's inherits none of it
TORCHRUN_VARIABLES = tuple(torchrun_env("", Gang(0, 1, "", 0), 0, 1, 0, 0))


def _store(host: str = "0.0.0.0") -> Any:
    """A rendezvous store (torch's TCPStore server) on a port the kernel picked and that
    stays bound while the job runs: torchrun's agent store. Picking a free port, closing
    it and handing the number to rank 0 lets another process take it in between. ``host``:
    what it listens on (all interfaces for a gang over several nodes)."""
    from torch.distributed import TCPStore

    return TCPStore(host, 0, is_master=True, wait_for_workers=False)
