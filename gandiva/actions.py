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


@dataclass(frozen=True, slots=True)
class Rounds:
    """Time-slicing rounds planned ahead, for a backend that carries them out itself (the
    simulator): on ``servers``, round ``r`` begins at ``(first + r) * quantum`` and gives each
    of ``jobs`` the GPUs ``gpus[r][i]`` (``()``: it waits its turn). Round 0 is the one just
    applied; the state keeps showing it until the plan ends (``Thaw``, ``RoundsEnd``) and
    becomes the round then in progress. Planned only where nothing but the rounds changes.
    """

    servers: tuple[int, ...]
    first: int
    quantum: float
    jobs: tuple[str, ...]
    gpus: tuple[tuple[tuple[int, ...], ...], ...]

    def start(self, r: int) -> float:
        return (self.first + r) * self.quantum

    def round_at(self, now: float, tick: bool = False) -> int:
        """The round in progress at ``now``: events at a round's first instant come before
        its tick, so they still see the round before (``tick``: the tick itself, which sees
        the round it begins)."""
        r = min(len(self.gpus) - 1, max(0, int((now - self.start(0)) / self.quantum)))
        while r > 0 and (self.start(r) > now or self.start(r) == now and not tick):
            r -= 1
        while r + 1 < len(self.gpus) and (self.start(r + 1) < now
                                          or self.start(r + 1) == now and tick):
            r += 1
        return r


@dataclass(frozen=True, slots=True)
class Thaw:
    """End the planned rounds on ``servers`` now: the state becomes their ``round``, the
    one in progress (``Rounds.round_at``)."""

    servers: tuple[int, ...]
    round: int


Action = (Place | Suspend | Resume | Pack | Unpack | Migrate | Grow | Shrink | Kill | Wake
          | Rounds | Thaw)
