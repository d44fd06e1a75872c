"""Algorithm 1 of the paper: affinity placement with over-subscription.

For a job that fits in one server, in order: a server of the same affinity with free GPUs,
least loaded first; an empty server; any server with free GPUs; over-subscribe a server of the
same affinity; (ours) over-subscribe any server; else the job queues. "Load" is the server's
height (GPUs demanded by its jobs over its GPUs). A job larger than a server gets whole free
servers, racks kept together. Reactively, as GPUs free up, waiting jobs move from the highest
servers onto them (``lower_height``). The mechanisms' filters and scores join in (``Placer``).
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil

from gandiva.policies.gandiva.book import Book
from gandiva.policies.gandiva.config import PlacementSettings
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.policies.placement import best_fit, pick_in_server
from gandiva.state import Cluster, Job

Score = Callable[[Job, int, Cluster], float]
Allowed = Callable[[int], bool] | None  # may a given job go on this server (None: any)


def choose_server(
    job: Job, cluster: Cluster, book: Book, max_height: float, oversubscribe: bool,
    head: bool = False,
) -> tuple[int, bool] | None:
    """The server for ``job`` and whether it can start at once (False: it waits for a slice).

    Beyond Algorithm 1, when no server of the job's affinity has room, the job over-subscribes
    the lowest server of another affinity rather than queue: otherwise, once 1-GPU jobs hold
    every server, a 2-GPU job waits for a server to empty completely (hours on Philly).
    The job at the head of the queue (``head``) may take a server up to its cap even when its
    own demand then passes it: otherwise jobs narrower than it, queued behind it, take every
    GPU of room as it appears, and it never fits.
    """
    n = job.num_gpus
    # servers that can start it at once: those with n free GPUs or more (few, on a busy cluster)
    best: dict[str, tuple[float, int]] = {}
    for free in range(n, cluster.max_free_bucket + 1):
        for s in cluster.nodes_with_free(free):
            aff = book.affinity(s)
            group = ("empty" if aff is None and free == cluster.nodes[s].size
                     else "same" if aff == n else "other")
            key = (book.height(s), s)
            if group not in best or key < best[group]:
                best[group] = key
    for group in ("same", "empty", "other"):
        if group in best:
            return best[group][1], True
    if not oversubscribe:
        return None
    extra = 1 if head else n

    # (every up server has fewer than n free GPUs here: one with more was in ``best``)
    def fits(s: int) -> bool:
        node = cluster.nodes[s]
        return node.up and node.size >= n and (book.demand[s] + extra) / node.size <= max_height

    crowded = book.lowest(book.by_affinity.get(n, ()), fits, max_height)
    if crowded is not None:
        return crowded[1], False
    lowest = (book.lowest(servers, fits, max_height)
              for aff, servers in book.by_affinity.items() if aff != n)
    mixed = [key for key in lowest if key is not None]
    return (min(mixed)[1], False) if mixed else None


def gpus_on(cluster: Cluster, server: int, count: int) -> tuple[int, ...]:
    return tuple(pick_in_server(cluster, server, count))


def gang_servers(
    job: Job, cluster: Cluster, book: Book, max_height: float, head: bool = False,
    may: Allowed = None,
) -> tuple[int, ...] | None:
    """Whole servers to over-subscribe for a gang wider than a server: the fewest that hold
    it, least loaded first, each kept under ``max_height`` counting the gang as one more
    server's worth of demand (the head of the queue may pass the cap, as in
    ``choose_server``). None if too few servers have room."""
    size = max(node.size for node in cluster.nodes)
    need = -(-job.num_gpus // size)
    extra = 1 if head else size
    room: list[int] = []  # in height order, up to the last server as high as the need-th
    for height, s in book.by_height:
        if height >= max_height or (len(room) >= need and height > book.height(room[-1])):
            break
        node = cluster.nodes[s]
        if (node.up and node.size == size and (book.demand[s] + extra) / size <= max_height
                and (may is None or may(s))):
            room.append(s)
    if len(room) < need:
        return None
    return tuple(sorted(sorted(room, key=lambda s: (book.height(s), cluster.nodes[s].rack, s))
                        [:need]))


def gang_gpus(job: Job, cluster: Cluster) -> tuple[int, ...] | None:
    """GPUs for a job bigger than one server: whole free servers first (see ``best_fit``)."""
    return best_fit(cluster, job.num_gpus)


def free_elsewhere(book: Book, cluster: Cluster, server: int, count: int,
                   with_jobs: bool = False, may: Allowed = None) -> int | None:
    """The first server (by id) other than ``server`` with ``count`` free GPUs and no job
    waiting for them; with ``with_jobs``, only one that has jobs (an empty server is left for
    a gang); only one that ``may`` allows (``Shared.may_go``)."""
    roomy = sorted(s for have in range(count, cluster.max_free_bucket + 1)
                   for s in cluster.nodes_with_free(have))
    for s in roomy:
        if (s != server and not book.has_waiting(s, cluster)
                and (book.members[s] or not with_jobs) and (may is None or may(s))):
            return s
    return None


def allowed_on(cluster: Cluster, gpus: tuple[int, ...] | None, may: Allowed
               ) -> tuple[int, ...] | None:
    """``gpus``, if ``may`` allows every server they are on; else None."""
    if gpus is None or may is None or all(map(may, cluster.servers_of(gpus))):
        return gpus
    return None




class Placer:
    """Algorithm 1 (``choose_server``) with the mechanisms' ``filter`` and ``score`` hooks:
    with none, Algorithm 1 alone; with some, the servers no filter refuses, the highest total
    score first, Algorithm 1's order among equals."""

    def __init__(self, settings: PlacementSettings, shared: Shared, scores: list[Score]) -> None:
        self.max_height = settings.max_height
        self.oversubscribe = settings.oversubscribe
        self.s, self.scores = shared, scores

    def choose(self, job: Job, cluster: Cluster, book: Book, head: bool
               ) -> tuple[int, bool] | None:
        """The server for ``job`` and whether it starts there at once (``choose_server``)."""
        if not self.s.filters and not self.scores:
            return choose_server(job, cluster, book, self.max_height, self.oversubscribe, head)
        return self._hooked(job, cluster, book, head)

    def _hooked(self, job: Job, cluster: Cluster, book: Book, head: bool
                ) -> tuple[int, bool] | None:
        """Algorithm 1's groups, by looking at every server: the servers that start the job at
        once before those it over-subscribes; within each, the highest score first, then
        Algorithm 1's order (its affinity, empty, other; the lowest height)."""
        n, extra = job.num_gpus, 1 if head else job.num_gpus
        allows = self.s.allows
        best: tuple | None = None
        for node in cluster.nodes:
            s = node.id
            if not node.up or node.size < n or not allows(job, s, cluster):
                continue
            free, aff = len(cluster.free_gpus(s)), book.affinity(s)
            if free >= n:
                group = 1 if aff is None and free == node.size else 0 if aff == n else 2
            elif self.oversubscribe and (book.demand[s] + extra) / node.size <= self.max_height:
                group = 3 if aff == n else 4
            else:
                continue
            key = (group > 2, -sum(score(job, s, cluster) for score in self.scores),
                   group, book.height(s), s)
            if best is None or key < best:
                best = key
        return None if best is None else (best[-1], not best[0])


def is_spread(cluster: Cluster, num_gpus: int, gpus: tuple[int, ...]) -> bool:
    """Are ``gpus`` on more servers, or sockets, than a job of ``num_gpus`` needs?"""
    first = cluster.nodes[cluster.gpus[gpus[0]].node]
    servers = cluster.servers_of(gpus)
    if len(servers) > ceil(num_gpus / first.size):
        return True
    return cluster.splits_sockets(gpus)


def may_consolidate(cluster: Cluster, count: int) -> bool:
    """Could ``best_fit`` find ``count`` free GPUs that are not spread (``is_spread``)? Not if
    the servers with the most free GPUs, as many as a job of ``count`` may span on the
    smallest servers, hold fewer than ``count``: ``best_fit`` takes the fullest servers first.
    (A look at the fullest buckets, where ``best_fit`` sorts whole buckets to pick GPUs that
    are then found spread: most of the calls for gangs when GPUs free up on a busy cluster.)"""
    servers, found = ceil(count / cluster.smallest), 0
    for have in range(cluster.max_free_bucket, 0, -1):
        for _ in cluster.nodes_with_free(have):
            found += have
            if found >= count:
                return True
            servers -= 1
            if not servers:
                return False
    return False


def lower_height(s: Shared, cluster: Cluster) -> Decision[None]:
    """Move waiting jobs from the highest servers onto free GPUs of servers with no
    queue."""
    book, may_go = s.book, s.may_go
    if not cluster.free_count():
        return  # no free GPU anywhere: nothing can move (and 1,000 servers go unsorted)
    # gang widths that found no consolidated GPUs: this step only takes GPUs, and the
    # fewest servers that hold a width never drop as free GPUs go, so they find none again
    # (a busy stretch of Philly asked 700,000 times for 8-GPU gangs' GPUs)
    no_room: set[int] = set()
    # no server with free GPUs is free of waiting jobs: a job of one server finds none
    # to go to, and the first such job ends the step (most calls, on a busy cluster)
    none_free = not s.filters and all(
        book.has_waiting(t, cluster) for have in range(1, cluster.max_free_bucket + 1)
        for t in cluster.nodes_with_free(have))
    for src in book.crowded():
        if not book.has_waiting(src, cluster):
            continue  # (crowded by packed jobs: most crowded servers, on a busy cluster)
        if none_free and not book.gangs[src]:  # its waiting jobs are of one server
            return
        for job in sorted(book.waiting(src, cluster), key=lambda j: j.seq):
            if len(book.home[job.id]) > 1:
                # a time-sliced gang moves to whole free servers as soon as there are some
                if job.num_gpus in no_room:
                    continue
                if not may_consolidate(cluster, job.num_gpus):
                    no_room.add(job.num_gpus)
                    continue
                gpus = gang_gpus(job, cluster)
                if gpus is None or is_spread(cluster, job.num_gpus, gpus):
                    no_room.add(job.num_gpus)
                    continue
                if allowed_on(cluster, gpus, may_go(job, cluster)) is None:
                    continue
                book.assign(job, tuple(sorted(cluster.servers_of(gpus))))
                yield s.start(job, gpus, cluster.now)
                none_free = False  # the servers it left may have no waiting job now
                continue
            may = may_go(job, cluster)
            dest = free_elsewhere(book, cluster, src, job.num_gpus, may=may)
            if dest is None:
                if may is None:
                    return  # no server has room for it: none has for the rest
                continue
            book.assign(job, (dest,))
            yield s.start(job, gpus_on(cluster, dest, job.num_gpus), cluster.now)
