"""The driver: the scheduler's loop on a wall clock, driving real jobs through ``Nodes``.

The same loop as the simulator (``scheduler.Scheduler``), on a wall clock: arrivals at their
submit times, the policy's timers (``Wake``), and what the nodes see (profile samples,
completions, failures) become events; the policy's actions go to the nodes, which carry them
out off the loop (``courier``). The nodes are this machine's agent by default (the ``local``
backend: one device per GPU, or CPU slots standing in for GPUs, one core each, so that the
whole system runs anywhere), Ray's (``ray``) or hollow ones (``hollow``). What readers see is
in ``explain``; what users ask of their jobs (``requests``) is a queue the loop drains. It
runs on a ``clock``: the wall clock, or a virtual one that tests move.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from gandiva import actions as A
from gandiva import events as E
from gandiva.backends.clock import NO_WAIT, Clock, WallClock
from gandiva.backends.courier import Courier, Task
from gandiva.backends.explain import Seen
from gandiva.backends.nodes import AgentEvent, Launch, Nodes
from gandiva.backends.requests import Request, Requests
from gandiva.job import wire
from gandiva.node.agent import ACK_TIMEOUT_S, BAD_REPORT, HANG_S, STRAGGLED, Agent
from gandiva.node.devices import HEADROOM
from gandiva.node.zygote import Zygote
from gandiva.run import COUNTED, JobRun, RunResult, no_counts
from gandiva.scheduler import Scheduler
from gandiva.spec import TERMINAL, JobSpec, JobState
from gandiva.state import GPU, Cluster, JobStatus, Node


def detect_devices(slots: int | None = None, threads: int = 1) -> tuple[list[str], str, float]:
    """This machine's devices: (names, type, memory per device in GB that jobs may use)."""
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    if gpus:
        n = min(gpus, slots) if slots else gpus
        props = torch.cuda.get_device_properties(0)
        kind = device_type(props.name)
        usable = props.total_memory / 2**30 * (1 - HEADROOM)  # what jobs may count on
        return [f"cuda:{i}" for i in range(n)], kind, usable
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = slots or max(1, (cores or 1) // threads)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [f"cpu:{i}" for i in range(n)], "CPU", ram / n


def device_type(name: str) -> str:
    """A GPU's type from CUDA's name for it: "NVIDIA H100 80GB HBM3" is an H100; a MIG
    instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") a type of its own, ``<gpu>-<profile>``
    (A100-SXM4-40GB-1g.5gb): a seventh of the GPU is not the GPU."""
    words = [w for w in name.split() if w not in ("NVIDIA", "Tesla")]  # (brands)
    kind = words[0].upper() if words else "GPU"
    if "MIG" in words[1:-1]:
        kind += "-" + words[words.index("MIG") + 1]
    return kind


def one_node(devices: list[str], kind: str, memory_gb: float) -> Cluster:
    gpus = [GPU(i, 0, i, 0, kind, memory_gb) for i in range(len(devices))]
    return Cluster([Node(0, 0, [g.id for g in gpus])], gpus)


# what a job's processes said (the others: the loop's and its nodes' own)
JOB_EVENTS = ("profile", "started", "suspended", "restarted", "checkpoint-refused", "done",
              "failed", "crashed")


@dataclass
class JobRecord(JobRun):
    """A job's run (``first_feedback``: when it had done ``feedback_steps`` mini-batches),
    and what it reports while it runs."""

    steps: int = 0
    metrics: dict = field(default_factory=dict)
    devices: tuple[int, ...] = ()
    time_limit: float | None = None  # seconds of running (time-sliced turns not counted)
    ran: float = 0.0  # seconds it ran before ``running_since``
    running_since: float | None = None
    profile: dict = field(default_factory=dict)  # its latest profile sample
    profiled_at: float = float("-inf")  # when a profile summary was last reported
    refused: str = ""  # why its disk refused its last checkpoint, if it ever did

    def running_time(self, now: float) -> float:
        return self.ran + (now - self.running_since if self.running_since is not None else 0.0)


SNAPSHOT_EVERY_S = 0.2  # under load, explain, the cluster view and metrics read a copy
# at most this old (copying the state of thousands of queued jobs at every event would cost
# the loop more than the events)
SNAPSHOT_SHARE = 10  # ... and when caught up, not sooner than 10x the last one's cost
SAMPLE_EVERY_S = 1.0  # utilisation samples
SAMPLES_KEPT = 86_400  # a day of them
PROFILE_EVERY_S = 60.0  # a job's profile summary is reported (and stored) this often
LOOP_STALL_S = 120.0  # the loop waits for no node: silent this long, it is stuck
# a healthy node ends any action within the agent's wait for a mini-batch boundary
# (ACK_TIMEOUT_S), a process's stop and a start; longer, the action is reported overdue
ACTION_DEADLINE_S = 2 * ACK_TIMEOUT_S + 30.0
CLOSE_WAIT_S = 10.0  # at the end of a run, for actions still under way
# node events (confirmations, profiles, ends) handled in one step of the loop, their changes
# stored in one transaction at its end: after a round of thousands of actions, a transaction
# per confirmation was most of the loop's time (benchmarks/scale.py)
AGENT_EVENTS_PER_STEP = 256
# actions carried out at once: each mostly waits on a job or a node, and actions that share
# no device run at the same time, so up to one per device is useful; at least 32 (a small
# machine's restarts), at most 512 threads. An action that blocks (the agent's, Ray's) holds
# a thread while under way; one answered with a Future (hollow nodes) holds none, so a round
# of thousands of actions on 1,000 servers is not bounded by threads (benchmarks/scale.py).
ACTION_WORKERS = (32, 512)


@dataclass(eq=False)
class _Batch:
    """The actions one event led to, until the last is carried out."""

    event: E.Event
    actions: int
    decided: float  # on the driver's clock
    left: int  # not yet carried out


def named(what: object) -> str:
    """An action's name as metrics and reasons spell it ("suspend"), or a user's request."""
    return type(what).__name__.lower() if isinstance(what, A.Action) else str(what)


class Observer:
    """What a server measures of the loop (``gandiva.server.metrics`` fills these in)."""

    def decision(self, event: E.Event, seconds: float) -> None:
        """The scheduler handled ``event``: the policy decided, and its actions were handed
        to the nodes (not waited for; see ``action`` and ``settled``)."""

    def action(self, action: A.Action, seconds: float) -> None:
        """A node carried out ``action``; ``seconds`` is how long it took there."""

    def overdue(self, action: object) -> None:
        """A node has not carried out ``action`` (or a user's request) in time."""

    def settled(self, event: E.Event, actions: int, seconds: float) -> None:
        """Every one of the ``actions`` that ``event`` led to has been carried out,
        ``seconds`` after the decision: for a time-slicing round (a ``Tick``), the round's
        duration."""


class Driver:
    """Runs ``jobs`` (spec, launch) under ``policy`` on this machine; ``run()`` blocks until
    every job has finished or failed."""

    def __init__(self, policy, workdir: Path, slots: int | None = None, threads: int = 1,
                 checkpoint_every_s: float = 300.0, feedback_steps: int = 100,
                 max_restarts: int | None = None, nodes: Nodes | None = None,
                 clock: Clock | None = None, hang_s: float = HANG_S,
                 zygote: Zygote | None = None) -> None:
        """``nodes``: what runs the jobs (``gandiva.backends.nodes``: the ray backend's
        ``RayNodes``, ``HollowNodes``); by default one ``Agent`` on this machine's devices,
        forking its jobs from ``zygote`` where one is shared (see ``Agent``).
        ``clock``: the wall clock by default; hollow nodes in tests share a virtual one."""
        self.clock = clock or WallClock()
        if nodes is None:
            devices, kind, memory = detect_devices(slots, threads)
            self.cluster = one_node(devices, kind, memory)
            extra = {} if max_restarts is None else {"max_restarts": max_restarts}
            nodes = Agent(workdir, devices, threads=threads, hang_s=hang_s,
                          checkpoint_every_s=checkpoint_every_s, memory_gb=memory,
                          zygote=zygote, **extra)
        else:
            self.cluster = nodes.cluster()
        self.devices = nodes.devices
        self.policy = policy
        self.agent: Nodes = nodes
        self.scheduler = Scheduler(self.cluster, policy, self)
        self.feedback_steps = feedback_steps
        self.launches: dict[str, Launch] = {}
        self.records: dict[str, JobRecord] = {}
        self.pending: list[tuple[float, int, JobSpec]] = []
        self.wakes: list[float] = []
        # (time, action, seconds it took): the newest ones, for a run's result
        self.actions: deque[tuple[float, A.Action, float]] = deque(maxlen=100_000)
        self.counts = no_counts()  # every action carried out, by kind
        # device -> job -> (since, shared): the timeline's segments not yet closed
        self._open: dict[int, dict[str, tuple[float, bool]]] = {}
        # actions take time here (jobs are in transition), and _track looks at the devices
        # whose jobs changed
        self.cluster.driven_by(confirms=True, watched=True)
        self._next_overdue_check = 0.0
        self._snapshot_cost = 0.0
        self.timeline: list[tuple[int, str, float, float, bool]] = []
        self.t0 = self.clock.now()
        # called with a job's record and what happened to it ("running", "suspended",
        # "migrated", "resized", "restarted", "held", "done", "failed", "cancelled",
        # "feedback", "checkpoint-refused"): where a server persists it
        self.on_change: Callable[[JobRecord, str], None] | None = None
        # called before actions go to the nodes, after the changes that describe them were
        # reported through on_change: where a server stores them (in one transaction)
        self.on_flush: Callable[[], None] | None = None
        # called with a job's record and the metric points of a profile report (name ->
        # [[step, value], ...]): where a server keeps learning curves and runs sweeps
        self.on_points: Callable[[JobRecord, dict[str, list[list[float]]]], None] | None = None
        self._outbox: list[tuple[str, object, Callable[[], Future | None], tuple[int, ...]]] = []
        self.observer = Observer()
        low, high = ACTION_WORKERS
        self.courier = Courier(self._acted, workers=min(high, max(low, len(self.devices))),
                               clock=self.clock)
        self.inflight: dict[str, Task] = {}  # job -> its latest action, until confirmed
        self.overdue: set[str] = set()
        self._sent: list[Task] | None = None  # tasks sent while an event is being handled
        self._batches: dict[Task, _Batch] = {}  # each task's event, until carried out
        self._lock = threading.Lock()  # submit may come from other threads while run() runs
        self._stopping = False
        self._drain_s = 0.0
        self._beat: float | None = None  # when the loop last went round (None: not running)
        self.longest_pause = 0.0  # the longest time between two turns of the loop
        self.requests = Requests()  # what users ask of their jobs, until the loop takes it
        self._limited: dict[str, None] = {}  # jobs with a time limit, not yet ended
        # jobs withdrawn before their node started them: an action sent before must not
        self._withdrawn: set[str] = set()
        self.samples: deque[tuple[float, int, float]] = deque(maxlen=SAMPLES_KEPT)
        self._next_sample = 0.0
        self._dirty = True
        self._snapshot_at = float("-inf")
        self.seen = Seen(self.cluster, policy, self.devices)  # what readers see

    def now(self) -> float:
        return self.clock.now() - self.t0

    def submit(self, spec: JobSpec, launch: Launch, time_limit: float | None = None,
               held: bool = False) -> None:
        """Queue a job to arrive at ``spec.submit_time`` (seconds after ``run`` starts; at
        once if that has passed). Safe to call from another thread while ``run`` runs.
        A job that has run ``time_limit`` seconds (its turns on a device, not its waits)
        is stopped and fails, as Slurm's TIMEOUT. A ``held`` job waits for ``release``."""
        if not launch.command:
            raise ValueError(f"job {spec.id!r}: command is empty; give the program to run, "
                             "e.g. ['{python}', 'train.py']")
        if launch.cwd is not None and not Path(launch.cwd).is_dir():
            raise ValueError(f"job {spec.id!r}: cwd {str(launch.cwd)!r} is not a directory")
        if spec.num_gpus < 1:
            raise ValueError(f"job {spec.id!r}: num_gpus={spec.num_gpus}; ask for at least 1")
        if spec.num_gpus > len(self.devices):
            raise ValueError(f"job {spec.id!r}: num_gpus={spec.num_gpus} but this machine has "
                             f"{len(self.devices)} devices; ask for at most that many")
        with self._lock:
            if spec.id in self.launches:
                raise ValueError(f"job {spec.id!r} submitted twice; give each job its own id")
            self.launches[spec.id] = launch
            self.records[spec.id] = JobRecord(spec, spec.submit_time, time_limit=time_limit,
                                              status=JobState.HELD if held else JobState.QUEUED)
            if not held:
                heapq.heappush(self.pending, (spec.submit_time, len(self.launches), spec))
            if time_limit is not None:
                self._limited[spec.id] = None
        self.agent.events.put(AgentEvent("wake", spec.id))  # the loop may be waiting

    # ---- what users ask of a job (safe from any thread; see ``requests``) ----------------
    def has(self, job_id: str) -> bool:
        """Was this job submitted (safe from any thread)?"""
        return job_id in self.records

    def ask(self, *requests: Request) -> None:
        """Have the loop carry out ``requests`` together, at its next step (in the order
        ``requests.in_order`` gives)."""
        for r in requests:
            if r.job_id not in self.records:
                raise ValueError(f"no job {r.job_id!r}")
        self.requests.put(*requests)
        self.agent.events.put(AgentEvent("wake", ""))  # the loop may be waiting

    def cancel(self, job_id: str, reason: str = "cancelled") -> None:
        """Cancel a job, queued, running, suspended or held; it reports "cancelled", with
        ``reason`` (e.g. a sweep's, for the trial it stopped)."""
        self._ask("cancel", job_id, reason)

    def hold(self, job_id: str) -> None:
        """Take a job out of scheduling until ``release``: a running or suspended job
        checkpoints at its next mini-batch boundary and its processes exit, so it holds no
        device and no host memory; it reports "held"."""
        self._ask("hold", job_id)

    def release(self, job_id: str) -> None:
        """Give a held job back to the scheduler; it restores from its checkpoint."""
        self._ask("release", job_id)

    def set_priority(self, job_id: str, priority: int) -> None:
        self._ask("priority", job_id, priority)

    def _ask(self, what: str, job_id: str, arg: object = None) -> None:
        self.ask(Request(what, job_id, arg))

    def _carry_out(self) -> None:
        """(The loop.) Everything users asked since the last step, then the time limits."""
        for r in self.requests.drain():
            rec = self.records[r.job_id]
            if rec.status in TERMINAL:
                continue
            if r.what == "cancel":
                self._end(rec, JobState.CANCELLED, str(r.arg or "cancelled"))
            elif r.what == "hold" and rec.status != JobState.HELD:
                self.set(rec, "held", JobState.HELD)  # on record before its node is told
                self._withdraw(rec, how="held")
            elif r.what == "release" and rec.status == JobState.HELD:
                spec = dataclasses.replace(rec.spec, submit_time=self.now())
                with self._lock:  # it arrives again
                    heapq.heappush(self.pending, (spec.submit_time, len(self.launches), spec))
                self.set(rec, "released", JobState.QUEUED)
            elif r.what == "priority":
                priority = int(r.arg)  # type: ignore[call-overload]
                rec.spec = dataclasses.replace(rec.spec, priority=priority)
                if self._in_state(r.job_id):
                    self.handle(E.PriorityChange(self.now(), r.job_id, rec.spec.priority))
        self._time_limits()

    def _time_limits(self) -> None:
        """Stop the jobs that ran past their limit (its turns on a device counted, not its
        waits, as Slurm's TIMEOUT): only the jobs that have one, not every running job."""
        now = self.now()
        with self._lock:  # (the API's threads submit meanwhile)
            limited = list(self._limited)
        for job_id in limited:
            rec = self.records[job_id]
            if rec.status in TERMINAL:
                with self._lock:
                    del self._limited[job_id]
            elif rec.running_since is not None and rec.running_time(now) >= rec.time_limit:
                self._end(rec, JobState.FAILED,
                          f"time limit reached: it ran {rec.time_limit:g} s")

    def _end(self, rec: JobRecord, state: JobState, reason: str) -> None:
        """Stop the job for good, in ``state`` for ``reason``."""
        rec.finish = self.now()
        rec.reason = reason
        # on record before its node is told: a server that crashes in between must not
        # bring a cancelled job back
        self.set(rec, state, state)
        self._withdraw(rec, how=state)

    def _withdraw(self, rec: JobRecord, how: str) -> None:
        """Take the job out of the arrivals, its node and the cluster state: held jobs
        checkpoint first; cancelled and timed-out ones are killed."""
        job_id, nodes = rec.spec.id, self.agent
        with self._lock:  # it will not arrive
            self.pending = [p for p in self.pending if p[2].id != job_id]
            heapq.heapify(self.pending)
        stop = nodes.park if how == "held" else nodes.kill

        def withdraw() -> Future | None:
            if job_id in nodes.jobs:
                return stop(job_id)
            self._withdrawn.add(job_id)  # not started yet
            return None
        self.send(job_id, how, withdraw, rec.devices)
        self._stopped_running(rec)
        if self._in_state(job_id):
            self.handle(E.Departure(self.now(), job_id, how="cancelled"))

    def _in_state(self, job_id: str) -> bool:
        """Whether the cluster state has the job, not yet ended."""
        job = self.cluster.jobs.get(job_id)
        return job is not None and job.status not in (JobStatus.DONE, JobStatus.KILLED)

    def _stopped_running(self, rec: JobRecord) -> None:
        if rec.running_since is not None:
            rec.ran += self.now() - rec.running_since
            rec.running_since = None

    def alive(self) -> bool:
        """Whether ``run`` is going round: it waits at most 0.5 s a step, and an action may
        wait for a job's mini-batch boundary (the agent's ACK_TIMEOUT_S), so a loop silent
        for longer than LOOP_STALL_S is stuck."""
        return self._beat is not None and self.clock.now() - self._beat < LOOP_STALL_S

    def stop(self, drain_s: float = 0.0) -> None:
        """Make ``run`` return at its next step. With ``drain_s`` (a server stopping for an
        upgrade), it first has every job that has processes checkpoint at its next
        mini-batch boundary and stop, all at once, waiting at most ``drain_s`` in all; a job
        that does not make it (no job library, a mini-batch longer than that) is stopped by
        signal as before, losing the work since its last checkpoint. A restarted server
        resumes the others from the step they stopped at."""
        self._drain_s = drain_s
        self._stopping = True
        self.agent.events.put(AgentEvent("wake", ""))

    def _drain(self, budget_s: float) -> None:
        """Park every job that has (or is about to have) processes, all at once, each after
        the actions already under way on it."""
        live = [rec for rec in self.records.values() if rec.status not in TERMINAL
                and (rec.spec.id in self.agent.jobs or rec.spec.id in self.inflight)]
        for rec in live:
            self.send(rec.spec.id, "drain", partial(self.agent.park, rec.spec.id),
                       rec.devices)
        self._flush()
        tasks = {rec.spec.id: self.inflight[rec.spec.id] for rec in live}
        self.courier.wait(budget_s)
        for rec in live:
            done = tasks[rec.spec.id].ended
            self.set(rec, "stopped-for-shutdown" if done else "shutdown-timeout")
        self._flush()

    def set(self, rec: JobRecord, what: str, status: JobState | None = None) -> None:
        if status is not None:
            rec.status = status
            if status == JobState.RUNNING and rec.running_since is None:
                rec.running_since = self.now()
            elif status != JobState.RUNNING:
                self._stopped_running(rec)
        self._dirty = True
        if self.on_change is not None:
            self.on_change(rec, what)

    # ---- the loop -----------------------------------------------------------------------
    def run(self, timeout: float | None = None, until_idle: bool = True) -> RunResult:
        """The loop; returns once every job has finished or failed (``until_idle``), or, as
        a server's loop (``until_idle=False``), when ``stop`` is called."""
        self.t0 = self.clock.now()
        try:
            while not self._stopping and (not until_idle or self._unfinished()):
                beat = self.clock.now()
                if self._beat is not None:
                    self.longest_pause = max(self.longest_pause, beat - self._beat)
                self._beat = beat
                if timeout is not None and self.now() > timeout:
                    raise TimeoutError(f"jobs still running after {timeout:.0f} s")
                self._step()
            if self._drain_s > 0:
                self._drain(self._drain_s)
        finally:
            self._beat = None
            # actions still under way (on jobs that ended as they were sent) get a moment;
            # closing the agent stops whatever is left
            self.courier.close(timeout=CLOSE_WAIT_S)
            self.agent.close()
        self._close_segments()
        return RunResult(self.policy.name, self.devices, list(self.records.values()),
                         self.actions, self.timeline, (0.0, self.now()), dict(self.counts))

    def _unfinished(self) -> bool:
        with self._lock:
            return any(r.status not in TERMINAL for r in self.records.values())

    def _step(self) -> None:
        deadlines = [self.pending[0][0]] if self.pending else []
        if self.wakes:
            deadlines.append(self.wakes[0])
        if self._dirty:
            deadlines.append(self._snapshot_at + SNAPSHOT_EVERY_S)
        wait = max(0.0, min([0.5, *(d - self.now() for d in deadlines)]))
        try:  # what the nodes said, a batch at a time: its changes are stored together
            self._on_agent(self.clock.get(self.agent.events, self.clock.now() + wait))
            for _ in range(AGENT_EVENTS_PER_STEP - 1):
                self._on_agent(self.clock.get(self.agent.events, NO_WAIT))
        except queue.Empty:
            pass
        self._carry_out()  # what users asked for; time limits
        while True:
            with self._lock:
                if not self.pending or self.pending[0][0] > self.now():
                    break
                _, _, spec = heapq.heappop(self.pending)
            self.records[spec.id].submit = self.now()
            self.handle(E.Arrival(self.now(), spec))
        if self.wakes and self.wakes[0] <= self.now():
            while self.wakes and self.wakes[0] <= self.now():
                heapq.heappop(self.wakes)
            self.handle(E.Tick(self.now()))
        if self.inflight and self.clock.now() >= self._next_overdue_check:
            self._next_overdue_check = self.clock.now() + 1.0  # a deadline of minutes
            self._check_overdue()
        if self.now() >= self._next_sample:
            self._sample()
        self._flush()  # what users asked for, what nodes confirmed
        since = self.now() - self._snapshot_at
        if self._dirty and (since >= SNAPSHOT_EVERY_S or (
                self.agent.events.empty() and since >= SNAPSHOT_SHARE * self._snapshot_cost)):
            # when the loop has caught up, or under load at this rate; and a costly one (many
            # jobs) takes at most 1/SNAPSHOT_SHARE of the loop's time, however often it idles
            t = time.perf_counter()
            self._dirty, self._snapshot_at = False, self.now()
            self.seen.take()
            self._snapshot_cost = time.perf_counter() - t

    def _sample(self) -> None:
        """Utilisation now: devices holding a job, and the mean utilisation the running
        jobs report (a packed device counts its jobs' sum, at most 1)."""
        c = self.cluster
        busy = [min(1.0, sum(c.jobs[j].utilization or 0.0 for j in g.jobs)) for g in c.gpus]
        self.samples.append((time.time(), c.allocated_count(), sum(busy) / len(busy)))
        self._next_sample = self.now() + SAMPLE_EVERY_S

    def _on_agent(self, ev: AgentEvent) -> None:
        """A node's event, handled; one about a job that cannot be handled (what the job
        reported) fails that job, not the loop."""
        try:
            self._heard(ev)
        except Exception as e:
            rec = self.records.get(ev.job_id) if ev.kind in JOB_EVENTS else None
            if rec is None or rec.status in TERMINAL:
                raise  # the loop's own fault: not one job's
            self._end(rec, JobState.FAILED,
                      f"{BAD_REPORT} its {ev.kind} event could not be handled: {e!r}")

    def _heard(self, ev: AgentEvent) -> None:
        if ev.kind == "acted":
            self._confirmed(ev)
            return
        if ev.kind == "node-lost":
            self._node_lost(ev.data["node"], ev.data["jobs"])
            return
        if ev.kind == "node-joined":
            if ev.data["node"] == len(self.cluster.nodes):  # not in the state when it began
                self.handle(E.Join(self.now(), ev.data["gpus"], ev.data["kind"],
                                    ev.data["memory_gb"]))
            return
        rec = self.records.get(ev.job_id)
        if rec is None:
            return
        now = self.now()
        if ev.kind == "profile":
            p: wire.Profile = ev.data
            rec.steps = p.step
            rec.metrics.update(p.metrics)
            if p.series and self.on_points is not None:
                self.on_points(rec, p.series)
            rec.profile = {"mini_batch_time": p.mini_batch_time, "memory_gb": p.memory_gb,
                           "utilization": p.utilization}
            if rec.first_feedback is None and rec.steps >= self.feedback_steps:
                rec.first_feedback = now
                self.set(rec, "feedback")
            if now - rec.profiled_at >= PROFILE_EVERY_S:
                rec.profiled_at = now
                self.set(rec, "profile")
            job = self.cluster.jobs.get(ev.job_id)
            if job is not None and job.status is JobStatus.RUNNING:
                self.handle(E.ProfileSample(now, ev.job_id, p.mini_batch_time,
                                             p.memory_gb, p.utilization, p.step))
        elif ev.kind == "out-of-memory":  # a packed job outgrew its share: not a crash
            rec.reason = ev.data.get("reason", "")
            self.set(rec, "out-of-memory")
            job = self.cluster.jobs.get(ev.job_id)
            if job is not None and job.status is JobStatus.RUNNING:
                self.handle(E.OutOfMemory(now, ev.job_id))
        elif ev.kind == "suspended":  # what its processes hold while suspended (NVML)
            rec.profile = {**(rec.profile or {}), "held_gb": ev.data.get("held_gb")}
        elif ev.kind == "restarted":
            rec.restarts += 1
            rec.reason = ev.data.get("reason", "")
            self.set(rec, "restarted")
        elif ev.kind == "checkpoint-refused":  # reported and stored; the job's state stays
            rec.refused = ev.data.get("reason", "")
            self.set(rec, "checkpoint-refused")
        elif ev.kind in ("done", "failed"):
            if rec.status == JobState.CANCELLED:
                return  # it ended as it was being cancelled: cancelled it stays
            rec.finish = now
            rec.reason = ev.data.get("reason", "")
            if ev.kind == "done":
                rec.steps = ev.data.get("step", rec.steps)
                if ev.data.get("stragglers"):
                    rec.reason = (f"{STRAGGLED} {ev.data['stragglers']} rank(s) that had "
                                  "finished their training hung on the way out")
                if rec.first_feedback is None:
                    rec.first_feedback = now
            self.set(rec, ev.kind, JobState(ev.kind))
            job = self.cluster.jobs.get(ev.job_id)
            if job is not None and job.status.value not in ("done", "killed"):
                self.handle(E.Departure(now, ev.job_id, how=ev.kind))

    def _node_lost(self, node: int, jobs: list[str]) -> None:
        """A machine went away: its jobs go back to placement, and restart elsewhere from
        their last checkpoints (the policy decides where); the others carry on."""
        for job_id in jobs:
            rec = self.records.get(job_id)
            if rec is not None and rec.status not in TERMINAL and rec.status != JobState.HELD:
                rec.restarts += 1
                rec.reason = f"node {node} was lost"
                self.set(rec, "node-lost", JobState.QUEUED)
        if self.cluster.nodes[node].up:
            self.counts["failures"] += 1
            self.handle(E.Failure(self.now(), node))

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0, size: int = -1) -> bytes:
        """The job's output (one rank's) from byte ``offset``, across its restarts: all of
        the rest, or at most ``size`` bytes."""
        return self.agent.read_log(job_id, rank, offset, size)

    def log_size(self, job_id: str, rank: int = 0) -> int:
        return self.agent.log_size(job_id, rank)

    def handle(self, event: E.Event) -> None:
        t = time.perf_counter()
        outer, self._sent = self._sent, []
        if isinstance(event, E.Arrival):
            self.seen.touch(event.job.id)
        elif isinstance(event, E.Failure | E.Join):
            self.seen.touch(None)  # many jobs at once
        elif hasattr(event, "job_id"):
            self.seen.touch(event.job_id)
        try:
            self.scheduler.handle(event)
            if self._outbox:  # else what changed is stored at the end of the step
                self._flush()
        finally:
            sent, self._sent = self._sent, outer
        self.observer.decision(event, time.perf_counter() - t)
        if sent:  # settled when the last of them is carried out
            batch = _Batch(event, len(sent), self.clock.now(), len(sent))
            for task in sent:
                self._batches[task] = batch
        self._track()
        self._dirty = True

    # ---- why is my job pending? ---------------------------------------------------------
    def view(self) -> dict:
        """Who is on which device, and who waits its turn where (see ``explain.Seen``)."""
        return self.seen.view()

    def explain(self, job_id: str, shown: Callable[[str], str] = str) -> dict:
        """The job's state, and why it is not running, in words (``shown``: how other jobs
        are named in them)."""
        rec = self.records.get(job_id)
        if rec is None:
            raise ValueError(f"no job {job_id!r}")
        return self.seen.explain(job_id, rec.status, rec.reason, rec.devices, shown)

    # ---- the body -----------------------------------------------------------------------
    def execute(self, action: A.Action, cluster: Cluster) -> None:
        """Hand ``action`` to the node that runs the job and go on (see ``courier``): what it
        means for the job is reported at once (``on_change``: a server stores it); the
        node's confirmation comes back as an agent event, and ends the job's transition."""
        if isinstance(action, A.Wake):
            heapq.heappush(self.wakes, action.time)
            return
        agent, job = self.agent, action.job_id
        self.seen.touch(job)
        rec = self.records[job]
        before = rec.devices
        if isinstance(action, (A.Place, A.Resume, A.Pack)):
            rec.devices = action.gpus
            rec.start = rec.start or self.now()
            self.set(rec, "running", JobState.RUNNING)
            launch, gpus, fresh = self.launches[job], action.gpus, isinstance(action, A.Place)

            def do() -> Future | None:
                if not fresh and job in agent.jobs:
                    return agent.resume(job, gpus)
                if fresh:
                    self._withdrawn.discard(job)
                if fresh or not (job in agent.ended or job in self._withdrawn):
                    return agent.start(job, launch, gpus)  # a start, or packed before it ran
                return None  # it finished meanwhile; its Departure is on its way
        elif isinstance(action, (A.Suspend, A.Unpack)):
            self.set(rec, "suspended", JobState.SUSPENDED)
            do = partial(agent.suspend, job)
        elif isinstance(action, (A.Migrate, A.Grow, A.Shrink)):
            rec.devices = action.gpus
            self.set(rec, "migrated" if isinstance(action, A.Migrate) else "resized")
            do = partial(agent.restart, job, action.gpus)
        elif isinstance(action, A.Kill):
            rec.reason = "killed"
            rec.finish = self.now()
            self.set(rec, "failed", JobState.FAILED)
            do = partial(agent.kill, job)
        else:
            raise TypeError(f"the local backend cannot carry out {action!r}")
        self.send(job, action, do, (*before, *rec.devices))

    def send(self, job: str, what: object, do: Callable[[], Future | None],
              devices: tuple[int, ...]) -> None:
        """Give the node ``do`` (an action, or a user's request), after the job's earlier
        ones and after whatever was using ``devices``."""
        self._outbox.append((job, what, do, devices))

    def _flush(self) -> None:
        """Have what changed stored (``on_flush``: a server writes every change since the
        last flush in one transaction), then hand the actions over to the nodes: a job's
        new state is on record before its processes are touched."""
        if self.on_flush is not None:
            self.on_flush()
        outbox, self._outbox = self._outbox, []
        for job, what, do, devices in outbox:
            keys = {("job", job), *(("device", d) for d in devices)}
            self.inflight[job] = task = self.courier.send((job, what, self.now()), do, keys)
            if self._sent is not None:
                self._sent.append(task)

    def _acted(self, task: Task, seconds: float, error: BaseException | None) -> None:
        """(On the courier's thread.) The node has carried out ``task``: tell the loop."""
        self.agent.events.put(AgentEvent("acted", task.what[0], {
            "task": task, "seconds": seconds, "error": error}))

    def _confirmed(self, ev: AgentEvent) -> None:
        job, task, error = ev.job_id, ev.data["task"], ev.data["error"]
        _, what, sent = task.what
        seconds = ev.data["seconds"]
        if isinstance(what, A.Action):
            self.actions.append((sent, what, seconds))
            self.counts[COUNTED[type(what)]] += 1
            self.observer.action(what, seconds)
        batch = self._batches.pop(task, None)
        if batch is not None:
            batch.left -= 1
            if batch.left == 0:
                self.observer.settled(batch.event, batch.actions,
                                      self.clock.now() - batch.decided)
        rec = self.records.get(job)
        if error is not None and rec is not None and rec.status not in TERMINAL:
            # the node could not do it (e.g. a process that cannot start): the job fails,
            # as it would had its process died, rather than the loop
            rec.finish = self.now()
            rec.reason = f"its node could not {named(what)} it: {error}"
            self.set(rec, "failed", JobState.FAILED)
            state = self.cluster.jobs.get(job)
            if state is not None and state.status not in (JobStatus.DONE, JobStatus.KILLED):
                self.handle(E.Departure(self.now(), job, how="failed"))
        if self.inflight.get(job) is task:  # its latest: the job's transition is over
            del self.inflight[job]
            self.overdue.discard(job)
            if job in self.cluster.transitions:
                self.handle(E.Confirmed(self.now(), job))

    def _check_overdue(self) -> None:
        """An action its node has not carried out within ACTION_DEADLINE_S is a failure of
        that action (reported on the job, counted), not of the loop: the job stays in
        transition, and its devices wait for it, until the node answers."""
        now = self.clock.now()
        for job, task in list(self.inflight.items()):
            if job in self.overdue or now - (task.started or task.sent) < ACTION_DEADLINE_S:
                continue
            self.overdue.add(job)
            _, what, _ = task.what
            rec = self.records[job]
            rec.reason = (f"its node has not carried out {named(what)} for "
                          f"{ACTION_DEADLINE_S:g} s; its devices wait for it")
            self.set(rec, "action-overdue")
            self.observer.overdue(what)

    # ---- the timeline -------------------------------------------------------------------
    def _track(self) -> None:
        """Close and open timeline segments where who is on a device, or whether it is
        shared, changed (on the devices the state says were touched: not a scan of all)."""
        now, gpus, touched = self.now(), self.cluster.gpus, self.cluster.touched
        assert touched is not None  # (driven_by(watched=True))
        self.seen.track(touched)
        for g in touched:
            jobs = gpus[g].jobs
            live = {j: len(jobs) > 1 for j in jobs}
            open_here = self._open.setdefault(g, {})
            for j, (start, shared) in list(open_here.items()):
                if live.get(j) != shared:
                    del open_here[j]
                    self.timeline.append((g, j, start, now, shared))
            for j, shared in live.items():
                if j not in open_here:
                    open_here[j] = (now, shared)
        touched.clear()

    def _close_segments(self) -> None:
        now = self.now()
        for g, open_here in self._open.items():
            for j, (start, shared) in open_here.items():
                self.timeline.append((g, j, start, now, shared))
        self._open.clear()
