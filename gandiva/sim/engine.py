"""The simulator backend: a virtual clock, an event queue and the performance model's truth.

Progress is piecewise linear: a job's rate changes only when something happens to it or to a
job sharing its GPUs, so the engine keeps (work done, rate, since when) per job and schedules
its completion; nothing ticks. Every action costs what it costs in reality: the job stalls for
the suspend/resume or migration time of its checkpoint size (the paper's Fig 13).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import PutsOffQuietRounds
from gandiva.run import JobRun, RunResult, no_counts
from gandiva.scheduler import Policy, Scheduler
from gandiva.sim.perf import PerfModel, default_perf_model
from gandiva.spec import JobSpec, JobState
from gandiva.state import Cluster

# the paper's early-feedback metric: time to 100 mini-batches, i.e. steps of the job's loop (an
# N-GPU step is N mini-batches of work)
FIRST_FEEDBACK_STEPS = 100
# event order at equal times: finished jobs free their GPUs before newcomers are placed
_DONE, _FAIL, _ARRIVE, _PRIORITY, _PROFILE, _TICK = range(6)


def _progress(rec: JobRecord, done: float, first_feedback: float | None, rate: float,
              begin: float, now: float) -> tuple[float, float | None]:
    """The job's mini-batches done and first feedback at ``now``, having run at ``rate`` since
    ``begin`` from ``done``."""
    if rate > 0.0 and now > begin:
        before, done = done, min(rec.work, done + (now - begin) * rate)
        mark = min(FIRST_FEEDBACK_STEPS * rec.spec.num_gpus, rec.work)
        if first_feedback is None and before < mark <= done:
            first_feedback = begin + (mark - before) / rate
    return done, first_feedback


@dataclass
class SimConfig:
    seed: int = 0
    # relative std. dev. of profiled mini-batch time and utilisation. Decision: a job's
    # utilisation, and its mini-batch time alone, measure the same each time (their error is a
    # bias of the job), so its reports between changes carry no news and do not end a put-off
    # round (skip_quiet_rounds); its mini-batch time beside other jobs (a packing trial) has a
    # fresh error each time, so that a pair tried again is measured again
    profile_noise: float = 0.05
    profile_after: int = 20  # steps measured after a (re)start before a profile sample
    checkpoint_interval: float = 1800.0  # s; a failure loses the work since the last checkpoint
    failures: list[tuple[float, int]] = field(default_factory=list)  # (time, server)
    priority_changes: list[tuple[float, str, int]] = field(default_factory=list)  # (t, job, p)
    timeline: bool = True  # record per-GPU segments (for the GPU timeline plot of small runs)
    check_invariants: bool = False  # full state check after every event (tests, debugging)
    # progress reports: besides the sample after each (re)start, one every this many
    # mini-batches (the job library reports continuously; the simulator only when asked)
    report_every: int | None = None
    # a control-plane client watching progress reports (e.g. a hyper-parameter search) that
    # answers with priority changes: (job id, new priority) pairs
    controller: Callable[[E.ProfileSample, Cluster], Iterable[tuple[str, int]]] | None = None
    # let the policy put off time-slicing rounds that would change nothing (a later ``Wake``):
    # the same decisions with fewer events. Off where every round is watched: with the
    # timeline, report_every or a controller
    skip_quiet_rounds: bool = True


@dataclass(slots=True, kw_only=True)
class JobRecord(JobRun):
    """The simulator's truth about one job, and what the metrics need from it."""

    model: str
    work: float  # mini-batches, one GPU's each (Gavel's steps): throughput's unit
    utilization: float  # the model's GPU utilisation alone (the truth, for metrics only)
    solo_time: float  # seconds alone on its requested GPUs, consolidated, fastest GPU type
    done: float = 0.0
    rate: float = 0.0  # mini-batches per second now
    t_last: float = 0.0
    stall_until: float = 0.0
    seg_start: float = 0.0  # when the current placement began (checkpoint clock)
    tl_start: float = 0.0  # when the current timeline segment began
    shared: bool = False  # whether the current timeline segment shares a GPU
    version: int = 0  # bumped at every re-rate: profile reports planned before are void
    due: float | None = None  # completion planned at the last re-rate; None while stopped
    queued: list[float] = field(default_factory=list)  # its completion events, latest first
    gpus: tuple[int, ...] = ()
    last_servers: frozenset[int] = frozenset()
    active_area_at_submit: float = 0.0
    active_area_at_finish: float = 0.0
    held_s: float = 0.0  # seconds holding GPUs (its stalls included)
    stall_s: float = 0.0  # of which stalled: suspend/resume, migration, restore

    def end_placement(self, now: float) -> None:
        """Account the placement that ends now (if it has GPUs)."""
        if self.gpus:
            self.held_s += now - self.seg_start
            self.stall_s += max(0.0, min(self.stall_until, now) - self.seg_start)


@dataclass(kw_only=True)
class SimResult(RunResult):
    """A run's result (``jobs``: ``JobRecord``; ``actions``: every one, with its time, when
    the timeline is on), and what only the simulator knows of it."""

    allocated_gpu_seconds: float
    series: list[tuple[float, int, int, int]]  # (time, allocated GPUs, waiting jobs, running)
    events: int
    notes: list[str]


class Simulator:
    """Replays ``jobs`` through ``policy`` on ``cluster``; ``run()`` returns a ``SimResult``."""

    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        jobs: Iterable[JobSpec],
        *,
        reference_gpu: str = "V100",
        perf: PerfModel | None = None,
        config: SimConfig | None = None,
    ) -> None:
        self.cluster = cluster
        self.perf = perf or default_perf_model()
        self.config = config or SimConfig()
        self.scheduler = Scheduler(cluster, policy, self)
        if (isinstance(policy, PutsOffQuietRounds) and self.config.skip_quiet_rounds
                and not self.config.timeline and self.config.report_every is None
                and self.config.controller is None):
            policy.put_off_quiet_rounds()  # nothing here watches every round
        self.policy = policy
        self._noise: dict[str, float] = {}  # job -> the error of its measurements alone
        self._measured: dict[str, int] = {}  # job beside others -> measurements so far
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, object]] = []
        self._seq = 0
        self.records: dict[str, JobRecord] = {}
        self.counts = no_counts()
        self.notes: list[str] = []
        self._gpu_types = sorted({g.type for g in cluster.gpus})
        self._biggest_server = max(n.size for n in cluster.nodes)
        self._wakes: set[float] = set()
        self._alone: dict[tuple[str, tuple[int, ...]], float] = {}
        self._alloc_area = 0.0
        self._active_area = 0.0
        self._t_prev = 0.0
        self._series: list[tuple[float, int, int, int]] = []
        self._timeline: list[tuple[int, str, float, float, bool]] = []
        self._actions: list[tuple[float, A.Action, float]] = []
        self._events = 0
        too_big = 0
        for spec in jobs:
            if spec.num_gpus > cluster.total_gpus:
                too_big += 1
                continue
            self._push(spec.submit_time, _ARRIVE, spec)
            self.records[spec.id] = self._record(spec, reference_gpu)
        if too_big:
            self.notes.append(
                f"{too_big} jobs ask for more GPUs than the cluster's {cluster.total_gpus}; "
                "left out (use a bigger --cluster)"
            )
        for t, node in self.config.failures:
            self._push(t, _FAIL, node)
        for t, jid, priority in self.config.priority_changes:
            self._push(t, _PRIORITY, (jid, priority))

    def _record(self, spec: JobSpec, reference_gpu: str) -> JobRecord:
        """Work in mini-batches (see gandiva/traces/FORMAT.md): given, or the trace's duration
        at the job's width on the reference GPU type."""
        model, n = self.perf.resolve(spec.model), spec.num_gpus
        if spec.mini_batches is not None:
            work = float(spec.mini_batches)
        elif spec.duration is not None:
            work = max(1.0, spec.duration * self.perf.throughput(model, reference_gpu, n))
        else:
            raise ValueError(f"job {spec.id!r}: give duration or mini_batches")
        solo = work / max(self.perf.throughput(model, t, n) for t in self._gpu_types)
        return JobRecord(spec=spec, submit=spec.submit_time, model=model, work=work,
                         utilization=self.perf.profile(model).utilization, solo_time=solo)

    # ---- the event loop -----------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self._heap, (t, kind, self._seq, kind, payload))
        self._seq += 1

    def run(self, on_progress: Callable[[int, int], None] | None = None) -> SimResult:
        total = len(self.records)
        finished = 0
        heap = self._heap
        cluster = self.cluster
        stride = max(1, total // 200)
        while heap:
            t, _, _, kind, payload = heapq.heappop(heap)
            if kind == _DONE:
                rec = self.records[payload]  # type: ignore[index]
                rec.queued.pop()
                if t != rec.due:  # it lost time since this was planned: plan again
                    self._queue_done(rec)
                    continue
            self._account(t)
            self.now = t
            self._events += 1
            if kind == _DONE:
                self._finish(rec)
                finished += 1
                if on_progress and finished % stride == 0:
                    on_progress(finished, total)
            elif kind == _ARRIVE:
                spec: JobSpec = payload  # type: ignore[assignment]
                rec = self.records[spec.id]
                rec.active_area_at_submit = self._active_area
                self.scheduler.handle(E.Arrival(t, spec))
            elif kind == _PROFILE:
                jid, version = payload  # type: ignore[misc]
                rec = self.records[jid]
                if version == rec.version and rec.rate > 0:
                    self._report(rec)
            elif kind == _TICK:
                self._wakes.discard(t)
                self.scheduler.handle(E.Tick(t))
            elif kind == _PRIORITY:
                jid, priority = payload  # type: ignore[misc]
                if jid in cluster.jobs and self.records[jid].finish is None:
                    self.scheduler.handle(E.PriorityChange(t, jid, priority))
            elif kind == _FAIL:
                node = int(payload)  # type: ignore[call-overload]
                self._fail(node)
            self._sample_series(cluster)
            if self.config.check_invariants:
                cluster.check_invariants()
        if on_progress:
            on_progress(finished, total)
        unfinished = total - finished
        if unfinished:
            self.notes.append(f"{unfinished} jobs never finished (the policy left them waiting)")
        submits = [r.spec.submit_time for r in self.records.values()]
        return SimResult(
            policy=getattr(self.policy, "spec", self.policy.name),
            devices=[f"{g.type}:{g.id}" for g in cluster.gpus],
            jobs=list(self.records.values()),
            counts=dict(self.counts),
            allocated_gpu_seconds=self._alloc_area,
            span=(min(submits, default=0.0),
                  max((r.finish for r in self.records.values() if r.finish is not None),
                      default=self.now)),
            series=self._series,
            timeline=self._timeline,
            actions=self._actions,
            events=self._events,
            notes=self.notes,
        )

    def _account(self, t: float) -> None:
        dt = t - self._t_prev
        if dt > 0:
            c = self.cluster
            self._alloc_area += c.allocated_count() * dt
            self._active_area += c.active_count() * dt
            self._t_prev = t

    def _sample_series(self, c: Cluster) -> None:
        point = (self.now, c.allocated_count(), len(c.queue) + len(c.suspended),
                 len(c.running))
        if not self._series or self._series[-1][1:] != point[1:]:
            self._series.append(point)

    # ---- job progress -------------------------------------------------------------------
    def _advance(self, rec: JobRecord) -> None:
        rec.done, rec.first_feedback = _progress(rec, rec.done, rec.first_feedback, rec.rate,
                                                 max(rec.t_last, rec.stall_until), self.now)
        rec.t_last = self.now

    def _alone_rate(self, model: str, placement: tuple[int, ...]) -> float:
        """The job's rate on these GPUs with no job sharing them (remembered: a time-sliced
        job comes back to the same few GPU sets round after round)."""
        key = (model, placement)
        rate = self._alone.get(key)
        if rate is not None:
            return rate
        gpus = [self.cluster.gpus[g] for g in placement]
        # a synchronous job goes at the pace of its slowest GPU type
        rate = min(self.perf.throughput(model, t, len(gpus)) for t in {g.type for g in gpus})
        servers = {g.node for g in gpus}
        cross_socket = self.cluster.splits_sockets(placement)
        # a trace's duration was measured on the fewest servers that hold the job; only a
        # wider spread than that costs extra, and it never speeds the job up. (The tables are
        # keyed by server count alone; some measured rows are not monotone in it, e.g. Pollux
        # deepspeech2 at 4 GPUs: 2+2 keeps 0.705, 1+1+1+1 keeps 0.919. Without the cap an
        # 8-GPU job spread 4+3+1 took the 4-server row over the 2-server one and ran 1.3x
        # faster than on two whole servers, a gift to policies that spread gangs.)
        fewest = -(-len(gpus) // self._biggest_server)
        rate *= min(1.0, self.perf.locality(model, len(servers), cross_socket)
                    / self.perf.locality(model, fewest, False))
        self._alone[key] = rate
        return rate

    def _true_rate(self, rec: JobRecord) -> float:
        if not rec.gpus:
            return 0.0
        rate = self._alone_rate(rec.model, rec.gpus)
        gpus = [self.cluster.gpus[g] for g in rec.gpus]
        slowest = 1.0
        for g in gpus:
            if len(g.jobs) > 1:
                share = 1.0
                for other in g.jobs:
                    if other != rec.spec.id:
                        share *= self.perf.packed(rec.model, self.records[other].model, g.type)[0]
                slowest = min(slowest, share)
        return rate * slowest

    def _reflow(self, recs: Iterable[JobRecord]) -> None:
        """Re-rate jobs whose conditions changed and re-plan their completion and profiling."""
        for rec in recs:
            self._advance(rec)
            if self.config.timeline:
                self._mark_sharing(rec)
            rec.rate = self._true_rate(rec)
            rec.version += 1
            rec.due = None
            if rec.rate > 0.0:
                begin = max(self.now, rec.stall_until)
                rec.due = begin + (rec.work - rec.done) / rec.rate
                self._queue_done(rec)
                self._push(begin + self._warmup(rec), _PROFILE, (rec.spec.id, rec.version))

    def _warmup(self, rec: JobRecord) -> float:
        """Seconds from a (re)start's end to the job's profile report."""
        return min(self.config.profile_after * len(rec.gpus) / rec.rate, 60.0)

    def _resume_stall(self, model: str, last: frozenset[int], servers: frozenset[int]
                      ) -> float:
        """A suspended job's stall to resume on ``servers``, having last run on ``last``:
        from host memory, or through a checkpoint when it changes servers."""
        ckpt = self.perf.profile(model).checkpoint_mb
        if last and servers != last:
            return self.perf.migration_time(ckpt, True)
        return self.perf.suspend_resume_time(ckpt)

    def _queue_done(self, rec: JobRecord) -> None:
        """Queue the job's planned completion unless an earlier one is queued already.

        A time-sliced job is re-rated at every turn, and its completion only moves later while
        it waits; so rather than one event per turn (all but the last void), the earliest
        stays queued and, when it comes and the job is not done, plans again.
        """
        if rec.due is not None and (not rec.queued or rec.due < rec.queued[-1]):
            rec.queued.append(rec.due)
            self._push(rec.due, _DONE, rec.spec.id)

    def _report(self, rec: JobRecord) -> None:
        sample = self._sample(rec)
        self.scheduler.handle(sample)
        every = self.config.report_every
        if every and rec.rate > 0 and rec.finish is None:
            self._push(self.now + every / rec.rate, _PROFILE, (rec.spec.id, rec.version))
        if self.config.controller is not None:
            for jid, priority in self.config.controller(sample, self.cluster):
                self.scheduler.handle(E.PriorityChange(self.now, jid, priority))

    def _errors(self, rec: JobRecord) -> tuple[float, float]:
        """The relative errors (``profile_noise``) of the job's measurements now: of its
        mini-batch time, and of its utilisation (the job's bias, drawn from the seed and the
        job; beside other jobs the time's error is drawn afresh, from them and the count of
        such measurements: not from the time, whose last bits differ with the order in which
        progress was summed)."""
        noise = self.config.profile_noise
        if not noise:
            return 1.0, 1.0
        bias = self._noise.get(rec.spec.id)
        if bias is None:
            draw = random.Random(f"{self.config.seed}/{rec.spec.id}")
            bias = self._noise[rec.spec.id] = max(0.5, draw.gauss(1.0, noise))
        on = self.cluster.gpus
        beside = sorted({j for g in rec.gpus for j in on[g].jobs} - {rec.spec.id})
        if not beside:
            return bias, bias
        key = f"{self.config.seed}/{rec.spec.id}/{'+'.join(beside)}"
        n = self._measured[key] = self._measured.get(key, 0) + 1
        return max(0.5, random.Random(f"{key}/{n}").gauss(1.0, noise)), bias

    def _sample(self, rec: JobRecord) -> E.ProfileSample:
        self._advance(rec)
        prof = self.perf.profile(rec.model)
        timing, bias = self._errors(rec)
        return E.ProfileSample(
            time=self.now,
            job_id=rec.spec.id,
            mini_batch_time=timing * len(rec.gpus) / rec.rate,  # one step of the job's loop
            memory_gb=prof.memory_gb,  # the allocator's peak is exact; timings are noisy
            utilization=min(1.0, prof.utilization * bias),
            mini_batches_done=int(rec.done / rec.spec.num_gpus),  # steps of the job's loop
        )

    def _on(self, gpus: Iterable[int]) -> list[JobRecord]:
        """Jobs on ``gpus`` in arrival order (never set order: results must not depend on
        PYTHONHASHSEED)."""
        jobs = self.cluster.jobs
        return [self.records[j] for j in sorted(self.cluster.jobs_on(gpus),
                                                key=lambda j: jobs[j].seq)]

    def _neighbours(self, gpus: tuple[int, ...], but: str) -> list[JobRecord]:
        """Jobs sharing ``gpus`` with ``but``, in arrival order. Most GPUs hold one job at most,
        so the common answer, none, is found without building and sorting a set."""
        on = self.cluster.gpus
        if all(not on[g].jobs or on[g].jobs == [but] for g in gpus):
            return []
        return [r for r in self._on(gpus) if r.spec.id != but]

    def _stop_segment(self, rec: JobRecord) -> None:
        if self.config.timeline and rec.gpus and self.now > rec.tl_start:
            for g in rec.gpus:
                self._timeline.append((g, rec.spec.id, rec.tl_start, self.now, rec.shared))
        rec.tl_start = self.now

    def _mark_sharing(self, rec: JobRecord) -> None:
        """Split the timeline segment when the job starts or stops sharing a GPU."""
        shared = any(len(self.cluster.gpus[g].jobs) > 1 for g in rec.gpus)
        if shared != rec.shared:
            self._stop_segment(rec)
            rec.shared = shared

    def _move(self, rec: JobRecord, gpus: tuple[int, ...], stall: float) -> None:
        """Give ``rec`` new GPUs (maybe none) after a stall; re-rate it and its neighbours."""
        old = rec.gpus
        self._advance(rec)
        self._stop_segment(rec)
        rec.end_placement(self.now)
        if gpus:
            rec.last_servers = frozenset(self.cluster.gpus[g].node for g in gpus)
            if rec.start is None:
                rec.start = self.now
        rec.gpus = gpus
        rec.seg_start = self.now
        rec.shared = any(len(self.cluster.gpus[g].jobs) > 1 for g in gpus)
        rec.stall_until = self.now + stall
        touched = {r.spec.id: r for r in (*self._neighbours(old, rec.spec.id),
                                          *self._neighbours(gpus, rec.spec.id))}
        self._reflow([rec, *touched.values()])

    # ---- the backend interface: carry out an action (already applied to the state) ------
    def execute(self, action: A.Action, cluster: Cluster) -> None:
        if self.config.timeline:
            self._actions.append((self.now, action, 0.0))
        if isinstance(action, A.Wake):
            if action.time >= self.now and action.time not in self._wakes:
                self._wakes.add(action.time)
                self._push(action.time, _TICK, None)
            return
        rec = self.records[action.job_id]
        if isinstance(action, A.Suspend | A.Unpack):  # the most common action: time-slicing
            self.counts["unpacks" if isinstance(action, A.Unpack) else "suspends"] += 1
            self._move(rec, (), 0.0)  # the suspend half is charged on resume
            return
        ckpt = self.perf.profile(rec.model).checkpoint_mb
        new = cluster.jobs[action.job_id].gpus
        servers = frozenset(cluster.gpus[g].node for g in new)
        across = bool(rec.last_servers) and servers != rec.last_servers
        if isinstance(action, A.Place):
            self.counts["places"] += 1
            # a job that ran before restarts from its checkpoint (after a failure)
            restore = self.perf.migration_time(ckpt, across) if rec.start is not None else 0.0
            self._move(rec, new, restore)
        elif isinstance(action, A.Pack):
            self.counts["packs"] += 1
            resumed = rec.start is not None
            cost = self.perf.suspend_resume_time(ckpt) if resumed else 0.0
            if across:
                cost = self.perf.migration_time(ckpt, True)
            self._move(rec, new, cost)
        elif isinstance(action, A.Resume):
            self.counts["resumes"] += 1
            self._move(rec, new, self._resume_stall(rec.model, rec.last_servers, servers))
        elif isinstance(action, A.Migrate | A.Grow | A.Shrink):
            key = {A.Migrate: "migrations", A.Grow: "grows", A.Shrink: "shrinks"}[type(action)]
            self.counts[key] += 1
            self._move(rec, new, self.perf.migration_time(ckpt, across))
        elif isinstance(action, A.Kill):
            self.counts["kills"] += 1
            self._move(rec, (), 0.0)
            rec.version += 1
            rec.finish = None

    def _finish(self, rec: JobRecord) -> None:
        self._advance(rec)
        rec.done = rec.work
        rec.status = JobState.DONE
        if rec.first_feedback is None:
            rec.first_feedback = self.now
        rec.finish = self.now
        rec.active_area_at_finish = self._active_area
        self._stop_segment(rec)
        neighbours = self._neighbours(rec.gpus, rec.spec.id)
        rec.end_placement(self.now)
        rec.gpus = ()
        rec.rate = 0.0
        rec.version += 1
        rec.due = None
        self.scheduler.handle(E.Departure(self.now, rec.spec.id))
        self._reflow(n for n in neighbours if n.gpus)

    def _fail(self, node: int) -> None:
        self.counts["failures"] += 1
        hit = self._on(self.cluster.nodes[node].gpus)
        gone = {rec.spec.id for rec in hit}
        survivors = {n.spec.id: n for rec in hit for n in self._neighbours(rec.gpus, rec.spec.id)
                     if n.spec.id not in gone}
        for rec in hit:
            self._advance(rec)
            ran = self.now - max(rec.seg_start, rec.stall_until)
            if ran > 0 and rec.rate > 0:
                lost = (ran % self.config.checkpoint_interval) * rec.rate
                rec.done = max(0.0, rec.done - lost)
            self._stop_segment(rec)
            rec.end_placement(self.now)
            rec.gpus = ()
            rec.rate = 0.0
            rec.version += 1
            rec.due = None
        self.scheduler.handle(E.Failure(self.now, node))
        self._reflow(n for n in survivors.values() if n.gpus)
