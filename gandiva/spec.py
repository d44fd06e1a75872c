"""What a job asks for: the immutable part of a job, as a trace or a user gives it."""

from __future__ import annotations

from dataclasses import dataclass, field


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
