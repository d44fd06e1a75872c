"""Migration: for locality when jobs leave, and background defragmentation.

Locality: a job spread over more servers than it needs (or over two sockets when one would
hold it) moves to a consolidated set of GPUs as soon as departures make one free.

Defragmentation: when a waiting job could run on the free GPUs the cluster has, but no server
holds enough of them, empty the non-idle server with the most free GPUs by moving its jobs onto
other servers' free GPUs, as long as each move costs little. A move's cost is estimated from
the job's profiled GPU memory (an upper bound on its checkpoint) with the paper's Fig 13 slope.
"""

from __future__ import annotations

from collections.abc import Callable

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.framework import Cycle, Mechanism, ignores_samples
from gandiva.policies.gandiva.placement import Allowed, allowed_on, is_spread
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.policies.placement import best_fit, pick_in_server
from gandiva.state import Cluster, Job, JobStatus

# Fig 13: 0.22 s at 8 MB to 2.45 s at 1,405 MB within a server: about 0.2 s + 1.6 ms per MB
MOVE_FIXED_S, MOVE_PER_MB_S = 0.2, 0.0016
UNPROFILED_MEMORY_GB = 16.0  # a job not yet profiled is assumed to fill a 16 GB GPU


def move_cost(job: Job) -> float:
    gb = job.memory_gb if job.memory_gb is not None else UNPROFILED_MEMORY_GB
    return MOVE_FIXED_S + MOVE_PER_MB_S * gb * 1024


class Locality(Mechanism):
    """Jobs placed spread out, moved onto consolidated GPUs as departures free some."""

    may_change = ignores_samples

    def __init__(self, shared: Shared, max_moves: int) -> None:
        self.s = shared
        self.max_moves = max_moves
        self.spread: dict[str, None] = {}  # spread jobs, in the order they were placed

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        if isinstance(cycle.event, E.Departure | E.Join):  # GPUs became free, or new ones came
            yield from self.consolidate(cluster)

    def time_dependent(self) -> bool:
        return False

    def placed(self, cluster: Cluster, job: Job) -> None:
        if is_spread(cluster, job.num_gpus, job.gpus):
            self.spread[job.id] = None

    def forget(self, job_id: str) -> None:
        self.spread.pop(job_id, None)

    def consolidate(self, cluster: Cluster) -> Decision[None]:
        """Move spread jobs onto consolidated GPUs that have become free (a few per
        decision, so that one departure cannot start a migration storm)."""
        moved = 0
        for jid in list(self.spread):
            job = cluster.jobs[jid]
            if job.status is not JobStatus.RUNNING or not is_spread(cluster, job.num_gpus,
                                                                   job.gpus):
                self.spread.pop(jid, None)
                continue
            if moved >= self.max_moves:
                return
            if jid in cluster.transitions:
                continue  # still starting or moving on its node: looked at again later
            target = _consolidated(cluster, job, self.s.may_go(job, cluster))
            if target is None:
                continue
            yield A.Migrate(jid, target)
            self.spread.pop(jid, None)
            self.s.book.assign(job, tuple(sorted(cluster.servers_of(target))))
            moved += 1


def _consolidated(cluster: Cluster, job: Job, may: Allowed) -> tuple[int, ...] | None:
    n = job.num_gpus
    if n <= cluster.max_free_bucket:
        for have in range(n, cluster.max_free_bucket + 1):
            for node in cluster.nodes_with_free(have):
                if may is not None and not may(node):
                    continue
                gpus = tuple(pick_in_server(cluster, node, n))
                if not is_spread(cluster, n, gpus):
                    return gpus
        return None
    fit = allowed_on(cluster, best_fit(cluster, n), may)
    return None if fit is None or is_spread(cluster, n, fit) else fit


class Defrag(Mechanism):
    """Empty a server when a waiting job could run on the free GPUs if they were on one."""

    timers = {TimerKind.DEFRAG: "on_defrag"}
    may_change = ignores_samples

    def __init__(self, shared: Shared, interval: float, max_move_s: float,
                 scan_depth: int) -> None:
        self.s = shared
        self.interval = interval
        self.max_move_s = max_move_s
        self.scan_depth = scan_depth
        self.count = 0  # servers emptied

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        """While jobs wait on GPUs that are free but fragmented, try every ``interval``."""
        timers = self.s.timers
        if (len(self.s.waiting) and timers.when(TimerKind.DEFRAG) is None
                and self.blocked(cluster)):
            timers.arm(cluster.now + self.interval, TimerKind.DEFRAG)
        return
        yield

    def on_defrag(self, cluster: Cluster, server: int, cycle: Cycle) -> Decision[bool]:
        yield from self.run(cluster)
        return True  # the waiting jobs are looked at again

    def time_dependent(self) -> bool:
        return False

    def blocked(self, cluster: Cluster) -> Job | None:
        """The first waiting job that the free GPUs could hold if they were on one server."""
        free = cluster.free_count()
        for jid in self.s.waiting.first(self.scan_depth):
            job = cluster.jobs[jid]
            if job.num_gpus <= free and job.num_gpus <= cluster.max_free_bucket and not any(
                    True for have in range(job.num_gpus, cluster.max_free_bucket + 1)
                    for _ in cluster.nodes_with_free(have)):
                return job
        return None

    def run(self, cluster: Cluster) -> Decision[None]:
        """Empty the non-idle server with the most free GPUs, if its jobs move cheaply."""
        if self.blocked(cluster) is None:
            return
        book = self.s.book
        sources = [n.id for n in cluster.nodes
                   if n.up and 0 < len(cluster.free_gpus(n.id)) < n.size]
        for source in sorted(sources, key=lambda s: (-len(cluster.free_gpus(s)), s)):
            members = [cluster.jobs[j] for j in book.members[source]]
            if not members or any(
                j.status is not JobStatus.RUNNING or len(book.home[j.id]) > 1
                or j.id in cluster.transitions  # a job its node is still moving stays put
                or move_cost(j) > self.max_move_s or len(cluster.gpus[j.gpus[0]].jobs) > 1
                for j in members
            ):
                continue
            plan = _plan_moves(cluster, source, members, self.s.may_go)
            if plan is None:
                continue
            for job, gpus in plan:
                yield A.Migrate(job.id, gpus)
                book.assign(job, (cluster.gpus[gpus[0]].node,))
            self.count += 1
            return


def _plan_moves(cluster: Cluster, source: int, jobs: list[Job],
                may_go: Callable[[Job, Cluster], Allowed]) -> list | None:
    """Best-fit destinations on other servers for all ``jobs``, or None if any has none."""
    free = {n.id: len(cluster.free_gpus(n.id)) for n in cluster.nodes
            if n.up and n.id != source and cluster.free_gpus(n.id)}
    taken: dict[int, int] = {}
    plan = []
    for job in sorted(jobs, key=lambda j: -j.num_gpus):
        may = may_go(job, cluster)
        fits = [s for s, f in free.items() if f >= job.num_gpus and (may is None or may(s))]
        if not fits:
            return None
        dest = min(fits, key=lambda s: (free[s], s))
        gpus = cluster.free_gpus(dest)[taken.get(dest, 0): taken.get(dest, 0) + job.num_gpus]
        taken[dest] = taken.get(dest, 0) + job.num_gpus
        free[dest] -= job.num_gpus
        plan.append((job, tuple(gpus)))
    return plan
