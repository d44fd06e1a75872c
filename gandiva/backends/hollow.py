"""Hollow nodes: servers with no processes, for running the real control plane at scale.

The server, its store, the loop and the policy are the real ones; only the nodes are hollow.
A hollow node answers every action after the time it takes on a real one, and runs each job
at the speed the performance model gives its model on its GPUs, reporting profiles and its
end as an agent does. So a thousand servers fit on one machine, and what is measured is the
control plane: decision latency, rounds, the API under load, the database.

What each action costs, from our own measurements (``gandiva/data/models.json`` through
``PerfModel``; see ``benchmarks/mechanisms.py`` for how they were taken):
- suspend: the wait for the job's next mini-batch boundary (uniform over one mini-batch of
  its loop), then half of ``suspend_resume_time`` of its checkpoint size (the paper's Fig 13);
- resume: the other half;
- migrate, grow, shrink: a boundary wait, then ``migration_time`` of its checkpoint size;
- start: ``START_S``, a process forked from the node's zygote setting up its model and data.

Every action answers asynchronously: it returns a ``Future`` that one timer thread completes
after the action's latency (``courier``), so a thousand servers' round holds no thread per
action under way, as a real node's agent would not. The timers run on a ``Clock``: the wall
clock, or the loop's virtual one in tests.

A job's command is ``hollow_launch(model, steps)``: what it trains and for how many steps of
its loop. Its log is empty: there is no process to write one.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from gandiva.backends.clock import INF, NO_WAIT, Clock, WallClock
from gandiva.backends.nodes import AgentEvent, Launch
from gandiva.job import wire
from gandiva.sim.perf import PerfModel, default_perf_model
from gandiva.state import Cluster

log = logging.getLogger("gandiva.hollow")
START_S = 1.0  # decision: a warm start to the first mini-batch (the fork itself: ~10 ms)
FIRST_PROFILE_STEPS = 20  # as the simulator: a profile once the job has warmed up
PROFILE_EVERY_S = 60.0  # then, while it runs, as the local backend stores them
COMMAND = "gandiva-hollow"


def hollow_launch(model: str, steps: int) -> Launch:
    """The command a hollow node runs: ``model`` for ``steps`` steps of its loop."""
    return Launch([COMMAND, model, str(steps)])


@dataclass
class _Job:
    id: str
    model: str
    steps: float  # of the job's loop, in all
    devices: tuple[int, ...]
    done: float = 0.0
    since: float | None = None  # running since (on the nodes' clock); None while suspended
    version: int = 0  # bumped at every change: timers set before are void


class HollowNodes:
    """``servers`` hollow servers of ``gpus`` GPUs of ``gpu_type``: the ``Nodes`` interface
    (see ``gandiva.backends.nodes``), with no processes."""

    def __init__(self, servers: int, gpus: int = 8, gpu_type: str = "V100",
                 perf: PerfModel | None = None, seed: int = 0, clock: Clock | None = None
                 ) -> None:
        self.clock = clock or WallClock()
        self.perf = perf or default_perf_model()
        self.gpu_type = gpu_type
        self._spec = f"{servers}x{gpus}:{gpu_type}"
        self.devices = [f"hollow{s}:{i}" for s in range(servers) for i in range(gpus)]
        self._per_server = gpus
        self.events: queue.Queue[AgentEvent] = queue.Queue()
        self.jobs: dict[str, _Job] = {}
        self.ended: set[str] = set()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        # (at, seq, kind, what): a job's "done" or "profile" (what: (job, version)), or an
        # action's "act" (what: (what it does, its future))
        self._timers: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._kick: queue.Queue[None] = queue.Queue()  # a timer was set
        self._closed = False
        self._thread = threading.Thread(target=self._run_timers, name="gandiva-hollow",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def parse(cls, spec: str) -> HollowNodes:
        """``SERVERSxGPUS[:TYPE]``, e.g. ``1000x8:V100``: read as a simulated cluster is."""
        if "+" in spec:
            raise ValueError("hollow servers are all alike: write one SERVERSxGPUS[:TYPE], "
                             "e.g. 1000x8:V100")
        built = Cluster.build(spec)  # its errors name the form and the known GPU types
        perf = default_perf_model()
        gpu_type = built.gpus[0].type
        if gpu_type not in perf.gpu_types:
            raise ValueError(f"no GPU type {gpu_type!r} in the performance model; use one of "
                             f"{', '.join(perf.gpu_types)}")
        return cls(len(built.nodes), len(built.nodes[0].gpus), gpu_type, perf)

    def cluster(self) -> Cluster:
        return Cluster.build(self._spec)

    # ---- what a job costs ---------------------------------------------------------------
    def _rate(self, job: _Job) -> float:
        """Steps of the job's loop per second on its devices (a step of a job of N GPUs is
        one mini-batch on each: Gavel's throughput rows, as the simulator counts them)."""
        return self.perf.throughput(job.model, self.gpu_type, len(job.devices))

    def _checkpoint_mb(self, job: _Job) -> float:
        return self.perf.profile(job.model).checkpoint_mb

    def _boundary_wait(self, job: _Job) -> float:
        with self._lock:
            return self._rng.uniform(0.0, 1.0 / self._rate(job))

    def server_of(self, device: int) -> int:
        return device // self._per_server

    def _servers(self, devices: tuple[int, ...]) -> set[int]:
        return {self.server_of(d) for d in devices}

    # ---- the Nodes interface ------------------------------------------------------------
    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...]) -> Future:
        if launch.command[:1] != [COMMAND] or len(launch.command) != 3:
            raise ValueError(f"job {job_id!r}: a hollow node runs only "
                             f"hollow_launch(model, steps), not {launch.command!r}")
        model, steps = launch.command[1], int(launch.command[2])
        self.perf.resolve(model)  # an unknown model fails the action, naming it

        def started() -> None:
            old = self.jobs.get(job_id)
            job = _Job(job_id, model, steps, tuple(devices), done=old.done if old else 0.0)
            self.jobs[job_id] = job
            self.ended.discard(job_id)
            self._run(job)
        return self._later(START_S, started)

    def suspend(self, job_id: str) -> Future | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return self._later(self._boundary_wait(job)
                           + self.perf.suspend_resume_time(self._checkpoint_mb(job)) / 2,
                           lambda: self._pause(job))

    def resume(self, job_id: str, devices: tuple[int, ...]) -> Future | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None

        def resumed() -> None:
            job.devices = tuple(devices)
            self._run(job)
        return self._later(self.perf.suspend_resume_time(self._checkpoint_mb(job)) / 2, resumed)

    def restart(self, job_id: str, devices: tuple[int, ...]) -> Future | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        across = self._servers(devices) != self._servers(job.devices)

        def moved() -> None:
            self._pause(job)
            job.devices = tuple(devices)
            self._run(job)
        return self._later(self._boundary_wait(job)
                           + self.perf.migration_time(self._checkpoint_mb(job), across), moved)

    def park(self, job_id: str) -> Future | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return self._later(self._boundary_wait(job), lambda: self._forget(job))

    def kill(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            with self._lock:
                self._forget(job)

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0, size: int = -1) -> bytes:
        return b""  # no process, no output

    def log_size(self, job_id: str, rank: int = 0) -> int:
        return 0

    def checkpoint_dir(self, job_id: str) -> None:
        return None  # no process, no checkpoint

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._kick.put(None)
        self._thread.join(timeout=5)
        with self._lock:
            left = [what[1] for _, _, kind, what in self._timers if kind == "act"]
            self._timers.clear()
        for future in left:  # actions never carried out: say so
            future.cancel()

    # ---- progress (under the lock) ------------------------------------------------------
    def _later(self, delay: float, then: Callable[[], None]) -> Future:
        """Do ``then`` (under the lock) ``delay`` seconds from now; the future completes
        after it, or with its error."""
        done: Future = Future()
        with self._lock:
            if self._closed:  # nobody would carry it out
                done.cancel()
                return done
            heapq.heappush(self._timers, (self.clock.now() + delay, next(self._seq), "act",
                                          (then, done)))
        self._kick.put(None)
        return done

    def _run(self, job: _Job) -> None:
        job.since = self.clock.now()
        job.version += 1
        rate = self._rate(job)
        self._timer(job.since + (job.steps - job.done) / rate, job, "done")
        self._timer(job.since + min(FIRST_PROFILE_STEPS / rate, PROFILE_EVERY_S), job, "profile")

    def _pause(self, job: _Job) -> None:
        if job.since is not None:
            job.done = min(job.steps, job.done + (self.clock.now() - job.since) * self._rate(job))
            job.since = None
        job.version += 1

    def _forget(self, job: _Job) -> None:
        self._pause(job)
        self.ended.add(job.id)  # first: a reader never sees it in neither
        self.jobs.pop(job.id, None)

    def _timer(self, at: float, job: _Job, kind: str) -> None:
        heapq.heappush(self._timers, (at, next(self._seq), kind, (job.id, job.version)))
        self._kick.put(None)

    def _run_timers(self) -> None:
        while True:
            acted: list[tuple[Future, BaseException | None]] = []
            with self._lock:
                if self._closed:
                    return
                now = self.clock.now()
                while self._timers and self._timers[0][0] <= now:
                    _, _, kind, what = heapq.heappop(self._timers)
                    if kind == "act":
                        then, future = what
                        try:
                            then()
                            acted.append((future, None))
                        except Exception as e:  # noqa: BLE001 - the action's error
                            acted.append((future, e))
                        continue
                    try:  # one job's trouble must not stop every node's clock
                        self._progress(kind, *what, now)
                    except Exception:  # noqa: BLE001
                        log.exception("hollow nodes: %s of job %s", kind, what[0])
                until = self._timers[0][0] if self._timers else INF
            for future, error in acted:  # outside the lock: the courier goes on from here
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
            if not acted:
                self._sleep(until)

    def _sleep(self, until: float) -> None:
        """Until the clock reads ``until``, or a timer is set (then every such kick at once)."""
        try:
            self.clock.get(self._kick, until)
            while True:
                self.clock.get(self._kick, NO_WAIT)
        except queue.Empty:
            pass

    def _progress(self, kind: str, job_id: str, version: int, now: float) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.version != version or job.since is None:
            return  # a timer set before the job last changed
        if kind == "done":
            self.ended.add(job_id)  # first: a reader never sees it in neither
            self.jobs.pop(job_id)
            self.events.put(AgentEvent("done", job_id, {"step": int(job.steps)}))
        else:
            self._profile(job, int(job.done + (now - job.since) * self._rate(job)))
            self._timer(now + PROFILE_EVERY_S, job, "profile")

    def _profile(self, job: _Job, step: int) -> None:
        prof = self.perf.profile(job.model)
        self.events.put(AgentEvent("profile", job.id, wire.Profile(
            step, mini_batch_time=1.0 / self._rate(job), memory_gb=prof.memory_gb,
            utilization=prof.utilization)))
