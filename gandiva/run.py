"""What a run leaves, the same for the simulator and the real backends: a record per job and a
result for the run, so that its metrics, its summary and its timeline are written once.

Each backend extends the record with what only it knows: the simulator its truth about a job
(work, rate, the time it would take alone), the driver what the job reports (steps, metrics).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gandiva import actions as A
from gandiva.spec import JobSpec, JobState


@dataclass(slots=True)
class JobRun:
    """One job's run, as every backend records it (times in seconds from the run's start)."""

    spec: JobSpec
    submit: float  # when it arrived
    start: float | None = None  # when it first had devices
    first_feedback: float | None = None  # when it had done its first 100 mini-batches
    finish: float | None = None
    status: JobState = JobState.QUEUED
    reason: str = ""  # why it ended as it did (failed, cancelled), or what last happened
    restarts: int = 0


@dataclass
class RunResult:
    policy: str
    devices: list[str]  # names, by device id
    jobs: list[Any]  # JobRun, or a backend's extension of it
    # (time, action, seconds it took: measured on real nodes, 0 in the simulator, where an
    # action's cost is the stall it models)
    actions: Sequence[tuple[float, A.Action, float]]
    timeline: list[tuple[int, str, float, float, bool]]  # (device, job, start, end, shared)
    span: tuple[float, float]  # (first submission, last finish)
    counts: dict[str, int] = field(default_factory=dict)  # actions by kind (``COUNTED``)

    @property
    def cluster_gpus(self) -> int:
        return len(self.devices)

    def busy_device_seconds(self) -> float:
        """Device-seconds with at least one job on the device (shared time counted once)."""
        total = 0.0
        for dev in {seg[0] for seg in self.timeline}:
            end = float("-inf")
            for _, _, s, e, _ in sorted((g for g in self.timeline if g[0] == dev),
                                        key=lambda g: g[2]):
                if e > end:
                    total += e - max(s, end)
                    end = e
        return total


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# what each kind of action is counted as (node failures are counted as "failures")
COUNTED = {A.Place: "places", A.Suspend: "suspends", A.Resume: "resumes", A.Pack: "packs",
           A.Unpack: "unpacks", A.Migrate: "migrations", A.Grow: "grows", A.Shrink: "shrinks",
           A.Kill: "kills"}


def no_counts() -> dict[str, int]:
    return {k: 0 for k in (*COUNTED.values(), "failures")}


def outcome(result: RunResult) -> dict[str, Any]:
    """What every run is judged by, whatever ran it: jobs finished, JCT, time to first
    feedback, queueing, makespan. (``gandiva.metrics.summarize`` adds what only the
    simulator knows.)"""
    done = [j for j in result.jobs if j.finish is not None and j.status == JobState.DONE]
    jct = [j.finish - j.submit for j in done]
    start, end = result.span
    return {
        "jobs": len(result.jobs),
        "finished": len(done),
        "failed": sum(j.status in (JobState.FAILED, JobState.CANCELLED) for j in result.jobs),
        "mean_jct_s": mean(jct),
        "p50_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "p99_jct_s": percentile(jct, 99),
        "makespan_s": max(end - start, 0.0),
        "mean_queue_s": mean([j.start - j.submit for j in result.jobs if j.start is not None]),
        "mean_first_feedback_s": mean([j.first_feedback - j.submit for j in done
                                       if j.first_feedback is not None]),
        "max_first_feedback_s": max((j.first_feedback - j.submit for j in done
                                     if j.first_feedback is not None), default=math.nan),
        # a packed job sent back to its turn is suspended as much as a time-sliced one
        "suspends": result.counts.get("suspends", 0) + result.counts.get("unpacks", 0),
        "resumes": result.counts.get("resumes", 0),
        "migrations": result.counts.get("migrations", 0),
        "packs": result.counts.get("packs", 0),
    }
