"""Cluster state: servers, GPUs, jobs and where each job runs; the invariants live here.

Pure data plus the bookkeeping that keeps it consistent. Policies read it; only
``Cluster.observe`` (events) and ``Cluster.apply`` (actions) change it, so a policy can never
leave it half-updated.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from sortedcontainers import SortedList

from gandiva import actions as A
from gandiva import events as E
from gandiva.shares import Shares
from gandiva.spec import JobSpec

GPU_MEMORY_GB = {"V100": 16.0, "P100": 16.0, "P40": 24.0, "K80": 12.0, "T4": 16.0, "A100": 40.0}
SERVERS_PER_RACK = 16  # a typical top-of-rack switch fan-out; racks only group servers for locality
SOCKETS_PER_SERVER = 2  # two PCIe switches, one per CPU socket, as in the paper's 4-GPU servers


class InvariantError(ValueError):
    """An action would break the cluster's invariants (the policy has a bug)."""


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"
    KILLED = "killed"


@dataclass(slots=True)
class GPU:
    id: int
    node: int
    index: int
    socket: int
    type: str
    memory_gb: float
    jobs: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Node:
    id: int
    rack: int
    gpus: list[int]
    up: bool = True

    @property
    def size(self) -> int:
        return len(self.gpus)


@dataclass(slots=True)
class Job:
    spec: JobSpec
    seq: int
    priority: int
    status: JobStatus = JobStatus.QUEUED
    gpus: tuple[int, ...] = ()
    start_time: float | None = None
    finish_time: float | None = None
    attained: float = 0.0  # GPU-seconds of service received before ``run_since``
    run_since: float | None = None
    mini_batch_time: float | None = None  # profiled, never the simulator's truth
    memory_gb: float | None = None
    utilization: float | None = None
    mini_batches_done: int = 0
    suspends: int = 0
    migrations: int = 0
    # the spec's, copied: read millions of times a simulated day (a property cost 10% of the
    # default policy's time on the Philly list); a job's spec never changes
    id: str = field(init=False)
    num_gpus: int = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.spec.id
        self.num_gpus = self.spec.num_gpus

    def attained_at(self, now: float) -> float:
        """GPU-seconds of service up to ``now`` (Tiresias' attained service)."""
        if self.run_since is None:
            return self.attained
        return self.attained + (now - self.run_since) * len(self.gpus)


_SPEC_PART = re.compile(r"^(\d+)x(\d+)(?::([A-Za-z0-9]+))?$")


# what a job is doing between an action and its node's confirmation
TRANSITION = {A.Place: "starting", A.Resume: "resuming", A.Pack: "resuming",
              A.Suspend: "suspending", A.Unpack: "suspending", A.Migrate: "moving",
              A.Grow: "resizing", A.Shrink: "resizing", A.Kill: "stopping"}


class Cluster:
    """Servers with GPUs, and the jobs on them, with indexes for fast placement."""

    def __init__(self, nodes: list[Node], gpus: list[GPU]) -> None:
        self.nodes = nodes
        self.gpus = gpus
        self.jobs: dict[str, Job] = {}
        # Real backends carry actions out while the loop goes on, so a job is in transition
        # (job -> "suspending", ...) from its action until its node confirms (``Confirmed``);
        # policies see it there. Decision: the simulator's actions take effect at once (their
        # cost is modelled as a stall of the job), so it leaves ``confirms`` off and this empty.
        self.confirms = False
        self.transitions: dict[str, str] = {}
        # GPUs whose jobs changed, for a watcher that takes them (a real backend's timeline:
        # it looks at these, not at every GPU, after each event); None: nobody watches
        self.touched: set[int] | None = None
        self.now = 0.0
        self.queue: SortedList = SortedList()  # (submit_time, seq, job_id) of queued jobs
        self.suspended: dict[str, None] = {}  # ordered set
        self.running: dict[str, None] = {}
        self.finished = 0
        self._seq = 0
        # free (unused) GPUs per server, and servers bucketed by their count of free GPUs
        self._free: list[list[int]] = [list(n.gpus) for n in nodes]
        self._by_free: list[dict[int, None]] = [{} for _ in range(max(n.size for n in nodes) + 1)]
        for n in nodes:
            self._by_free[n.size][n.id] = None
        self.total_gpus = len(gpus)
        self.smallest = min(n.size for n in nodes)  # GPUs of the smallest server
        self._free_total = len(gpus)  # free GPUs on up servers
        self._down_gpus = 0
        self.shares = Shares()  # teams' and users' tickets: the backend's to set

    # ---- construction -------------------------------------------------------------------
    def driven_by(self, *, confirms: bool = False, watched: bool = False) -> None:
        """Say how the backend driving this state works: whether its actions take time
        (``confirms``), and whether it watches the GPUs whose jobs change (``watched``: it
        reads and clears ``touched``)."""
        self.confirms = confirms
        self.touched = set() if watched else None

    @classmethod
    def build(
        cls, spec: str = "25x4", gpu_type: str = "V100", sockets: int = SOCKETS_PER_SERVER
    ) -> Cluster:
        """Build from ``"25x4"`` or ``"23x4:P100+22x4:P40"`` (servers x GPUs per server[:type])."""
        nodes: list[Node] = []
        gpus: list[GPU] = []
        for part in spec.replace(" ", "").split("+"):
            m = _SPEC_PART.match(part)
            if not m:
                raise ValueError(
                    f"cluster: cannot read {part!r}; write SERVERSxGPUS[:TYPE], e.g. 25x4 or "
                    "23x4:P100+22x4:P40"
                )
            count, per, kind = int(m[1]), int(m[2]), (m[3] or gpu_type)
            kind = kind.upper()
            if count < 1 or per < 1:
                raise ValueError(f"cluster: {part!r} needs at least one server with one GPU")
            if kind not in GPU_MEMORY_GB:
                raise ValueError(
                    f"cluster: unknown GPU type {kind!r}; known: {', '.join(GPU_MEMORY_GB)}"
                )
            n_sockets = sockets if per >= 2 * sockets else 1  # small servers: one PCIe switch
            for _ in range(count):
                nid = len(nodes)
                ids = []
                for i in range(per):
                    g = GPU(len(gpus), nid, i, i * n_sockets // per, kind, GPU_MEMORY_GB[kind])
                    gpus.append(g)
                    ids.append(g.id)
                nodes.append(Node(nid, nid // SERVERS_PER_RACK, ids))
        return cls(nodes, gpus)

    # ---- queries ------------------------------------------------------------------------
    def free_gpus(self, node: int) -> list[int]:
        return self._free[node]

    def free_count(self) -> int:
        return self._free_total

    def allocated_count(self) -> int:
        """GPUs on up servers that run at least one job."""
        return self.total_gpus - self._down_gpus - self._free_total

    def up_gpus(self) -> int:
        return self.total_gpus - self._down_gpus

    def nodes_with_free(self, count: int) -> Iterator[int]:
        """Up servers with exactly ``count`` free GPUs, in id order."""
        if count < len(self._by_free):
            yield from self._by_free[count]

    @property
    def max_free_bucket(self) -> int:
        return len(self._by_free) - 1

    def queued_jobs(self) -> Iterator[Job]:
        for _, _, jid in self.queue:
            yield self.jobs[jid]

    def jobs_on(self, gpus: Iterable[int]) -> set[str]:
        return {j for g in gpus for j in self.gpus[g].jobs}

    def servers_of(self, gpus: Iterable[int]) -> set[int]:
        return {self.gpus[g].node for g in gpus}

    def splits_sockets(self, gpus: tuple[int, ...]) -> bool:
        """Are ``gpus`` on one server but over several sockets, when one socket could hold
        them? (Spanning sockets costs only such jobs: the paper's 1x4 ResNet-50 baseline
        already spans both sockets of its server.)"""
        node = self.nodes[self.gpus[gpus[0]].node]
        if any(self.gpus[g].node != node.id for g in gpus[1:]):
            return False
        if len({self.gpus[g].socket for g in gpus}) < 2:
            return False
        per_socket: dict[int, int] = {}
        for g in node.gpus:
            per_socket[self.gpus[g].socket] = per_socket.get(self.gpus[g].socket, 0) + 1
        return len(gpus) <= max(per_socket.values())

    def active_count(self) -> int:
        return len(self.queue) + len(self.running) + len(self.suspended)

    # ---- events -------------------------------------------------------------------------
    def observe(self, event: E.Event) -> None:
        self.now = event.time
        if isinstance(event, E.Arrival):
            spec = event.job
            old = self.jobs.get(spec.id)
            if old is not None and old.status not in (JobStatus.DONE, JobStatus.KILLED):
                raise InvariantError(f"job {spec.id!r} arrived twice")
            # (a job that left may come back: one its user held, then released)
            job = Job(spec, self._seq, spec.priority)
            self._seq += 1
            self.jobs[spec.id] = job
            self.queue.add((spec.submit_time, job.seq, spec.id))
        elif isinstance(event, E.Departure):
            job = self.jobs[event.job_id]
            if job.status is JobStatus.QUEUED:
                self.queue.discard((job.spec.submit_time, job.seq, job.id))
            elif job.status is JobStatus.SUSPENDED:
                del self.suspended[job.id]
            self._stop(job)
            job.status = JobStatus.DONE if event.how == "done" else JobStatus.KILLED
            job.finish_time = event.time
            self.transitions.pop(job.id, None)
            self.finished += 1
        elif isinstance(event, E.ProfileSample):
            job = self.jobs[event.job_id]
            job.mini_batch_time = event.mini_batch_time
            job.memory_gb = event.memory_gb
            job.utilization = event.utilization
            job.mini_batches_done = event.mini_batches_done
        elif isinstance(event, E.PriorityChange):
            self.jobs[event.job_id].priority = event.priority
        elif isinstance(event, E.Failure):
            node = self.nodes[event.node]
            node.up = False
            self._by_free[len(self._free[node.id])].pop(node.id, None)
            self._free_total -= len(self._free[node.id])
            self._down_gpus += node.size
            for jid in sorted(self.jobs_on(node.gpus), key=lambda j: self.jobs[j].seq):
                job = self.jobs[jid]
                self._stop(job)
                self._enqueue(job)
                self.transitions.pop(jid, None)  # its node is gone: nothing to confirm
        elif isinstance(event, E.Join):
            self._join(event)
        elif isinstance(event, E.Confirmed):
            self.transitions.pop(event.job_id, None)

    def _join(self, event: E.Join) -> None:
        """Add a server whose GPUs are all free. Ids continue after every earlier server and
        GPU: a failed server stays down under its old id, and comes back as a new one."""
        if event.gpus < 1:
            raise InvariantError(f"Join: a server needs at least one GPU, got {event.gpus}")
        nid = len(self.nodes)
        ids = list(range(len(self.gpus), len(self.gpus) + event.gpus))
        # Decision: one socket, as the event does not report the server's PCIe topology (no
        # job on it is charged for spanning sockets)
        self.gpus.extend(GPU(g, nid, i, 0, event.gpu_type, event.memory_gb)
                         for i, g in enumerate(ids))
        # Decision: the last server's rack, as the event reports none (racks only group
        # servers for locality, so a wrong guess costs placement quality, never correctness)
        self.nodes.append(Node(nid, self.nodes[-1].rack if self.nodes else 0, ids))
        self._free.append(list(ids))
        while len(self._by_free) <= event.gpus:  # a server bigger than any before
            self._by_free.append({})
        self._by_free[event.gpus][nid] = None
        self.smallest = min(self.smallest, event.gpus)
        self.total_gpus += event.gpus
        self._free_total += event.gpus

    # ---- actions ------------------------------------------------------------------------
    def apply(self, action: A.Action) -> None:
        """Carry out ``action`` on the state, or raise ``InvariantError`` leaving it unchanged."""
        if isinstance(action, A.Wake):
            return
        job = self.jobs.get(action.job_id)
        if job is None:
            raise InvariantError(f"{type(action).__name__}: unknown job {action.job_id!r}")
        st = job.status
        if isinstance(action, A.Place):
            self._expect(action, job, JobStatus.QUEUED)
            self._check_gpus(job, action.gpus, exclusive=True)
            self.queue.remove((job.spec.submit_time, job.seq, job.id))
            self._start(job, action.gpus)
        elif isinstance(action, A.Resume):
            self._expect(action, job, JobStatus.SUSPENDED)
            self._check_gpus(job, action.gpus, exclusive=True)
            del self.suspended[job.id]
            self._start(job, action.gpus)
        elif isinstance(action, A.Pack):
            self._expect(action, job, JobStatus.QUEUED, JobStatus.SUSPENDED)
            self._check_gpus(job, action.gpus, exclusive=False)
            if st is JobStatus.QUEUED:
                self.queue.remove((job.spec.submit_time, job.seq, job.id))
            else:
                del self.suspended[job.id]
            self._start(job, action.gpus)
        elif isinstance(action, A.Suspend | A.Unpack):
            self._expect(action, job, JobStatus.RUNNING)
            if isinstance(action, A.Unpack) and not any(
                len(self.gpus[g].jobs) > 1 for g in job.gpus
            ):
                raise InvariantError(f"Unpack: job {job.id!r} shares no GPU")
            self._stop(job)
            job.status = JobStatus.SUSPENDED
            job.suspends += 1
            self.suspended[job.id] = None
        elif isinstance(action, A.Migrate | A.Grow | A.Shrink):
            self._expect(action, job, JobStatus.RUNNING)
            old = job.gpus
            self._stop(job)
            try:
                self._check_gpus(job, action.gpus, exclusive=True, resize=not isinstance(
                    action, A.Migrate))
                if isinstance(action, A.Grow) and len(action.gpus) <= len(old):
                    raise InvariantError(f"Grow: job {job.id!r} must get more than {len(old)} GPUs")
                if isinstance(action, A.Shrink) and len(action.gpus) >= len(old):
                    raise InvariantError(f"Shrink: job {job.id!r} must get fewer than {len(old)}")
            except InvariantError:
                self._start(job, old)  # leave the state unchanged
                raise
            self._start(job, action.gpus)
            if isinstance(action, A.Migrate):
                job.migrations += 1
        elif isinstance(action, A.Kill):
            if st in (JobStatus.DONE, JobStatus.KILLED):
                raise InvariantError(f"Kill: job {job.id!r} already {st}")
            if st is JobStatus.QUEUED:
                self.queue.remove((job.spec.submit_time, job.seq, job.id))
            elif st is JobStatus.SUSPENDED:
                del self.suspended[job.id]
            else:
                self._stop(job)
            job.status = JobStatus.KILLED
            job.finish_time = self.now
        else:  # pragma: no cover - exhaustive over Action
            raise InvariantError(f"unknown action {action!r}")
        if self.confirms:
            self.transitions[job.id] = TRANSITION[type(action)]

    # ---- internals ----------------------------------------------------------------------
    @staticmethod
    def _expect(action: A.Action, job: Job, *allowed: JobStatus) -> None:
        if job.status not in allowed:
            want = " or ".join(s.value for s in allowed)
            raise InvariantError(
                f"{type(action).__name__}: job {job.id!r} is {job.status.value}, must be {want}"
            )

    def _check_gpus(
        self, job: Job, gpus: tuple[int, ...], *, exclusive: bool, resize: bool = False
    ) -> None:
        name = f"job {job.id!r}"
        if len(set(gpus)) != len(gpus):
            raise InvariantError(f"{name}: GPU listed twice in {gpus}")
        spec = job.spec
        if resize:
            lo, hi = spec.min_gpus or spec.num_gpus, spec.max_gpus or spec.num_gpus
            if not spec.elastic or not lo <= len(gpus) <= hi:
                raise InvariantError(f"{name}: {len(gpus)} GPUs outside its range {lo}..{hi}")
        elif len(gpus) != spec.num_gpus:
            raise InvariantError(
                f"{name}: a gang is placed whole; it needs {spec.num_gpus} GPUs, got {len(gpus)}"
            )
        for g in gpus:
            if not 0 <= g < len(self.gpus):
                raise InvariantError(f"{name}: no GPU {g}")
            gpu = self.gpus[g]
            if not self.nodes[gpu.node].up:
                raise InvariantError(f"{name}: GPU {g} is on down server {gpu.node}")
            if exclusive and gpu.jobs:
                raise InvariantError(f"{name}: GPU {g} is in use by {gpu.jobs}")
            if not exclusive and gpu.jobs:
                need = [job, *(self.jobs[j] for j in gpu.jobs)]
                if any(j.memory_gb is None for j in need):
                    raise InvariantError(f"{name}: cannot pack on GPU {g} before profiling memory")
                used = sum(j.memory_gb or 0.0 for j in need)
                if used > gpu.memory_gb:
                    raise InvariantError(
                        f"{name}: packing needs {used:.1f} GB on GPU {g} of {gpu.memory_gb:.0f} GB"
                    )

    def _start(self, job: Job, gpus: tuple[int, ...]) -> None:
        for g in gpus:
            gpu = self.gpus[g]
            if not gpu.jobs:
                self._take(gpu)
            gpu.jobs.append(job.id)
        if self.touched is not None:
            self.touched.update(gpus)
        job.gpus = tuple(gpus)
        job.status = JobStatus.RUNNING
        job.run_since = self.now
        if job.start_time is None:
            job.start_time = self.now
        self.running[job.id] = None

    def _stop(self, job: Job) -> None:
        if job.status is not JobStatus.RUNNING:
            return
        job.attained = job.attained_at(self.now)
        job.run_since = None
        for g in job.gpus:
            gpu = self.gpus[g]
            gpu.jobs.remove(job.id)
            if not gpu.jobs:
                self._give(gpu)
        if self.touched is not None:
            self.touched.update(job.gpus)
        job.gpus = ()
        del self.running[job.id]

    def _enqueue(self, job: Job) -> None:
        job.status = JobStatus.QUEUED
        self.queue.add((job.spec.submit_time, job.seq, job.id))

    def _take(self, gpu: GPU) -> None:
        free = self._free[gpu.node]
        up = self.nodes[gpu.node].up
        if up:
            self._by_free[len(free)].pop(gpu.node)
            self._free_total -= 1
        free.remove(gpu.id)
        if up:
            self._by_free[len(free)][gpu.node] = None

    def _give(self, gpu: GPU) -> None:
        free = self._free[gpu.node]
        up = self.nodes[gpu.node].up
        if up:
            self._by_free[len(free)].pop(gpu.node)
            self._free_total += 1
        bisect.insort(free, gpu.id)
        if up:
            self._by_free[len(free)][gpu.node] = None

    def check_invariants(self) -> None:
        """Full consistency check (for tests; the hot path checks only what an action touches)."""
        for g in self.gpus:
            if len(g.jobs) > 1:
                used = sum(self.jobs[j].memory_gb or 0.0 for j in g.jobs)
                if used > g.memory_gb:
                    raise InvariantError(f"GPU {g.id} over memory: {used} > {g.memory_gb}")
            for j in g.jobs:
                if g.id not in self.jobs[j].gpus:
                    raise InvariantError(f"GPU {g.id} lists {j} which does not list it")
        for jid in self.running:
            job = self.jobs[jid]
            if job.status is not JobStatus.RUNNING or not job.gpus:
                raise InvariantError(f"running job {jid} has status {job.status} gpus {job.gpus}")
        for n in self.nodes:
            free = [g for g in n.gpus if not self.gpus[g].jobs]
            if sorted(free) != self._free[n.id]:
                raise InvariantError(f"server {n.id} free index {self._free[n.id]} != {free}")
            if n.up and n.id not in self._by_free[len(free)]:
                raise InvariantError(f"server {n.id} missing from free bucket {len(free)}")
        if sum(map(len, self._by_free)) != sum(n.up for n in self.nodes):
            raise InvariantError("free buckets do not hold each up server exactly once")
        if self._free_total != sum(len(self._free[n.id]) for n in self.nodes if n.up):
            raise InvariantError("free GPU total out of step")
        ids = list(range(len(self.gpus)))
        if [g.id for g in self.gpus] != ids or [n.id for n in self.nodes] != list(
                range(len(self.nodes))) or self.total_gpus != len(self.gpus):
            raise InvariantError("server or GPU ids are not their positions, or total is off")
        if sorted(g for n in self.nodes for g in n.gpus) != ids or any(
                self.gpus[g].node != n.id for n in self.nodes for g in n.gpus):
            raise InvariantError("servers do not list each GPU once, each on its own server")
