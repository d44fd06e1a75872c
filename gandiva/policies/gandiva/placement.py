"""Algorithm 1 of the paper: affinity placement with over-subscription.

For a job that fits in one server, in order: a server of the same affinity with free GPUs,
least loaded first; an empty server; any server with free GPUs; over-subscribe a server of the
same affinity; (ours) over-subscribe any server; else the job queues. "Load" is the server's
height (GPUs demanded by its jobs over its GPUs). A job larger than a server gets whole free
servers, racks kept together.
"""

from __future__ import annotations

from gandiva.policies.gandiva.book import Book
from gandiva.policies.placement import best_fit, pick_in_server
from gandiva.state import Cluster, Job


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
    same, empty, other, crowded, mixed = [], [], [], [], []
    for node in cluster.nodes:
        s = node.id
        if not node.up or node.size < n:
            continue
        free = len(cluster.free_gpus(s))
        aff = book.affinity(s, cluster)
        if aff is None and free == node.size:
            empty.append(s)
        elif free >= n:
            (same if aff == n else other).append(s)
        elif (book.demand[s] + (1 if head else n)) / node.size <= max_height:
            (crowded if aff == n else mixed).append(s)
    for group, starts in ((same, True), (empty, True), (other, True)):
        if group:
            return min(group, key=lambda s: (book.height(s), s)), starts
    for group in (crowded, mixed):
        if oversubscribe and group:
            return min(group, key=lambda s: (book.height(s), s)), False
    return None


def gpus_on(cluster: Cluster, server: int, count: int) -> tuple[int, ...]:
    return tuple(pick_in_server(cluster, server, count))


def gang_servers(
    job: Job, cluster: Cluster, book: Book, max_height: float, head: bool = False,
) -> tuple[int, ...] | None:
    """Whole servers to over-subscribe for a gang wider than a server: the fewest that hold
    it, least loaded first, each kept under ``max_height`` counting the gang as one more
    server's worth of demand (the head of the queue may pass the cap, as in
    ``choose_server``). None if too few servers have room."""
    size = max(node.size for node in cluster.nodes)
    need = -(-job.num_gpus // size)
    extra = 1 if head else size
    room = [n.id for n in cluster.nodes if n.up and n.size == size
            and (book.demand[n.id] + extra) / size <= max_height]
    if len(room) < need:
        return None
    return tuple(sorted(sorted(room, key=lambda s: (book.height(s), cluster.nodes[s].rack, s))
                        [:need]))


def gang_gpus(job: Job, cluster: Cluster) -> tuple[int, ...] | None:
    """GPUs for a job bigger than one server: whole free servers first (see ``best_fit``)."""
    return best_fit(cluster, job.num_gpus)
