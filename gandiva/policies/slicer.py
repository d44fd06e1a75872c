"""``slicer``: round robin, a ``quantum`` a turn; the smallest time-slicing policy.

Jobs take free GPUs first come, first served: a job on the server with the fewest free GPUs
that holds it, a gang wider than a server on whole free servers (else it waits). While jobs
wait, each running job yields once it has had a ``quantum`` of turn: the jobs that run next
are the running ones still within their turn, then the waiting ones in the order they began
to wait, then the running ones with the newest turn, as many as find room; the others are
suspended and join the back of the line. (Who yields is decided by the line, not by where
the room is: a gang waits until the turns that end free whole servers.)

Where actions take time (a real backend: ``Cluster.confirms``), a turn begins once the job's
node has started it, as the first event after its confirmation shows: a slow restore does
not eat the turn, and a job moved every quantum still trains.

Two optional mechanisms, off by default:

- ``pack``: a waiting job runs on the GPUs of a job as wide that runs alone, once both have
  reported their memory and they fit together; a packed pair runs until one of them ends.
- ``grow``: an elastic job widens into idle GPUs of its server once it has run a quantum and
  nothing waits; a job that then waits narrows it back to the width it asked for, at once.

Priorities, affinity, migration: none. This is the runtime's test policy (what the backends
are asked to do follows from these lines, whatever the gandiva policy's tuning) and the
smallest example of a policy that suspends, resumes, packs and resizes. Specs: ``slicer``,
``slicer:quantum=1``, ``slicer:quantum=3:pack``, ``slicer:grow:quantum=1``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import Field

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import Options as PolicyOptions
from gandiva.policies.placement import pick, pick_in_server
from gandiva.state import Cluster, Job, JobStatus


@dataclass
class Book:
    """The servers each started job takes its turns on: what the cluster view and a job's
    explanation read (``backends.explain``), as they read the gandiva policy's."""

    size: list[int] = field(default_factory=list)  # per server: its GPUs
    demand: list[int] = field(default_factory=list)  # per server: GPUs its jobs ask for there
    home: dict[str, tuple[int, ...]] = field(default_factory=dict)  # job -> its servers
    share: dict[str, dict[int, int]] = field(default_factory=dict)  # job -> server -> GPUs
    changes: int = 0  # counts changes, so that a reader copies only what changed

    def height(self, server: int) -> float:
        """Demand over capacity: above 1 the server is over-subscribed (the paper's word);
        0 for a server the book has not seen yet."""
        if server >= len(self.size):
            return 0.0
        return self.demand[server] / self.size[server]

    def add_servers(self, cluster: Cluster) -> None:
        for node in cluster.nodes[len(self.size):]:
            self.size.append(node.size)
            self.demand.append(0)
            self.changes += 1

    def assign(self, cluster: Cluster, job: Job) -> None:
        """The job's home is where it runs now."""
        self.release(job.id)
        share: dict[int, int] = {}
        for g in job.gpus:
            node = cluster.gpus[g].node
            share[node] = share.get(node, 0) + 1
        for node, count in share.items():
            self.demand[node] += count
        self.share[job.id], self.home[job.id] = share, tuple(sorted(share))
        self.changes += 1

    def release(self, job_id: str) -> None:
        for node, count in self.share.pop(job_id, {}).items():
            self.demand[node] -= count
        if self.home.pop(job_id, None) is not None:
            self.changes += 1


class Options(PolicyOptions):
    quantum: float = Field(60.0, gt=0)
    pack: bool = False
    grow: bool = False


@dataclass
class Slicer:
    quantum: float = 60.0  # seconds of turn before a running job yields to waiting ones
    pack: bool = False
    grow: bool = False
    name: str = "slicer"
    spec: str = "slicer"
    rng: random.Random = field(default_factory=random.Random, repr=False)
    book: Book = field(default_factory=Book, init=False, repr=False)
    # job -> when it last began to run or to wait (its place in the line, its turn's start)
    _since: dict[str, float] = field(default_factory=dict, repr=False)
    # jobs started whose node has not confirmed it yet: their turn has not begun
    _starting: dict[str, None] = field(default_factory=dict, repr=False)
    _wake: float = -1.0

    def placements(self) -> Book:
        """Where jobs belong, for readers (``backends.explain``), read, never written."""
        return self.book

    def decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        self._observe(event, cluster)
        yield from self._shrink(cluster)
        if self.pack:
            yield from self._pack(cluster)
        yield from self._rotate(cluster)
        if self.grow:
            yield from self._grow(cluster)
        wake = self._next_turn_end(cluster)
        if wake is not None and wake != self._wake:
            self._wake = wake
            yield A.Wake(wake)

    # ---- bookkeeping ----------------------------------------------------------------------
    def _observe(self, event: E.Event, cluster: Cluster) -> None:
        self.book.add_servers(cluster)
        for jid in list(self._starting):
            job = cluster.jobs.get(jid)
            if job is None or job.status is not JobStatus.RUNNING:
                del self._starting[jid]
            elif jid not in cluster.transitions:  # its node has started it: the turn begins
                del self._starting[jid]
                self._since[jid] = cluster.now
        if isinstance(event, E.Arrival):
            self._since[event.job.id] = event.time
        elif isinstance(event, E.Departure):
            self._since.pop(event.job_id, None)
            self.book.release(event.job_id)
        elif isinstance(event, E.Failure):  # its jobs are queued again, to start afresh
            for jid, servers in list(self.book.home.items()):
                if event.node in servers:
                    self.book.release(jid)
                    if cluster.jobs[jid].status is JobStatus.QUEUED:
                        self._since[jid] = event.time

    def _began(self, job: Job, cluster: Cluster) -> None:
        """The job began to run (or to wait, if it holds no GPU) now."""
        self._since[job.id] = cluster.now
        if job.gpus:
            self.book.assign(cluster, job)
            if cluster.confirms:
                self._starting[job.id] = None

    def _line(self, cluster: Cluster) -> list[Job]:
        """Waiting jobs, longest-waiting first."""
        waiting = [*cluster.suspended, *(jid for _, _, jid in cluster.queue)]
        jobs = [cluster.jobs[j] for j in waiting]
        return sorted(jobs, key=lambda j: (self._since[j.id], j.seq))

    def _alone(self, cluster: Cluster) -> list[Job]:
        """Running jobs that share no GPU (packed pairs are left to run)."""
        jobs = (cluster.jobs[j] for j in cluster.running)
        return [j for j in jobs if all(len(cluster.gpus[g].jobs) == 1 for g in j.gpus)]

    def _in_turn(self, job: Job, now: float) -> bool:
        return job.id in self._starting or now - self._since[job.id] < self.quantum

    # ---- decisions ------------------------------------------------------------------------
    def _rotate(self, cluster: Cluster) -> Iterator[A.Action]:
        """Choose who runs until the next turn ends; suspend the others, start the chosen."""
        line = self._line(cluster)
        if not line:
            return
        now = cluster.now
        done = sorted((j for j in self._alone(cluster) if not self._in_turn(j, now)),
                      key=lambda j: (-self._since[j.id], -j.seq))  # newest turn first
        # who runs next, placed on a copy of the free GPUs where every ended turn has left:
        # free GPUs are taken first, then those of the oldest turns
        room = self._free(cluster)
        cost = {g: len(done) - i for i, job in enumerate(done) for g in job.gpus}
        for job in done:
            for g in job.gpus:
                room[cluster.gpus[g].node].append(g)
        starts: list[tuple[Job, tuple[int, ...]]] = []
        stays: set[str] = set()
        for job in [*line, *done]:
            if job.status is JobStatus.RUNNING:  # an ended turn goes on where it is, if free
                if all(g in room[cluster.gpus[g].node] for g in job.gpus):
                    self._take(cluster, room, job.gpus)
                    stays.add(job.id)
            elif (gpus := self._place(cluster, room, job.num_gpus, cost)) is not None:
                self._take(cluster, room, gpus)
                starts.append((job, gpus))
        for job in done:
            if job.id not in stays:
                yield A.Suspend(job.id)
                self._began(job, cluster)
        for job, gpus in starts:
            if job.status is JobStatus.SUSPENDED:
                yield A.Resume(job.id, gpus)
            else:
                yield A.Place(job.id, gpus)
            self._began(job, cluster)

    @staticmethod
    def _free(cluster: Cluster) -> dict[int, list[int]]:
        """Each up server's free GPUs (a copy)."""
        return {n.id: list(cluster.free_gpus(n.id)) for n in cluster.nodes if n.up}

    @staticmethod
    def _take(cluster: Cluster, room: dict[int, list[int]], gpus: tuple[int, ...]) -> None:
        for g in gpus:
            room[cluster.gpus[g].node].remove(g)

    @staticmethod
    def _place(cluster: Cluster, room: dict[int, list[int]], count: int,
               cost: dict[int, int] | None = None) -> tuple[int, ...] | None:
        """GPUs for a job of ``count`` in ``room``: on the server with the fewest free GPUs
        that holds it; wider than any, on whole free servers, racks together; else None.
        Within a server, the GPUs of least ``cost`` (0: free now), then as ``pick`` packs
        sockets."""
        cost = cost or {}

        def take(server: int, n: int) -> list[int]:
            free = sorted(room[server], key=lambda g: (cost.get(g, 0), g))
            if any(cost.get(g, 0) for g in free[:n]):
                return free[:n]
            return pick(sorted(g for g in free if not cost.get(g, 0)),
                        lambda g: cluster.gpus[g].socket, n)

        fits = [s for s, free in room.items() if len(free) >= count]
        if fits:
            return tuple(take(min(fits, key=lambda s: (len(room[s]), s)), count))
        whole = sorted((s for s, free in room.items() if len(free) == cluster.nodes[s].size),
                       key=lambda s: (cluster.nodes[s].rack, s))
        picked: list[int] = []
        for s in whole:
            picked.extend(take(s, min(count - len(picked), len(room[s]))))
            if len(picked) == count:
                return tuple(picked)
        return None

    def _pack(self, cluster: Cluster) -> Iterator[A.Action]:
        for job in self._line(cluster):
            if job.memory_gb is None:
                continue
            host = next((r for r in self._alone(cluster) if self._fits(cluster, job, r)), None)
            if host is not None:
                yield A.Pack(job.id, host.gpus)
                self._began(job, cluster)

    @staticmethod
    def _fits(cluster: Cluster, job: Job, host: Job) -> bool:
        need, have = job.memory_gb, host.memory_gb
        return (need is not None and have is not None and len(host.gpus) == job.num_gpus
                and all(need + have <= cluster.gpus[g].memory_gb for g in host.gpus))

    def _shrink(self, cluster: Cluster) -> Iterator[A.Action]:
        """A job waits: grown jobs give back what they did not ask for."""
        if not cluster.queue and not cluster.suspended:
            return
        for job in self._alone(cluster):
            if len(job.gpus) > job.num_gpus:
                yield A.Shrink(job.id, job.gpus[:job.num_gpus])
                self._began(job, cluster)

    def _grow(self, cluster: Cluster) -> Iterator[A.Action]:
        """Nothing waits: elastic jobs a quantum into their turn widen into their server's
        idle GPUs."""
        if cluster.queue or cluster.suspended:
            return
        for job in self._alone(cluster):
            top = job.spec.max_gpus or job.num_gpus
            node = cluster.gpus[job.gpus[0]].node
            extra = min(top - len(job.gpus), len(cluster.free_gpus(node)))
            if job.spec.elastic and extra > 0 and not self._in_turn(job, cluster.now):
                more = pick_in_server(cluster, node, extra)
                yield A.Grow(job.id, (*job.gpus, *more))
                self._began(job, cluster)

    def _next_turn_end(self, cluster: Cluster) -> float | None:
        """When the earliest running turn ends, if anything may change then: a job waits,
        or (``grow``) a job could widen into idle GPUs."""
        running = self._alone(cluster)
        if not (cluster.queue or cluster.suspended) and not (
                self.grow and cluster.free_count() and any(j.spec.elastic for j in running)):
            return None
        now = cluster.now
        ends = [self._since[j.id] + self.quantum for j in running
                if j.id not in self._starting and self._in_turn(j, now)]
        if ends:
            return min(ends)
        if any(j.id in self._starting for j in running) and self._wake <= now:
            return now + self.quantum  # (a job that never reports: look again then)
        return None


POLICY = Slicer
