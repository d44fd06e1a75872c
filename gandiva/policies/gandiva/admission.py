"""Beyond the paper: least-attained-service admission when the cluster is full.

Gandiva over-subscribes servers up to ``max_height``; past that, the paper queues newcomers,
and under heavy load they wait hours for their first mini-batch while long jobs keep their
places in the time-slicing rotation. Here a newcomer instead takes the place of the job with the
most attained service (GPU-seconds) among the jobs of its width on any server: that job is
suspended and goes back to the waiting queue, ordered by attained service, as in Tiresias. A
gang larger than a server, at the head of the queue and with no place under ``max_height``,
likewise sends back, on the servers it needs, just enough of the jobs that had more service
than it to fit under ``max_height`` (``make_room``).

A victim may sit on a server of another affinity, and a gang clears servers only when it has
no place to over-subscribe (docs/decisions/0005 says why).
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil

from gandiva import actions as A
from gandiva.policies.gandiva.framework import Mechanism, ignores_samples
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.state import Cluster, Job, JobStatus

# the policy's: the job loses its home, queued at a rank
SendBack = Callable[[Cluster, Job, float], None]


class Queue(Mechanism):
    """The paper's: a newcomer with no place waits, in order of priority and arrival."""

    displaces = False
    may_change = ignores_samples

    def time_dependent(self) -> bool:
        return False

    def rank(self, job: Job, now: float) -> float:
        return 0.0

    def new_scan(self) -> None:
        pass

    def placed(self) -> None:
        pass

    def clear_for_gang(self, cluster: Cluster, job: Job) -> Decision[None]:
        return
        yield


class LasAdmission(Mechanism):
    """Places go to the least attained service: a newcomer with no place sends back the job
    of its width with the most, and the waiting queue is ordered by it."""

    displaces = True
    may_change = ignores_samples

    def __init__(self, shared: Shared, margin: float, max_height: float,
                 send_back: SendBack) -> None:
        self.s = shared
        self.margin = margin
        self.max_height = max_height
        self._send_back = send_back
        # per width, the priority and service of the last job ``displace`` found no job to
        # send back for, in this scan of the queue since its last placing
        self.no_victim: dict[int, tuple[int, float]] = {}

    def time_dependent(self) -> bool:
        return False  # (it acts for waiting jobs only, and Quiet keeps rounds while any wait)

    def make_room(self, cluster: Cluster, job: Job, choice: tuple[int, bool] | None
                  ) -> Decision[bool]:
        """No server for ``job``: send back the job of its width with the most service."""
        if choice is not None:
            return False
        return (yield from self.displace(cluster, job))

    def rank(self, job: Job, now: float) -> float:
        """A job's place in the waiting queue, after priority: its attained service."""
        return job.attained_at(now)

    def new_scan(self) -> None:
        self.no_victim = {}

    def placed(self) -> None:
        self.no_victim.clear()

    def send_back(self, cluster: Cluster, victim: Job) -> Decision[None]:
        if victim.status is JobStatus.RUNNING:
            yield A.Suspend(victim.id)
        self._send_back(cluster, victim, victim.attained_at(cluster.now))

    def displace(self, cluster: Cluster, job: Job) -> Decision[bool]:
        """Free one place of ``job``'s width on any server; False if none may go. A job with
        no higher priority and no less service than one of its width that found none (since
        the scan of the queue last placed a job) finds none either, and does not look
        (docs/decisions/0011)."""
        n = job.num_gpus
        attained = job.attained_at(cluster.now)
        if self.found_none_before(job, attained):
            return False
        victim = self.most_served(cluster, job, attained + self.margin)
        if victim is None:
            self.no_victim[n] = (self.s.tier(job), attained)
            return False
        yield from self.send_back(cluster, victim)
        return True

    def found_none_before(self, job: Job, attained: float) -> bool:
        """Did a job of ``job``'s width with no lower priority and no more service find none
        in this scan? (A test replaces this with False: looking again decides the same.)"""
        failed = self.no_victim.get(job.num_gpus)
        return failed is not None and failed[0] >= self.s.tier(job) and failed[1] <= attained

    def most_served(self, cluster: Cluster, job: Job, floor: float) -> Job | None:
        """The 1-server job of ``job``'s width, and no higher priority, with the most service
        above ``floor``, on any server; None if there is none."""
        now, n, book, tier = cluster.now, job.num_gpus, self.s.book, self.s.tier
        best: tuple[float, Job] | None = None
        for node in cluster.nodes:
            if not node.up or node.size < n:
                continue
            for jid in book.members[node.id]:
                other = cluster.jobs[jid]
                if other.num_gpus != n or len(book.home[jid]) > 1 or tier(other) > tier(job):
                    continue
                served = other.attained_at(now)
                if served > floor and (best is None or served > best[0]):
                    best = (served, other)
        return None if best is None else best[1]

    def clear_for_gang(self, cluster: Cluster, job: Job) -> Decision[None]:
        """Places for a gang wider than a server, at the head of the queue, when no server
        has one under ``max_height``: on the servers it needs, send back just enough of the
        jobs that had more service than it (plus the margin), and no higher priority, to bring
        each under ``max_height`` with the gang on it; most served first, on the servers that
        lose fewest. A gang sent back leaves all its servers."""
        now, book = cluster.now, self.s.book
        floor = job.attained_at(now) + self.margin
        size = cluster.max_free_bucket
        need = ceil(job.num_gpus / size)
        options = []
        for node in cluster.nodes:
            if not node.up or node.size != size:
                continue
            # what must go: the head of the queue may pass the cap by one GPU (``gang_servers``)
            excess = book.demand[node.id] + 1 - self.max_height * size
            victims: list[Job] = []
            if excess > 0:
                members = [cluster.jobs[j] for j in book.members[node.id]]
                served = {m.id: m.attained_at(now) for m in members}
                for m in sorted(members, key=lambda m: -served[m.id]):
                    if excess <= 0 or served[m.id] <= floor:
                        break
                    if self.s.tier(m) <= self.s.tier(job):
                        victims.append(m)
                        excess -= m.num_gpus if len(book.home[m.id]) == 1 else size
                if excess > 0:
                    continue
            options.append((len(victims), book.height(node.id), node.id, victims))
        if len(options) < need:
            return
        gone: dict[str, Job] = {}
        for *_, victims in sorted(options, key=lambda o: o[:3])[:need]:
            gone.update((v.id, v) for v in victims)
        for victim in gone.values():
            yield from self.send_back(cluster, victim)


Admission = Queue | LasAdmission
