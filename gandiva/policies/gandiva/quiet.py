"""Quiet rounds under ``balance`` (the default): rounds that would change nothing are not run.

Under ``balance`` every server rotating at a round (with ``balance_all``, every server with
jobs) shares one slice order, so no group of servers can be planned apart from the rest
(``rounds.py``). But a round that changed nothing
(no suspend, resume, move or pack) is followed by the same round, as long as nothing changes:
the slice order by ``levels`` reads a job's priority, whether it has run, its attained-service
level and arrival, and of these only the level of a running job moves with time. So after
such a round the servers' next round is put off to the round before the first running job
reaches its next level, and brought back to the next round as soon as anything could change a
round's outcome: any event but a profile sample with no news for packing, or any action
(``Gandiva.version`` counts them). The rounds skipped are those that would have found the same
jobs running and done nothing: the results are those of rounds run one by one. (Issue 13: on
the first 8,000 Philly jobs on 120x4, 37% of the rounds are put off; on the whole list, where
something happens every 7 s on average, few are.)

Only in the simulator (``Cluster.fast_rounds``, as planned rounds), and only where a round's
outcome reads nothing else that moves with time: ``levels`` order, no queued job (it would
switch the order to round-robin with ``queue_roundrobin``, and ``las_admission`` displaces
for it by attained service, which moves with time), no elastic job, and no job in its first
half quantum (it keeps its turn in this round and competes in the next).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gandiva import events as E
from gandiva.policies import las
from gandiva.policies.gandiva import packing, timeslice
from gandiva.state import Cluster, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva


PUT_OFF = "put off: nothing can change before a level does (quiet.py)"  # a plan_stats key


@dataclass(slots=True)
class Quiet:
    version: int  # the policy's version after the round that changed nothing
    servers: set[int]  # their next round put off to ``until``
    until: float


def news(p: Gandiva, cluster: Cluster, sample: E.ProfileSample) -> bool:
    """May this sample change what a round does? It may if it can change packing: a first
    profile alone, a new memory or utilisation, or a sample of a packed job or a trial's."""
    job = cluster.jobs[sample.job_id]
    seen = (job.memory_gb, job.utilization)
    before = p.profiled.get(job.id)
    p.profiled[job.id] = seen
    if job.status is not JobStatus.RUNNING:
        return False  # packing.observe ignores it
    return (before != seen or job.id not in p.solo_mbt or p.trials.involves(job.id)
            or packing.shares_gpu(cluster, job))


def declare(p: Gandiva, cluster: Cluster) -> None:
    """After a round that changed nothing: put the servers' next round off, if it can be."""
    now, q = cluster.now, p.quantum
    if (not cluster.fast_rounds or p.slice_order != "levels" or not p.balance
            or len(p.unassigned) or p.elastic_jobs or p.planned):
        return
    nxt = timeslice.next_round(p, now)
    servers = set(p.armed_at.get((nxt, "slice"), ()))
    if not servers or not servers <= p._rounded:
        return  # a server joins the next round (an arrival's): it may change what runs
    if p.balance_all:  # every server with jobs takes the round: every job with a home
        jobs = timeslice.homed(p, cluster)
    else:
        _, jobs = timeslice.group(p, cluster, timeslice.round_of(p, cluster, servers))
    until = math.inf
    for job in jobs:
        if job.status is not JobStatus.RUNNING:
            continue
        if now - p.book.last_start.get(job.id, -math.inf) < q / 2:
            return  # it kept its turn in this round; in the next it competes
        attained = job.attained_at(now)
        level = las.level(attained, p.levels)
        if level < len(p.levels):  # when ``las.level`` will say the next one
            limit = p.levels[level] - las.LEVEL_TOLERANCE
            until = min(until, now + (limit - attained) / len(job.gpus))
    # the last round before the level changes runs (it changes nothing) and puts off again
    wake = max(nxt, math.floor(until / q) * q) if until < math.inf else math.inf
    if wake <= nxt:
        return
    for s in servers:
        p.cancel("slice", s)
        if wake < math.inf:
            p.timer(wake, "slice", s)
    p.quiet = Quiet(p.version, servers, wake)
    p.plan_stats[PUT_OFF] += len(servers)


def rouse(p: Gandiva, cluster: Cluster) -> None:
    """Something changed: the put-off servers take their next round (at this instant if it
    falls on a round: the simulator runs ticks after the other events of an instant)."""
    assert p.quiet is not None
    now = cluster.now
    this = math.floor(now / p.quantum + 1e-9) * p.quantum
    at = now if abs(this - now) < 1e-9 else timeslice.next_round(p, now)
    for s in p.quiet.servers:
        if p._armed.get(("slice", s)) == p.quiet.until:
            p.cancel("slice", s)
        p.timer(at, "slice", s)
    p.quiet = None
