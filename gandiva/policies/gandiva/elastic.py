"""Grow and shrink for jobs that opt in (``min_gpus``/``max_gpus`` in their spec).

A job grows into GPUs of its own server that have stayed idle for ``grow_idle_s`` while nothing
waits; it shrinks back to the width it asked for as soon as new work needs those GPUs.
"""

from __future__ import annotations

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.framework import Cycle, Mechanism, ignores_samples
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.state import Cluster, Job, JobStatus


class Elastic(Mechanism):
    timers = {TimerKind.GROW: "grow"}
    may_change = ignores_samples

    def __init__(self, shared: Shared, grow_idle_s: float) -> None:
        self.s = shared
        self.grow_idle_s = grow_idle_s
        self.jobs: dict[str, None] = {}  # the elastic jobs
        self.idle_since: dict[int, float] = {}  # server -> when its idle clock started

    # ---- hooks --------------------------------------------------------------------------
    def observe(self, cluster: Cluster, event: E.Event, cycle: Cycle) -> Decision[None]:
        if isinstance(event, E.Arrival) and event.job.elastic:
            self.jobs[event.job.id] = None
        return
        yield

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def make_room(self, cluster: Cluster, job: Job, choice: tuple[int, bool] | None
                  ) -> Decision[bool]:
        """Shrink at once when new work would wait for GPUs a grown job holds, before
        time-slicing anyone (the shrinks are chosen together, before any is applied)."""
        if (choice is not None and choice[1]) or not self.grown(cluster):
            return False
        shrunk = list(self.shrink_for(cluster, job))
        yield from shrunk
        return bool(shrunk)

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        if self.jobs:
            self.note_idle(cluster, cycle.touched | cycle.placed_on)
        return
        yield

    def time_dependent(self) -> bool:
        return bool(self.jobs)  # an idle clock runs

    def grown(self, cluster: Cluster) -> bool:
        """Does any elastic job run wider than it asked (so that it could shrink)?"""
        return any(len(cluster.jobs[j].gpus) > cluster.jobs[j].num_gpus for j in self.jobs)

    def note_idle(self, cluster: Cluster, servers: set[int]) -> None:
        """Start the idle clock of servers that have free GPUs and an elastic job to grow."""
        for s in servers:
            if cluster.free_gpus(s) and self._growable(cluster, s) and s not in self.idle_since:
                self.idle_since[s] = cluster.now
                self.s.timers.arm(cluster.now + self.grow_idle_s, TimerKind.GROW, s)

    def _growable(self, cluster: Cluster, server: int) -> list[Job]:
        book, out = self.s.book, []
        for jid in book.members[server]:
            job = cluster.jobs[jid]
            hi = job.spec.max_gpus or job.num_gpus
            if job.status is JobStatus.RUNNING and len(job.gpus) < hi and len(book.home[jid]) == 1:
                out.append(job)
        return out

    def grow(self, cluster: Cluster, server: int, cycle: Cycle) -> Decision[bool]:
        """Give idle GPUs of ``server`` to its elastic jobs, if they stayed idle long enough."""
        since = self.idle_since.pop(server, None)
        if (since is None or cluster.now - since < self.grow_idle_s - 1e-9
                or len(self.s.waiting)):
            return False
        if self.s.book.has_waiting(server, cluster):
            return False
        for job in sorted(self._growable(cluster, server), key=lambda j: j.seq):
            free = cluster.free_gpus(server)
            if not free:
                return False
            hi = job.spec.max_gpus or job.num_gpus
            extra = tuple(free[: hi - len(job.gpus)])
            yield A.Grow(job.id, tuple(sorted(job.gpus + extra)))
        return False

    def shrink_for(self, cluster: Cluster, need: Job) -> Decision[None]:
        """Shrink grown jobs on one server so that ``need`` fits there; nothing if none can."""
        members = self.s.book.members
        for server in range(len(cluster.nodes)):
            if not cluster.nodes[server].up or cluster.nodes[server].size < need.num_gpus:
                continue
            grown = [cluster.jobs[j] for j in members[server]
                     if cluster.jobs[j].status is JobStatus.RUNNING
                     and len(cluster.jobs[j].gpus) > cluster.jobs[j].num_gpus]
            spare = sum(len(j.gpus) - j.num_gpus for j in grown)
            if not grown or len(cluster.free_gpus(server)) + spare < need.num_gpus:
                continue
            for job in grown:
                yield A.Shrink(job.id, job.gpus[: job.num_gpus])
                if len(cluster.free_gpus(server)) >= need.num_gpus:
                    break
            return
