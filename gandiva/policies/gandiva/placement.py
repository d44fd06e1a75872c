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
        if node.up and node.size == size and (book.demand[s] + extra) / size <= max_height:
            room.append(s)
    if len(room) < need:
        return None
    return tuple(sorted(sorted(room, key=lambda s: (book.height(s), cluster.nodes[s].rack, s))
                        [:need]))


def gang_gpus(job: Job, cluster: Cluster) -> tuple[int, ...] | None:
    """GPUs for a job bigger than one server: whole free servers first (see ``best_fit``)."""
    return best_fit(cluster, job.num_gpus)


def free_elsewhere(book: Book, cluster: Cluster, server: int, count: int,
                   with_jobs: bool = False) -> int | None:
    """The first server (by id) other than ``server`` with ``count`` free GPUs and no job
    waiting for them; with ``with_jobs``, only one that has jobs (an empty server is left for
    a gang)."""
    roomy = sorted(s for have in range(count, cluster.max_free_bucket + 1)
                   for s in cluster.nodes_with_free(have))
    for s in roomy:
        if (s != server and not book.has_waiting(s, cluster)
                and (book.members[s] or not with_jobs)):
            return s
    return None
