"""The policy's own bookkeeping: which jobs each server hosts (running or waiting its turn).

Gandiva assigns a job to a server even when the server has no free GPU (over-subscription);
the server then time-slices its jobs. The cluster state knows where jobs *run*; this book knows
where they *belong*, and from it the server's affinity and height.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType

from sortedcontainers import SortedList

from gandiva.state import Cluster, Job, JobStatus


class Waiting:
    """Jobs on no server yet, in order: higher priority (its class under fair shares), the
    mechanisms' order, then less attained service (with ``las_admission``; newcomers have
    none), then arrival."""

    def __init__(self) -> None:
        self._order: SortedList = SortedList()
        self._key: dict[str, tuple[int, float, int, float, int, str]] = {}

    def add(self, job: Job, attained: float = 0.0, before: float = 0.0,
            tier: int | None = None, rank: int = 0) -> None:
        """Queue ``job`` (again) by ``tier`` (its priority unless given), then ``before``
        (the mechanisms' order), ``rank`` (higher first) and ``attained``."""
        self.discard(job.id)
        key = (-(job.priority if tier is None else tier), before, -rank, attained, job.seq,
               job.id)
        self._key[job.id] = key
        self._order.add(key)

    def discard(self, job_id: str) -> None:
        key = self._key.pop(job_id, None)
        if key is not None:
            self._order.remove(key)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._key

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i: int) -> str:
        return self._order[i][-1]

    def index(self, job_id: str) -> int:
        return self._order.index(self._key[job_id])

    def first(self, n: int) -> Iterator[str]:
        for key in self._order.islice(0, n):
            yield key[-1]


MOVES_KEPT = 100_000  # jobs whose home changed, remembered for a reader (``moved_since``); a
# reader further behind than that looks at every job, as at its first look


@dataclass(frozen=True)
class Placement:
    """Where jobs belong, copied for readers on other threads (``Book.placement``)."""

    changes: int  # the book's count of changes when it was copied
    home: Mapping[str, tuple[int, ...]]  # job -> the servers it belongs to
    height: tuple[float, ...]  # server -> its height


@dataclass
class Book:
    members: list[dict[str, int]]  # per server: jobs assigned to it -> their width (ordered)
    demand: list[int]  # per server: GPUs its jobs ask for in total
    size: list[int]
    home: dict[str, tuple[int, ...]] = field(default_factory=dict)  # job -> its servers
    # per server: its members that span servers (gangs), so that a round finds the servers
    # its gangs reach without looking at every member (``timeslice.group``)
    gangs: list[dict[str, None]] = field(default_factory=list)
    last_start: dict[str, float] = field(default_factory=dict)  # for round-robin order
    # counts the changes to ``home`` and the heights, so that a reader copies them only when
    # they changed (``placement``)
    changes: int = 0
    # job -> the count of changes at its latest move, oldest first: kept once a reader asks
    # (``moved_since``), never in the simulator
    _moves: OrderedDict[str, int] | None = None
    _moves_from: int = 0  # ``_moves`` holds every move after this count
    # Indexes kept with ``members`` and ``demand``, so that placing an arrival looks at the few
    # servers that can take it, not at every server: servers by (height, id), all of them and
    # per affinity (``None``: no member).
    by_height: SortedList = field(default_factory=SortedList)
    by_affinity: dict[int | None, SortedList] = field(default_factory=dict)

    @classmethod
    def of(cls, cluster: Cluster) -> Book:
        book = cls([], [], [])
        book.add_servers(cluster)
        return book

    def add_servers(self, cluster: Cluster) -> None:
        """Open a page for each server that joined the cluster since the book last looked."""
        for node in cluster.nodes[len(self.size):]:
            self.changes += 1
            self.members.append({})
            self.gangs.append({})
            self.demand.append(0)
            self.size.append(node.size)
            self._file(node.id)

    def height(self, server: int) -> float:
        """Demand over capacity: above 1 the server time-slices (the paper's "height")."""
        return self.demand[server] / self.size[server]

    def affinity(self, server: int) -> int | None:
        """The gang size of the jobs a server hosts (the paper's affinity); None when empty.

        Decision: a server takes the affinity of its oldest member; jobs placed on it later by
        the fall-back steps do not change it.
        """
        for width in self.members[server].values():
            return width
        return None

    def assign(self, job: Job, servers: tuple[int, ...]) -> None:
        self.release(job)  # (counts the change)
        self.home[job.id] = servers
        share = job.num_gpus if len(servers) == 1 else None
        for s in servers:
            self._unfile(s)
            self.members[s][job.id] = job.num_gpus
            if share is None:
                self.gangs[s][job.id] = None
            self.demand[s] += share if share is not None else self.size[s]
            self._file(s)

    def release(self, job: Job) -> None:
        servers = self.home.pop(job.id, ())
        self.changes += 1
        if self._moves is not None:
            self._moved(job.id)
        share = job.num_gpus if len(servers) == 1 else None
        for s in servers:
            self._unfile(s)
            self.members[s].pop(job.id, None)
            self.gangs[s].pop(job.id, None)
            self.demand[s] -= share if share is not None else self.size[s]
            self._file(s)

    # ---- for readers (``backends.explain``) ----------------------------------------------
    def placement(self, last: Placement | None = None) -> Placement:
        """Where jobs belong now, and the servers' heights: ``last`` itself if the book has
        not changed since it was copied."""
        if last is not None and last.changes == self.changes:
            return last
        return Placement(self.changes, MappingProxyType(dict(self.home)),
                         tuple(self.height(s) for s in range(len(self.size))))

    def moved_since(self, changes: int) -> list[str] | None:
        """The jobs whose home changed after the book's count of changes read ``changes``,
        so that a reader looks at those again rather than at every job; None where the book
        does not remember that far back (at a reader's first call): look at every job."""
        if self._moves is None:
            self._moves, self._moves_from = OrderedDict(), self.changes
            return None
        if changes < self._moves_from:
            return None
        moved = []
        for job_id, at in reversed(self._moves.items()):
            if at <= changes:
                break
            moved.append(job_id)
        return moved

    def _moved(self, job_id: str) -> None:
        moves = self._moves
        assert moves is not None
        moves[job_id] = self.changes
        moves.move_to_end(job_id)
        if len(moves) > MOVES_KEPT:
            _, self._moves_from = moves.popitem(last=False)

    def _file(self, s: int) -> None:
        key = (self.height(s), s)
        self.by_height.add(key)
        self.by_affinity.setdefault(self.affinity(s), SortedList()).add(key)

    def _unfile(self, s: int) -> None:
        key = (self.height(s), s)
        self.by_height.remove(key)
        self.by_affinity[self.affinity(s)].remove(key)

    @staticmethod
    def lowest(servers: SortedList, fits: Callable[[int], bool], below: float
               ) -> tuple[float, int] | None:
        """The first (height, server) of ``servers`` (an index) that ``fits``, looking only
        at heights under ``below``."""
        for key in servers:
            if key[0] >= below:
                return None
            if fits(key[1]):
                return key
        return None

    def crowded(self) -> list[int]:
        """Servers above height 1 (they time-slice), highest first, then by id."""
        over = self.by_height.irange((1.0, float("inf")), inclusive=(False, True))
        # (a sort with reverse=True keeps equal heights in the order they come: ids rising)
        return [s for _, s in sorted(over, key=itemgetter(0), reverse=True)]

    def has_waiting(self, server: int, cluster: Cluster) -> bool:
        """Does a job assigned to ``server`` wait for a time slice? (``waiting`` without the
        list, for the checks made at every round.)"""
        jobs, running = cluster.jobs, JobStatus.RUNNING
        for j in self.members[server]:
            if jobs[j].status is not running:
                return True
        return False

    def waiting(self, server: int, cluster: Cluster) -> list[Job]:
        """Jobs assigned to ``server`` that are not running: they wait for a time slice."""
        return [cluster.jobs[j] for j in self.members[server]
                if cluster.jobs[j].status is not JobStatus.RUNNING]
