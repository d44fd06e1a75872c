"""Beyond the paper: least-attained-service admission when the cluster is full.

Gandiva over-subscribes servers up to ``max_height``; past that, the paper queues newcomers,
and under heavy load they wait hours for their first mini-batch while long jobs keep their
places in the time-slicing rotation. Here a newcomer instead takes the place of the job with the
most attained service (GPU-seconds) among the jobs of its width on any server: that job is
suspended and goes back to the waiting queue, ordered by attained service, as in Tiresias. A
gang larger than a server, at the head of the queue and with no place under ``max_height``,
likewise sends back, on the servers it needs, just enough of the jobs that had more service
than it to fit under ``max_height`` (``make_room``).

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
    """Free one place of ``job``'s width on any server; False if none may go.

    A job with no higher priority and no less service than one of its width that found none
    (``Gandiva.no_victim``, since the scan of the queue last placed a job) finds none either,
    and does not look: each look walks every server's jobs, and on the overloaded Philly
    replay (fidelity.py) the looks of the scans, at every event, made most of its 490 s."""
    n = job.num_gpus
    attained = job.attained_at(cluster.now)
    failed = p.no_victim.get(n)
    if failed is not None and failed[0] >= job.priority and failed[1] <= attained:
        return False
    victim = most_served(p, cluster, job, attained + p.displace_margin)
    if victim is None:
        p.no_victim[n] = (job.priority, attained)
        return False
    yield from _send_back(p, cluster, victim)
    return True


def most_served(p: Gandiva, cluster: Cluster, job: Job, floor: float) -> Job | None:
    """The 1-server job of ``job``'s width, and no higher priority, with the most service
    above ``floor``, on any server; None if there is none."""
    now, n = cluster.now, job.num_gpus
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
    return None if best is None else best[1]


def make_room(p: Gandiva, cluster: Cluster, job: Job) -> Iterator[A.Action]:
    """Places for a gang wider than a server, at the head of the queue, when no server has
    one under ``max_height``: on the servers it needs, send back just enough of the jobs that
    had more service than it (plus the margin), and no higher priority, to bring each under
    ``max_height`` with the gang on it; most served first, on the servers that lose fewest.
    A gang sent back leaves all its servers."""
    now = cluster.now
    floor = job.attained_at(now) + p.displace_margin
    size = cluster.max_free_bucket
    need = ceil(job.num_gpus / size)
    options = []
    for node in cluster.nodes:
        if not node.up or node.size != size:
            continue
        # what must go: the head of the queue may pass the cap by one GPU (``gang_servers``)
        excess = p.book.demand[node.id] + 1 - p.max_height * size
        victims: list[Job] = []
        if excess > 0:
            members = [cluster.jobs[j] for j in p.book.members[node.id]]
            served = {m.id: m.attained_at(now) for m in members}
            for m in sorted(members, key=lambda m: -served[m.id]):
                if excess <= 0 or served[m.id] <= floor:
                    break
                if m.priority <= job.priority:
                    victims.append(m)
                    excess -= m.num_gpus if len(p.book.home[m.id]) == 1 else size
            if excess > 0:
                continue
        options.append((len(victims), p.book.height(node.id), node.id, victims))
    if len(options) < need:
        return
    gone: dict[str, Job] = {}
    for *_, victims in sorted(options, key=lambda o: o[:3])[:need]:
        gone.update((v.id, v) for v in victims)
    for victim in gone.values():
        yield from _send_back(p, cluster, victim)
