"""Planned rounds: time-slicing worked out ahead on servers where nothing but the rounds
changes, for a backend that carries rounds out itself (the simulator: ``Cluster.fast_rounds``).

A round on an over-subscribed server is a pure function of the one before as long as no job
arrives, leaves, fails or changes priority there, no packing trial can start, and nothing could
move a job elsewhere; simulating each round's suspends, resumes and profile samples one event
at a time was most of the simulator's time under this policy (issue 13). So after a round on
such a *quiet* group of servers (those linked by gangs) the policy works out the next
``PLAN_ROUNDS`` with the same ``timeslice.choose`` that ``rotate`` uses, as long as each
server keeps its count of free GPUs (which others read), and hands them to the backend as one
``actions.Rounds``. The plan ends at its last round, or earlier, before anything that reads or
changes its servers (``thaw``): an arrival placed there, a priority change, GPUs chosen there,
``_lower_height`` finding its waiting jobs other than round 0 shows them, or (the simulator's
``RoundsEnd``) a job of the plan completing or a server failing. The state then becomes the
round in progress, exactly as if each round had been carried out, and the policy goes on.

What stays event by event: everything under ``balance`` (the default), whose one slice order
across the rotating servers links every group to every other (a job of one may move to
another's room; there rounds that would change nothing are put off instead: ``quiet.py``);
and groups where packing acts (on 8,000 Philly jobs on 120x4, a trial or an untried pair
kept ~90% of the groups' rounds from being planned, measured when a round still parted
packed pairs and packing packed them again, each time as a new trial).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gandiva import actions as A
from gandiva.policies.gandiva import packing, timeslice
from gandiva.policies.gandiva.migration import is_spread
from gandiva.policies.gandiva.placement import gang_gpus
from gandiva.policies.placement import pick
from gandiva.state import Cluster, Job, JobStatus

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva

# rounds per plan: a longer plan costs more to work out when a touch ends it early
PLAN_ROUNDS = 32
BALANCE = "balance (one slice order across servers)"
PLANNED = "planned"  # the plan_stats key of the servers whose rounds were planned
# a group whose next round could not be planned is not tried again for this many rounds (its
# rounds are carried out one by one meanwhile, as without plans: a matter of speed only)
RETRY_ROUNDS = 4


def plan_quiet(p: Gandiva, cluster: Cluster, slicing: set[int]) -> Iterator[A.Action]:
    """After a round: plan the next rounds of the quiet groups among ``slicing`` (servers
    with jobs waiting, whose next round is due), and take their servers out of it."""
    now = cluster.now
    if p.balance:  # every group is linked to every other (``unquiet``): no need to find them
        p.plan_stats[BALANCE] += len(slicing)
        return
    for group in groups(p, slicing):
        if not slicing.issuperset(group):
            continue
        if p.unplannable.get(group, -1.0) > now:
            p.plan_stats["not tried again yet (a plan failed)"] += len(group)
            continue
        why = unquiet(p, cluster, group)
        if why is not None:
            p.plan_stats[why] += len(group)
            continue
        rounds = plan(p, cluster, group)
        if isinstance(rounds, str):
            p.plan_stats[rounds] += len(group)
            if len(p.unplannable) > 4096:  # forget the groups that have long changed
                p.unplannable = {g: t for g, t in p.unplannable.items() if t > now}
            p.unplannable[group] = now + RETRY_ROUNDS * p.quantum - 1e-6
            continue
        p.plan_stats[PLANNED] += len(group)
        p.unplannable.pop(group, None)
        yield rounds
        for s in group:
            p.planned[s] = rounds
            p.timer(rounds.start(len(rounds.gpus)), "slice", s)
        slicing -= set(group)


def groups(p: Gandiva, servers: set[int]) -> list[tuple[int, ...]]:
    """``servers`` split into groups that gangs link (each with all its gangs' servers)."""
    book, seen, out = p.book, set(), []
    for s in sorted(servers):
        if s in seen:
            continue
        group, todo = {s}, [s]
        while todo:
            for jid in book.gangs[todo.pop()]:  # (a 1-server job links nothing)
                for t in book.home[jid]:
                    if t not in group:
                        group.add(t)
                        todo.append(t)
        seen |= group
        out.append(tuple(sorted(group)))
    return out


def unquiet(p: Gandiva, cluster: Cluster, servers: tuple[int, ...]) -> str | None:
    """What could change the next rounds on ``servers`` other than who runs (None: nothing,
    they can be planned)? Checked after a round; ``plan`` checks each planned round too.
    The reasons are counted in ``Gandiva.plan_stats`` (benchmarks/planned_rounds.py)."""
    if p.las_admission:
        return "las_admission (it reads attained service, which rounds change)"
    if p.balance:
        return BALANCE
    book, jobs = p.book, cluster.jobs
    members = [jobs[j] for s in servers for j in book.members[s]]
    if not members or len({j.priority for j in members}) > 1:
        return "priorities differ"
    for s in servers:
        if not cluster.nodes[s].up or not book.has_waiting(s, cluster):
            return "a server down or without waiting jobs"
    for job in members:
        if job.status not in (JobStatus.RUNNING, JobStatus.SUSPENDED) \
                or job.id in cluster.transitions:
            return "a job not yet settled"
        if job.memory_gb is None or job.utilization is None or job.id not in p.solo_mbt:
            return "a job not yet profiled alone"
        if job.id in p.spread or job.id in p.elastic_jobs:
            return "a spread or elastic job"
        if p.trials.involves(job.id) or any(len(cluster.gpus[g].jobs) > 1 for g in job.gpus):
            return "a packing trial, or jobs sharing a GPU"
    return None


def packs(p: Gandiva, cluster: Cluster, jobs: list[Job], slots: list[timeslice.Slot]) -> bool:
    """Would ``packing.try_pack`` pack a job in this round of a plan: a waiting 1-GPU job
    beside a running one on its server that it may share a GPU with? (Every job of a quiet
    group is profiled, in no trial and of one priority, which try_pack's other tests ask.)
    The plan stops before such a round, and packing tries the pair at it as without plans."""
    if not p.pack:
        return False
    waiting: dict[int, list[Job]] = {}
    running: dict[int, list[tuple[Job, int]]] = {}
    for job, sl in zip(jobs, slots, strict=True):
        if sl.width == 1 and len(sl.home) == 1:
            if sl.gpus:
                running.setdefault(sl.home[0], []).append((job, sl.gpus[0]))
            else:
                waiting.setdefault(sl.home[0], []).append(job)
    return any(packing.may_pair(p, guest, host, cluster.gpus[g].memory_gb)
               for s, guests in waiting.items() for guest in guests
               for host, g in running.get(s, ()))


def plan(p: Gandiva, cluster: Cluster, servers: tuple[int, ...]) -> A.Rounds | str:
    """The next rounds on quiet ``servers``, worked out as ``rotate`` would carry them out,
    up to the first that would change a server's count of free GPUs (which others read),
    leave it no job waiting (which a round carried out must handle) or have packing try a
    pair (``packs``), at most ``PLAN_ROUNDS``; if not even one, why not."""
    book, q = p.book, p.quantum
    order = list({j: None for s in servers for j in book.members[s]})
    jobs = [cluster.jobs[j] for j in order]
    slots = timeslice.slots_of(p, cluster, jobs, cluster.now)
    attained = [j.attained for j in jobs]
    since = [j.run_since for j in jobs]
    size = {s: cluster.nodes[s].size for s in servers}
    free = {s: list(cluster.free_gpus(s)) for s in servers}
    idle = {s: len(free[s]) for s in servers}
    node_of = {g: cluster.gpus[g].node for s in servers for g in cluster.nodes[s].gpus}

    def socket_of(g: int) -> int:
        return cluster.gpus[g].socket

    first = round(cluster.now / q)
    if first * q != cluster.now:  # rounds fall on multiples of the quantum
        return "a round off the quantum's multiples"
    index = {sl.id: i for i, sl in enumerate(slots)}
    rounds = [tuple(sl.gpus for sl in slots)]
    las = p.slice_order in timeslice.BY_SERVICE
    for r in range(1, PLAN_ROUNDS):
        now = (first + r) * q
        if las:
            for i, sl in enumerate(slots):
                if sl.gpus:
                    sl.attained = attained[i] + (now - since[i]) * len(sl.gpus)
        keep, chosen = timeslice.choose(p, slots, size, now, tick=True)
        run = keep | {sl.id for sl in chosen}
        for i, sl in enumerate(slots):
            if sl.gpus and sl.id not in run:
                attained[i] = attained[i] + (now - since[i]) * len(sl.gpus)
                since[i] = None
                if las:
                    sl.attained = attained[i]
                for g in sl.gpus:
                    bisect.insort(free[node_of[g]], g)
                sl.gpus = ()
        for sl in sorted(chosen, key=lambda sl: -sl.width):
            if sl.gpus:
                continue
            gpus: list[int] = []
            shares = p.gang_shares and len(sl.home) > 1
            for i, t in enumerate(sl.home):
                got = pick(free[t], socket_of, sl.share[i] if shares else
                           min(sl.width - len(gpus), len(free[t])))
                for g in got:
                    free[t].remove(g)
                gpus.extend(got)
            sl.gpus = tuple(gpus)
            sl.started = now - timeslice.switch_delay(sl.memory_gb)
            since[index[sl.id]] = now
        waiting = {t for sl in slots if not sl.gpus for t in sl.home}
        if any(len(free[s]) != idle[s] for s in servers) or waiting != set(servers):
            stop = "quiet, but its next round changes free GPUs or waiting"
            break
        if packs(p, cluster, jobs, slots):
            stop = "quiet, but packing tries a pair at its next round"
            break
        rounds.append(tuple(sl.gpus for sl in slots))
    if len(rounds) < 2:
        return stop
    return A.Rounds(servers, first, q, tuple(order), tuple(rounds))


def ended(p: Gandiva, cluster: Cluster, rounds: A.Rounds, r: int, *, due: bool = False
          ) -> None:
    """The policy's side of a plan's end (the state is already its round ``r``): each job's
    last turn, and the servers' next round (``due``: it is being decided now)."""
    for s in rounds.servers:
        p.planned.pop(s, None)
    jobs = cluster.jobs
    for i, jid in enumerate(rounds.jobs):
        for k in range(1, r + 1):
            gpus = rounds.gpus[k][i]
            if gpus and gpus != rounds.gpus[k - 1][i]:
                p.book.last_start[jid] = rounds.start(k) - timeslice.switch_delay(
                    jobs[jid].memory_gb)
    for s in rounds.servers:
        p.cancel("slice", s)
        if not due:
            p.timer(rounds.start(r + 1), "slice", s)


def thaw_gpus(p: Gandiva, cluster: Cluster, gpus: tuple[int, ...]):  # -> Generator[.., bool]
    """End the plans of the servers of ``gpus`` (free GPUs chosen in a planned round 0: a
    plan keeps a server's count of free GPUs, not which ones); True if any ended, so that
    the GPUs are chosen again."""
    servers = sorted({cluster.gpus[g].node for g in gpus} & p.planned.keys())
    yield from thaw(p, cluster, servers)
    return bool(servers)


def thaw(p: Gandiva, cluster: Cluster, servers, *, due: bool = False) -> Iterator[A.Action]:
    """End the plans on any of ``servers`` before the policy reads or changes them."""
    for s in servers:
        rounds = p.planned.get(s)
        if rounds is not None:
            # during a tick, the round it begins has begun (it would have been carried out)
            r = rounds.round_at(cluster.now, tick=p.ticking and not due)
            yield A.Thaw(rounds.servers, r)
            ended(p, cluster, rounds, r, due=due)


def unseen(p: Gandiva, cluster: Cluster, server: int) -> bool:
    """Would ``_lower_height`` find a planned ``server``'s waiting jobs other than the state
    shows them (round 0)? Only if one of the plan's jobs could move to free GPUs, or a job
    narrower than a server waits there now and did not in round 0 or the reverse (it stops
    at such a job that cannot move); gangs that cannot move it passes by."""
    rounds = p.planned[server]
    r = rounds.round_at(cluster.now, tick=p.ticking)
    home = p.book.home
    waits = [any(not gpus[i] and home[jid] == (server,) for i, jid in enumerate(rounds.jobs))
             for gpus in (rounds.gpus[0], rounds.gpus[r])]
    return waits[0] != waits[1] or movable(p, cluster, rounds, room_elsewhere(p, cluster))


def movable(p: Gandiva, cluster: Cluster, rounds: A.Rounds, room: int) -> bool:
    """Could a waiting job of the plan move to free GPUs now (``room``: the most free GPUs
    of a server where no job waits)?"""
    for jid in rounds.jobs:
        job = cluster.jobs[jid]
        if len(p.book.home[jid]) > 1:
            gpus = gang_gpus(job, cluster)
            if gpus is not None and not is_spread(cluster, job.num_gpus, gpus):
                return True
        elif job.num_gpus <= room:
            return True
    return False


def room_elsewhere(p: Gandiva, cluster: Cluster) -> int:
    """The most free GPUs on an up server where no job waits (where a waiting job could
    move)."""
    for have in range(cluster.max_free_bucket, 0, -1):
        for s in cluster.nodes_with_free(have):
            if not p.book.has_waiting(s, cluster):
                return have
    return 0


def keep_lowering(p: Gandiva, cluster: Cluster) -> None:
    """Keep a tick at each round boundary while a whole server is free: a round carried out
    there would let ``_lower_height`` move waiting jobs to it (it reads a planned group, and
    ends its plan if a job of it could move, when it gets to it)."""
    if any(True for _ in cluster.nodes_with_free(cluster.max_free_bucket)):
        p.timer(timeslice.next_round(p, cluster.now), "lower")
