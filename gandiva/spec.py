"""What a job asks for (the immutable part of a job, as a trace or a user gives it), and the
states a user sees it in."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class JobState(StrEnum):
    """A job's state as its user sees it: in the store, the API, the metrics and the CLI.
    (The policy's own view, ``state.JobStatus``, knows no held, failed or cancelled: those
    jobs are out of its hands.) A ``StrEnum``: each is equal to its name as a string, which is
    how the API and the database spell it."""

    QUEUED = "queued"  # waiting for devices (or for a first turn on a time-sliced server)
    RUNNING = "running"
    SUSPENDED = "suspended"  # waiting for its next turn, its state in host memory
    HELD = "held"  # taken out of scheduling by its user, checkpointed, until released
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One training job as submitted.

    Work is given either as ``mini_batches`` (exact; one GPU's mini-batches, so an N-GPU step is
    N of them, as Gavel counts steps) or as ``duration``: the job's run time alone on its
    requested GPUs, consolidated, on the trace's reference GPU type. The simulator turns a
    duration into mini-batches with the performance model's throughput at that width
    (``gandiva/traces/FORMAT.md``).
    """

    id: str
    submit_time: float
    num_gpus: int
    model: str
    user: str = "default"
    duration: float | None = None
    mini_batches: int | None = None
    priority: int = 0
    min_gpus: int | None = None
    max_gpus: int | None = None
    checkpoints: bool = True  # False: never placed on borrowed GPUs (a quota's, fair.py)

    @property
    def elastic(self) -> bool:
        return self.min_gpus is not None or self.max_gpus is not None


@dataclass(slots=True)
class Trace:
    """A list of jobs plus where they came from."""

    name: str
    jobs: list[JobSpec]
    source: str = ""
    reference_gpu: str = "V100"
    notes: list[str] = field(default_factory=list)
