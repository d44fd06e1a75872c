"""What policies decide. GPU sets are tuples of global GPU ids (see ``state.Cluster``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Place:
    """Start a queued job on free GPUs (exclusive)."""

    job_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Suspend:
    """Stop a running job at a mini-batch boundary; its state moves to host memory."""

    job_id: str


@dataclass(frozen=True, slots=True)
class Resume:
    """Restart a suspended job on free GPUs, possibly other ones than before."""

    job_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Pack:
    """Run a queued or suspended job on GPUs that other jobs already use (memory must fit)."""

    job_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Unpack:
    """Take a job off shared GPUs; it is suspended and time-sliced again."""

    job_id: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Checkpoint a running job and restore it on other GPUs."""

    job_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Grow:
    """Restart an elastic job with a wider data-parallel width."""

    job_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Shrink:
    """Restart an elastic job with a narrower data-parallel width."""

    job_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Kill:
    job_id: str


@dataclass(frozen=True, slots=True)
class Wake:
    """Ask the backend for a ``Tick`` event at ``time`` (the policy has no clock of its own)."""

    time: float


# what a policy does to jobs, and what it asks of the backend for itself
JobAction = Place | Suspend | Resume | Pack | Unpack | Migrate | Grow | Shrink | Kill
Control = Wake
Action = JobAction | Control
