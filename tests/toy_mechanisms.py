"""Mechanisms written outside the package, plugged into the gandiva policy by name: the proof
that its hooks are enough to add a scoring rule or an order without editing the policy."""

from __future__ import annotations

from collections import Counter

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva import Cycle, Mechanism, plug_in
from gandiva.policies.gandiva.framework import ignores_samples
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.state import Cluster, Job, JobStatus


class PreferType(Mechanism):
    """A toy scorer: a server of GPU type ``kind`` scores 1, any other 0."""

    may_change = ignores_samples

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def score(self, job: Job, server: int, cluster: Cluster) -> float:
        return float(cluster.gpus[cluster.nodes[server].gpus[0]].type == self.kind)

    def time_dependent(self) -> bool:
        return False


class UsersTakeTurns(Mechanism):
    """A toy per-user order: each user's n-th job goes before anyone's (n+1)-th."""

    def __init__(self) -> None:
        self.nth: dict[str, int] = {}
        self.seen: Counter[str] = Counter()

    def order(self, job: Job, now: float) -> float:
        if job.id not in self.nth:
            self.nth[job.id] = self.seen[job.spec.user]
            self.seen[job.spec.user] += 1
        return self.nth[job.id]


class Only(Mechanism):
    """A toy filter: jobs of model ``model`` only on servers of GPU type ``kind``."""

    def __init__(self, model: str, kind: str) -> None:
        self.model, self.kind = model, kind

    def filter(self, job: Job, server: int, cluster: Cluster) -> bool:
        gpu = cluster.gpus[cluster.nodes[server].gpus[0]]
        return job.spec.model != self.model or gpu.type == self.kind


class OnePerUser(Mechanism):
    """A toy quota: a user holds at most one place (a job with a home) at a time."""

    def __init__(self, shared: Shared) -> None:
        self.s = shared

    def permit(self, job: Job, cluster: Cluster) -> bool:
        return not any(cluster.jobs[j].spec.user == job.spec.user for j in self.s.book.home)


class Evict(Mechanism):
    """A toy room-maker: with no server for a job, suspend the running job of another user
    with the lowest priority; it keeps its home and time-slices back in."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[int, bool] | None]] = []

    def make_room(self, cluster: Cluster, job: Job, choice: tuple[int, bool] | None
                  ) -> Decision[bool]:
        self.asked.append((job.id, choice))
        if choice is not None:
            return False
        others = [j for j in cluster.jobs.values() if j.status is JobStatus.RUNNING
                  and j.spec.user != job.spec.user and j.num_gpus >= job.num_gpus]
        if not others:
            return False
        yield A.Suspend(min(others, key=lambda j: (j.priority, j.seq)).id)
        return True


class Log(Mechanism):
    """A toy observer: what the policy told it, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.actions: list[str] = []
        self.forgot: list[str] = []
        self.decisions = 0

    def observe(self, cluster: Cluster, event: E.Event, cycle: Cycle) -> Decision[None]:
        self.events.append(type(event).__name__)
        return
        yield

    def acted(self, action: A.JobAction) -> None:
        self.actions.append(type(action).__name__)

    def forget(self, job_id: str) -> None:
        self.forgot.append(job_id)

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        self.decisions += 1
        return
        yield


# one line each: registered by name, for a spec's ``plugins=``
plug_in("prefer-k80", lambda shared: PreferType("K80"))
plug_in("users-take-turns", lambda shared: UsersTakeTurns())
plug_in("one-per-user", OnePerUser)  # (made on the policy's own book)
