"""Prometheus metrics of a server: what its scrape at ``/metrics`` returns.

Gauges are read from the loop's latest snapshot and records at scrape time (nothing to keep
in step); decisions and actions are timed by the loop itself, through ``Observer``. Counts
come with every histogram (``_count``), so suspend and migration counts are
``gandiva_action_seconds_count{action="suspend"}`` and ``{action="migrate"}``.

Names follow Prometheus' conventions: counters of what only grows end in ``_total``
(``gandiva_jobs_submitted_total``, ``gandiva_jobs_finished_total{state}``,
``gandiva_job_restarts_total``), a 0..1 fraction in ``_ratio``, durations in ``_seconds``;
the standard ``process_*`` and ``python_info`` metrics, ``gandiva_build_info`` and the garbage
collector's pauses (``gandiva_gc_pause_seconds{generation}``) come too.

Decision: ``/metrics`` needs no token (Prometheus scrapes it); it shows aggregates only,
never a job's id or its user.
"""

from __future__ import annotations

import gc
import platform
import time
from collections import Counter, defaultdict, deque
from importlib import metadata

from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client import (
    Counter as CounterMetric,
)
from prometheus_client.core import GaugeMetricFamily

from gandiva import actions as A
from gandiva import events as E
from gandiva.accounting import NO_TEAM
from gandiva.backends.driver import Driver, Observer, named
from gandiva.node.agent import HUNG, STRAGGLED
from gandiva.shares import water_fill
from gandiva.spec import TERMINAL, JobState

# from sub-millisecond decisions to checkpoints of large models
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
           30, 60)
STATES = tuple(JobState)
TEAMS_MAX = 50  # teams labelled one by one; past these (by name) they count as "other"
ASKING = (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED)  # demand: not held

# Python's garbage collector stops every thread while it runs, so its pauses are the API's
# pauses too. One histogram for the process (collections are the process's), shown by every
# server's registry; fed by ``gc.callbacks``, installed with the first ``Metrics``.
GC_PAUSES = Histogram(
    "gandiva_gc_pause_seconds", "Pauses of Python's garbage collector (every thread "
    "waits), by the oldest generation collected", ["generation"], buckets=BUCKETS,
    registry=None)
_gc_started = 0.0


def _on_gc(phase: str, info: dict) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    else:
        GC_PAUSES.labels(str(info["generation"])).observe(time.perf_counter() - _gc_started)


class Metrics(Observer):
    def __init__(self, backend: Driver) -> None:
        self.backend = backend
        self.registry = CollectorRegistry()
        self.decisions = Histogram(
            "gandiva_decision_seconds", "Time the scheduler took to handle an event: the "
            "policy's decision (its actions are handed to the nodes, not waited for)",
            ["event"], buckets=BUCKETS, registry=self.registry)
        self.actions = Histogram(
            "gandiva_action_seconds", "Time a node took to carry out an action on real "
            "processes (place, suspend, resume, migrate, grow, shrink, pack, unpack, kill)",
            ["action"], buckets=BUCKETS, registry=self.registry)
        self.settle = Histogram(
            "gandiva_settle_seconds", "From a decision until its nodes have carried out "
            "every action it made; for event=\"tick\", a time-slicing round's duration",
            ["event"], buckets=BUCKETS + (120, 300), registry=self.registry)
        self.overdue_actions = CounterMetric(
            "gandiva_actions_overdue", "Actions (and users' requests) a node had not carried "
            "out within the deadline; the job stays in transition", ["action"],
            registry=self.registry)
        self.submitted = CounterMetric("gandiva_jobs_submitted", "Jobs accepted (a retried "
                                       "submission_id counts once)", registry=self.registry)
        self.finished = CounterMetric("gandiva_jobs_finished", "Jobs that ended, by how",
                                      ["state"], registry=self.registry)
        for state in sorted(TERMINAL):
            self.finished.labels(state)
        self.restarts = CounterMetric("gandiva_job_restarts", "Restarts of crashed jobs from "
                                      "their checkpoints", registry=self.registry)
        self.hung = CounterMetric(
            "gandiva_jobs_hung", "Jobs no rank of which reported for the hang limit "
            "(--hang-after): killed, then restarted from their checkpoints or failed",
            registry=self.registry)
        self.killed_at_exit = CounterMetric(
            "gandiva_jobs_killed_at_exit", "Jobs done whose ranks, their training over, hung "
            "on the way out (in the interpreter's teardown) and were killed",
            registry=self.registry)
        self.node_lost = CounterMetric(
            "gandiva_jobs_node_lost", "Jobs put back in the queue because their node was lost "
            "(its machine gone, or its agent silent)", registry=self.registry)
        self.checkpoints_refused = CounterMetric(
            "gandiva_checkpoints_refused", "Checkpoints a job's disk refused (full, gone); "
            "the job trained on from its newest checkpoint", registry=self.registry)
        self.store_unavailable = CounterMetric(
            "gandiva_requests_store_unavailable", "Requests answered 503 because the "
            "database did not take or give what they needed (nothing of them was stored)",
            registry=self.registry)
        self._refused_at: deque[float] = deque(maxlen=10_000)  # when, on the monotonic clock
        Info("gandiva_build", "The server's version", registry=self.registry).info({
            "version": _version(), "python": platform.python_version()})
        ProcessCollector(registry=self.registry)
        self.registry.register(PLATFORM_COLLECTOR)
        self.registry.register(GC_PAUSES)
        if _on_gc not in gc.callbacks:
            gc.callbacks.append(_on_gc)
        self.registry.register(self)
        backend.observer = self

    # ---- Observer ----------------------------------------------------------------------
    def decision(self, event: E.Event, seconds: float) -> None:
        self.decisions.labels(type(event).__name__.lower()).observe(seconds)

    def action(self, action: A.Action, seconds: float) -> None:
        if not isinstance(action, A.Wake):
            self.actions.labels(named(action)).observe(seconds)

    def settled(self, event: E.Event, actions: int, seconds: float) -> None:
        self.settle.labels(type(event).__name__.lower()).observe(seconds)

    def overdue(self, action: object) -> None:
        self.overdue_actions.labels(named(action)).inc()

    # ---- a collector: gauges at scrape time ----------------------------------------------
    def describe(self):
        return []  # computed at each scrape

    def collect(self):
        b = self.backend
        view = b.view()
        states = Counter(r.status for r in list(b.records.values()))
        jobs = GaugeMetricFamily("gandiva_jobs", "Jobs this server knows, by state",
                                 labels=["state"])
        for state in STATES:
            jobs.add_metric([state], states.get(state, 0))
        yield jobs
        yield GaugeMetricFamily("gandiva_queue_length", "Jobs waiting for devices in the "
                                "scheduler's queue", value=view["queue_length"])
        yield GaugeMetricFamily("gandiva_devices", "Devices (GPUs, or CPU slots standing in "
                                "for them)", value=view["total"])
        yield GaugeMetricFamily("gandiva_devices_allocated", "Devices holding at least one "
                                "running job", value=view["total"] - view["free"])
        shared = sum(1 for n in view["nodes"] for d in n["devices"] if len(d["jobs"]) > 1)
        yield GaugeMetricFamily("gandiva_devices_packed", "Devices running two or more jobs "
                                "at once", value=shared)
        sliced = sum(len(n["time_sliced"]) for n in view["nodes"])
        yield GaugeMetricFamily("gandiva_jobs_time_sliced", "Jobs suspended for their turn on "
                                "an over-subscribed server", value=sliced)
        yield GaugeMetricFamily("gandiva_loop_longest_pause_seconds", "The longest time "
                                "the scheduler's loop took between two turns, since start",
                                value=b.longest_pause)
        warm_ready = getattr(b.agent, "warm_ready", None)  # (nodes that start jobs warm)
        if warm_ready is not None:
            yield GaugeMetricFamily("gandiva_warm_starts_ready", "1 while a Python job would "
                                    "start warm (forked from a zygote with its imports done);"
                                    " 0 while a job would wait for them (the zygote is still "
                                    "importing) or start cold (being replaced, or warm starts "
                                    "are off)",
                                    value=float(warm_ready()))
        util = b.samples[-1][2] if b.samples else 0.0
        yield GaugeMetricFamily("gandiva_device_utilisation_ratio", "Mean device utilisation "
                                "the running jobs report (0..1), at the latest sample",
                                value=util)
        yield from teams(b)

    def changed(self, what: str, state: str | None, reason: str | None = None) -> None:
        """A job's transition, as the server stores it."""
        if what in ("restarted", "failed") and (reason or "").startswith(HUNG):
            self.hung.inc()
        if what == "done" and (reason or "").startswith(STRAGGLED):
            self.killed_at_exit.inc()
        if what == "restarted":
            self.restarts.inc()
        elif what == "node-lost":
            self.node_lost.inc()
        elif what == "checkpoint-refused":
            self.checkpoints_refused.inc()
            self._refused_at.append(time.monotonic())
        if state in TERMINAL:
            self.finished.labels(state).inc()

    def refused_within(self, seconds: float) -> int:
        """Checkpoints a disk refused in the last ``seconds``."""
        since = time.monotonic() - seconds
        return sum(1 for at in self._refused_at if at >= since)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


def _version() -> str:
    try:
        return metadata.version("gandiva")
    except metadata.PackageNotFoundError:
        return "unknown"


def teams(b: Driver):
    """Per team: devices held now (a shared device counts 1/n to each of its n jobs) and its
    fair share of them now (the devices water-filled by tickets, capped by the GPUs its
    unfinished, unheld jobs ask for; a user in no team is a team of their own, as the policy
    has it). Labels: team names (admins make them; at most ``TEAMS_MAX``, the rest "other"),
    "-" for the users in no team together; never a user."""
    shares = b.cluster.shares
    records = [r for r in list(b.records.values()) if r.status in ASKING]
    on = Counter(d for r in records if r.status == JobState.RUNNING for d in r.devices)
    held: dict[str, float] = defaultdict(float)
    asked: dict[str, float] = defaultdict(float)
    for r in records:
        team = shares.of(r.spec.user)[0]
        asked[team] += r.spec.num_gpus
        if r.status == JobState.RUNNING:
            held[team] += sum(1 / on[d] for d in r.devices)
    fair = water_fill(len(b.devices), asked, {t: shares.teams.get(t, 1.0) for t in asked})
    labelled = sorted(shares.teams)[:TEAMS_MAX]
    label = dict.fromkeys(asked, NO_TEAM) | {t: "other" for t in shares.teams} \
        | {t: t for t in labelled}
    allocated = GaugeMetricFamily("gandiva_team_devices_allocated", "Devices a team's jobs "
                                  "hold now (shared devices split between their jobs)",
                                  labels=["team"])
    owed = GaugeMetricFamily("gandiva_team_devices_fair", "A team's fair share of the "
                             "devices now: by tickets, capped by what its jobs ask for",
                             labels=["team"])
    totals: dict[str, list[float]] = {t: [0.0, 0.0] for t in labelled}
    for t in asked:
        got = totals.setdefault(label[t], [0.0, 0.0])
        got[0] += held.get(t, 0.0)
        got[1] += fair.get(t, 0.0)
    for t, (h, f) in sorted(totals.items()):
        allocated.add_metric([t], h)
        owed.add_metric([t], f)
    yield allocated
    yield owed
