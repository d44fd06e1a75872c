"""What the mechanisms of one gandiva policy share, and the type of their decisions."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TypeVar

from gandiva import actions as A
from gandiva.policies.gandiva.book import Book, Waiting
from gandiva.policies.gandiva.timers import Timers
from gandiva.state import Cluster, Job, JobStatus

T = TypeVar("T")
# a step of a decision: the job actions it takes, each applied to the state before it goes
# on, and what it found
Decision = Generator[A.JobAction, None, T]


@dataclass
class Shared:
    """The policy's book of homes and heights, its queue of jobs with no home, its timers,
    and a count of what may change a round's outcome (``quiet.py`` puts rounds off while it
    stays the same)."""

    quantum: float
    book: Book = field(default_factory=lambda: Book([], [], []))
    waiting: Waiting = field(default_factory=Waiting)
    timers: Timers = field(default_factory=Timers)
    changes: int = 0
    # the mechanisms' ``filter`` hooks: asked wherever a job gets a server, moves included
    filters: list[Callable[[Job, int, Cluster], bool]] = field(default_factory=list)
    # what orders a job against other users' jobs, first (a job is never displaced by one of
    # a lower tier): its priority; under fair shares (``fair.py``) its class, then whether its
    # team's quota guarantees it
    tier: Callable[[Job], int] = field(default=lambda job: job.priority)
    # what orders a job among its user's jobs after the mechanisms' ``order``: nothing; under
    # fair shares its priority
    rank: Callable[[Job], int] = field(default=lambda job: 0)

    def allows(self, job: Job, server: int, cluster: Cluster) -> bool:
        """May ``job`` go on ``server``, by every mechanism's filter?"""
        return all(f(job, server, cluster) for f in self.filters)

    def may_go(self, job: Job, cluster: Cluster) -> Callable[[int], bool] | None:
        """Which servers ``job`` may go on (``allows``); None where no mechanism filters (it
        may go on any)."""
        if not self.filters:
            return None
        return lambda server: self.allows(job, server, cluster)

    def start(self, job: Job, gpus: tuple[int, ...], now: float) -> A.JobAction:
        """Give ``job`` ``gpus`` now: a place, or a resume for a job suspended before."""
        self.book.last_start[job.id] = now
        if job.status is JobStatus.SUSPENDED:
            return A.Resume(job.id, gpus)
        return A.Place(job.id, gpus)

    def next_round(self, now: float) -> float:
        """Rounds fall on multiples of the quantum on every server, so that servers shared by
        a gang switch together."""
        return (math.floor(now / self.quantum + 1e-9) + 1) * self.quantum


def noting(actions: Decision[T]) -> Decision[tuple[T, bool]]:
    """Pass on what ``actions`` yields; return its result and whether it yielded any."""
    acted = False
    while True:
        try:
            action = next(actions)
        except StopIteration as end:
            return end.value, acted
        acted = True
        yield action
