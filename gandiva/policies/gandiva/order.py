"""Slice orders: who goes first in a time-slicing round (``timeslice.py``).

Each order gives a job's place in a round as a sort key over its ``Slot``. Three, with what
they share: a higher priority goes first, and between rounds (a departure freed GPUs, a
priority changed) a running job keeps its turn, as does one that began it less than half a
quantum ago (it took freed GPUs between rounds).

- ``Levels`` (the default): a job never run first, for its early feedback, then Tiresias'
  attained-service levels (1 and 10 GPU-hours, the las policy's) and one more every
  ``level_step`` times the service before; first come first served within a level, a running
  job before the waiting ones with ``keep_turn`` (docs/decisions/0002 and 0008).
- ``RoundRobin`` (the paper's): the job that had a GPU least recently first; a job whose turn
  is over goes behind every waiting one.
- ``Las``: least attained service first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gandiva.policies.las import LEVEL_TOLERANCE, QUEUE_LIMITS, level

# the levels are cut until one is at or past this much service, which no job reaches, so that
# none holds its turn to its end in a last level (GPU-seconds: a million GPU-hours); at most
# ``MORE_LEVELS`` beyond the las policy's, so a step is 1 (none) or at least ``LEAST_STEP``
LEVELS_UP_TO = 3.6e9
MORE_LEVELS = 64
LEAST_STEP = (LEVELS_UP_TO / QUEUE_LIMITS[-1]) ** (1 / MORE_LEVELS)
NEVER_RUN = float("-inf")


@dataclass(slots=True)
class Slot:
    """What a round needs to know of a job, read from the state once per round."""

    id: str
    priority: int
    seq: int
    width: int  # GPUs it asks for
    home: tuple[int, ...]
    gpus: tuple[int, ...]  # those it holds now (none while it waits)
    started: float | None  # when its last turn began (``Book.last_start``)
    attained: float  # GPU-seconds of service up to the round (0 for an order that ignores it)
    memory_gb: float | None = None
    before: float = 0.0  # the mechanisms' ``order`` of it, put before the slice order's rule
    rank: int = 0  # after ``before``, higher first: its priority among its user's jobs (fair)
    # a gang's GPUs on each server of its home: those it holds, or takes in the round chosen
    share: tuple[int, ...] = ()


Key = Callable[[Slot], tuple]


class RoundRobin:
    by_service = False  # whether slots need their attained service

    def __init__(self, quantum: float) -> None:
        self.half = quantum / 2

    def key(self, now: float, tick: bool) -> Key:
        half = self.half

        def key(s: Slot) -> tuple:
            started = s.started
            turn = started if started is not None else NEVER_RUN
            if not s.gpus:
                return (-s.priority, 1, turn, 1, s.seq)
            if not tick or started is None or now - started < half:
                return (-s.priority, 0, turn, s.seq)  # keeps its turn
            # a job whose turn is over goes behind those waiting, and the one that has run
            # longest gives way first (ordered by when its turn began, like a waiting job, a
            # job that never stopped stayed first in line for ever)
            return (-s.priority, 2, -turn, s.seq)

        return key


class Las:
    by_service = True

    def __init__(self, quantum: float) -> None:
        self.half = quantum / 2

    def key(self, now: float, tick: bool) -> Key:
        half = self.half

        def key(s: Slot) -> tuple:
            started, turn = s.started, s.attained
            if not s.gpus:
                return (-s.priority, 1, turn, 1, s.seq)
            if not tick or started is None or now - started < half:
                return (-s.priority, 0, turn, s.seq)
            return (-s.priority, 1, turn, 1, s.seq)  # competes like a waiting job

        return key


class Levels:
    by_service = True

    def __init__(self, quantum: float, step: float, keep_turn: bool) -> None:
        self.half = quantum / 2
        self.limits = slice_levels(step)  # GPU-seconds
        self.hold = 0 if keep_turn else 1

    def key(self, now: float, tick: bool) -> Key:
        half, hold, limits = self.half, self.hold, self.limits

        def key(s: Slot) -> tuple:
            started = s.started
            turn = level(s.attained, limits) if started is not None else -1  # never run: first
            if not s.gpus:
                return (-s.priority, 1, turn, 1, s.seq)
            if not tick or started is None or now - started < half:
                return (-s.priority, 0, turn, s.seq)
            return (-s.priority, 1, turn, hold, s.seq)  # before its level's waiting if held

        return key

    def next_limit(self, attained: float) -> float | None:
        """The service at which a job with ``attained`` reaches its next level (None: the
        last), as ``las.level`` will see it."""
        at = level(attained, self.limits)
        return self.limits[at] - LEVEL_TOLERANCE if at < len(self.limits) else None


SliceOrder = RoundRobin | Las | Levels


def slice_levels(step: float) -> tuple[float, ...]:
    """The limits of the levels, in GPU-seconds: the las policy's (1 and 10 GPU-hours), then,
    with a ``step`` above 1, one every ``step`` times the one before, up to ``LEVELS_UP_TO``."""
    limits = list(QUEUE_LIMITS)
    while step > 1 and limits[-1] < LEVELS_UP_TO:
        limits.append(limits[-1] * step)
    return tuple(limits)
