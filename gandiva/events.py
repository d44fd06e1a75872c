"""What backends report to the scheduler. Every event carries the time it happened."""

from __future__ import annotations

from dataclasses import dataclass

from gandiva.spec import JobSpec


@dataclass(frozen=True, slots=True)
class Arrival:
    time: float
    job: JobSpec


@dataclass(frozen=True, slots=True)
class Departure:
    """A job left: it finished all its mini-batches (``how="done"``), failed for good, or was
    cancelled by a user, whether it was running, suspended or still queued."""

    time: float
    job_id: str
    how: str = "done"  # "done", "failed" or "cancelled"


@dataclass(frozen=True, slots=True)
class ProfileSample:
    """What the job library measures at mini-batch boundaries (noisy, like reality)."""

    time: float
    job_id: str
    mini_batch_time: float
    memory_gb: float
    utilization: float | None  # None: unknown (MIG): packed on memory alone, after known ones
    mini_batches_done: int


@dataclass(frozen=True, slots=True)
class Failure:
    """A node went down; its jobs lost the work since their last checkpoint."""

    time: float
    node: int


@dataclass(frozen=True, slots=True)
class Join:
    """A server joined the cluster: a new machine, or one that comes back after a ``Failure``
    (it joins as a new server, under a new id, as Ray gives a restarted node a new id)."""

    time: float
    gpus: int
    gpu_type: str
    memory_gb: float  # per GPU


@dataclass(frozen=True, slots=True)
class PriorityChange:
    """A user or a controller (e.g. a hyper-parameter search) changed a job's priority."""

    time: float
    job_id: str
    priority: int


@dataclass(frozen=True, slots=True)
class Tick:
    """A timer the policy asked for with a ``Wake`` action."""

    time: float


@dataclass(frozen=True, slots=True)
class Confirmed:
    """A node has carried out the job's latest action (real backends, whose actions take
    time: see ``Cluster.transitions``). It changes the state only; no decision follows."""

    time: float
    job_id: str


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """A job packed on a GPU ran out of its memory cap there (``torch.OutOfMemoryError``):
    it starts again at once from its checkpoint, beside the same partner, until the policy
    takes it off the GPU (a policy that packs should)."""

    time: float
    job_id: str


Event = (Arrival | Departure | ProfileSample | Failure | Join | PriorityChange | Tick
         | Confirmed | OutOfMemory)
