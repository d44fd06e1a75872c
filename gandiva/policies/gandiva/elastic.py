"""Grow and shrink for jobs that opt in (``min_gpus``/``max_gpus`` in their spec).

A job grows into GPUs of its own server that have stayed idle for ``grow_idle_s`` while nothing
waits; it shrinks back to the width it asked for as soon as new work needs those GPUs.
"""

from __future__ import annotations

from gandiva import actions as A
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.state import Cluster, Job, JobStatus


class Elastic:
    def __init__(self, shared: Shared, enabled: bool, grow_idle_s: float) -> None:
        self.s = shared
        self.enabled = enabled
        self.grow_idle_s = grow_idle_s
        self.jobs: dict[str, None] = {}  # the elastic jobs, switched on or not
        self.idle_since: dict[int, float] = {}  # server -> when its idle clock started

    def arrived(self, job: Job) -> None:
        if job.spec.elastic:
            self.jobs[job.id] = None

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

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

    def grow(self, cluster: Cluster, server: int) -> Decision[None]:
        """Give idle GPUs of ``server`` to its elastic jobs, if they stayed idle long enough."""
        since = self.idle_since.pop(server, None)
        if (since is None or cluster.now - since < self.grow_idle_s - 1e-9
                or len(self.s.waiting)):
            return
        if self.s.book.has_waiting(server, cluster):
            return
        for job in sorted(self._growable(cluster, server), key=lambda j: j.seq):
            free = cluster.free_gpus(server)
            if not free:
                return
            hi = job.spec.max_gpus or job.num_gpus
            extra = tuple(free[: hi - len(job.gpus)])
            yield A.Grow(job.id, tuple(sorted(job.gpus + extra)))

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
