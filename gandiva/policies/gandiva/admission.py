"""Beyond the paper: least-attained-service admission when the cluster is full.

Gandiva over-subscribes servers up to ``max_height``; past that, the paper queues newcomers,
and under heavy load they wait hours for their first mini-batch while long jobs keep their
places in the time-slicing rotation. Here a newcomer instead takes the place of the job with the
most attained service (GPU-seconds) among the jobs of its width on any server: that job is
suspended and goes back to the waiting queue, ordered by attained service, as in Tiresias. A
gang larger than a server, at the head of the queue and with no place under ``max_height``,
may likewise clear whole servers of jobs that have had more service than it has.

Decisions (2026-12-04): a victim may sit on a server of another affinity. Affinity placement
puts narrow jobs on servers of wider jobs once their own are full, so on the busiest traces no
server had a newcomer's affinity and displacement never found a victim (gavel-philly-6c71a0,
long queue: 731,806 tries, none). And a gang clears servers only when it has no place to
over-subscribe: clearing whenever whole servers were not free changed short-queue cells,
where places abound (gavel-philly-e13805 0.99 -> 1.01 of LAS's mean JCT).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from math import ceil
from typing import TYPE_CHECKING

from gandiva import actions as A
from gandiva.state import Cluster, Job, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva


def _send_back(p: Gandiva, cluster: Cluster, victim: Job) -> Iterator[A.Action]:
    if victim.status is JobStatus.RUNNING:
        yield A.Suspend(victim.id)
    p.book.release(victim)
    p.spread.pop(victim.id, None)
    p.unassigned.add(victim, victim.attained_at(cluster.now))


def displace(p: Gandiva, cluster: Cluster, job: Job) -> Generator[A.Action, None, bool]:
    """Free one place of ``job``'s width on any server; False if none may go."""
    now, n = cluster.now, job.num_gpus
    floor = job.attained_at(now) + p.displace_margin
    best: tuple[float, Job] | None = None
    for node in cluster.nodes:
        if not node.up or node.size < n:
            continue
        for jid in p.book.members[node.id]:
            other = cluster.jobs[jid]
            if other.num_gpus != n or len(p.book.home[jid]) > 1 or other.priority > job.priority:
                continue
            served = other.attained_at(now)
            if served > floor and (best is None or served > best[0]):
                best = (served, other)
    if best is None:
        return False
    yield from _send_back(p, cluster, best[1])
    return True


def clear_servers(p: Gandiva, cluster: Cluster, job: Job) -> Iterator[A.Action]:
    """Empty the fewest-loaded whole servers a big gang needs, if all their jobs had more
    service than the gang (plus the margin) and no higher priority."""
    now = cluster.now
    floor = job.attained_at(now) + p.displace_margin
    size = cluster.max_free_bucket
    need = ceil(job.num_gpus / size)
    movable = []
    for node in cluster.nodes:
        if not node.up or node.size < size:
            continue
        members = [cluster.jobs[j] for j in p.book.members[node.id]]
        if all(m.attained_at(now) > floor and m.priority <= job.priority
               and len(p.book.home[m.id]) == 1 for m in members):
            movable.append((p.book.height(node.id), node.id, members))
    if len(movable) < need:
        return
    for _, _, members in sorted(movable, key=lambda m: (m[0], m[1]))[:need]:
        for victim in members:
            yield from _send_back(p, cluster, victim)
