"""Time-slicing on an over-subscribed server: a round of suspends and resumes every quantum.

Each round gives the server's GPUs to its jobs in order: higher priority first (a job is never
suspended for a lower-priority one), then by the slice order. By default (``levels``) a job
that has never run goes first, which is what gives every job early feedback, then jobs by
Tiresias' attained-service levels, and beyond the last of those a level every ``level_step``
times more service (``slice_levels``); within a level the running jobs keep their turns
(``keep_turn_in_level``), and the waiting ones come first come first served; the paper's
``roundrobin`` gives the GPU to the job that had it least recently, and ``las`` to the least
attained service. Packed jobs take their turns like the others, but one whose GPU-mate runs
on stays packed (``stays_packed``), and the packing step packs after the round. A multi-GPU
job is suspended and resumed as a whole. With ``balance`` (the default) the servers rotating
at a round share one slice order (``rebalance``), as LAS has one across the cluster; with
``balance_all`` (the default too) every server with jobs joins the round (``round_of``), so
that a job alone on its server yields it to waiting jobs of lower levels.

Gangs wider than a server time-slice too (beyond the paper, which does not say how they share):
such a gang belongs to whole servers and takes its turn on all of them at once. Rounds fall on
multiples of the quantum on every server, so servers that share gangs decide together, in one
slice order: a gang runs when the jobs before it left room enough for it on its servers
(``gang_share``), and narrower jobs fill what is left. (Per-server rounds out of step left
43% of the GPUs idle while jobs waited, on the Chronus trace: a gang rarely came first on all
its servers at once.) Without this a wide gang waits for whole servers to empty (80 h for the
8- and 16-GPU jobs in a busy stretch of Philly), and narrow jobs placed on a running gang's
servers wait for it to finish. With ``spare_gangs`` a waiting job takes its turn off the
servers of a running gang where it can, and with ``idle_to_gangs`` a waiting gang with no room
at home takes the GPUs the round leaves idle on as many other servers (``rebalance``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

from gandiva import actions as A
from gandiva.policies.gandiva.placement import gpus_on
from gandiva.policies.las import QUEUE_LIMITS, level
from gandiva.state import Cluster, Job, JobStatus

ORDERS = ("roundrobin", "las", "levels")
# the orders that read attained service. "levels": Tiresias' discretised LAS inside a round,
# at the las policy's levels (``las.level``: 1 and 10 GPU-hours) and more beyond them
# (``slice_levels``, ``Gandiva.level_step``). A job never run still comes
# first (its first turn is its early feedback), but jobs of one level take turns first come
# first served instead of round by round: sharing the GPUs a quantum at a time makes equal
# long jobs all end late (seven 8-GPU gangs on 8 GPUs, gavel-philly-23dbec: 2.8 h mean JCT
# under round-robin against LAS's 2.1 h)
BY_SERVICE = ("las", "levels")
# levels of the "levels" order are cut until one is at or past this much service, which no
# job reaches, so that none holds its turn to its end in a last level (GPU-seconds: a million
# GPU-hours); and they are at most this many beyond the las policy's, so ``Gandiva.level_step``
# is 1 (none) or at least ``LEAST_STEP`` (10 ** (5 / 64), about 1.2)
LEVELS_UP_TO = 3.6e9
MORE_LEVELS = 64
LEAST_STEP = (LEVELS_UP_TO / QUEUE_LIMITS[-1]) ** (1 / MORE_LEVELS)

if TYPE_CHECKING:
    from gandiva.policies.gandiva import Gandiva


def slice_levels(step: float) -> tuple[float, ...]:
    """The limits of the "levels" order, in GPU-seconds: the las policy's (1 and 10
    GPU-hours), then, with a ``step`` above 1, one limit every ``step`` times the one before,
    until one is at or past ``LEVELS_UP_TO``."""
    limits = list(QUEUE_LIMITS)
    while step > 1 and limits[-1] < LEVELS_UP_TO:
        limits.append(limits[-1] * step)
    return tuple(limits)

# The paper: suspend+resume takes <100 ms for image models, ~1 s for large ones. Estimated
# from the job's profiled memory, the delay is charged back: the job's turn counts as having
# begun that much earlier, so the time lost to switching does not cost it its share.
SWITCH_FIXED_S, SWITCH_PER_GB_S = 0.05, 0.06


def switch_delay(memory_gb: float | None) -> float:
    return SWITCH_FIXED_S + SWITCH_PER_GB_S * (memory_gb or 0.0)


def free_elsewhere(p: Gandiva, cluster: Cluster, server: int, count: int,
                   with_jobs: bool = False) -> int | None:
    """The first server (by id) other than ``server`` with ``count`` free GPUs and no job
    waiting for them; with ``with_jobs``, only one that has jobs (an empty server is left for
    a gang: ``packing.spread_elsewhere``)."""
    roomy = sorted(s for have in range(count, cluster.max_free_bucket + 1)
                   for s in cluster.nodes_with_free(have))
    for s in roomy:
        if (s != server and not p.book.has_waiting(s, cluster)
                and (p.book.members[s] or not with_jobs)):
            return s
    return None


def is_gang(p: Gandiva, job: Job) -> bool:
    return len(p.book.home[job.id]) > 1


def next_round(p: Gandiva, now: float) -> float:
    """Rounds fall on multiples of the quantum on every server, so that servers shared by a
    gang switch together."""
    return (math.floor(now / p.quantum + 1e-9) + 1) * p.quantum


@dataclass(slots=True)
class Slot:
    """What a round needs to know of a job: read from the state (``rotate``), or carried from
    round to round by a plan (``rounds.py``)."""

    id: str
    priority: int
    seq: int
    width: int  # GPUs it asks for
    home: tuple[int, ...]
    gpus: tuple[int, ...]  # those it holds now (none while it waits)
    started: float | None  # when its last turn began (``Book.last_start``)
    attained: float  # GPU-seconds of service up to the round
    memory_gb: float | None = None
    # a gang's GPUs on each server of its home: those it holds, or takes in the round chosen
    share: tuple[int, ...] = ()


def slots_of(p: Gandiva, cluster: Cluster, jobs: Iterable[Job], now: float) -> list[Slot]:
    """The jobs' slots at ``now``: what a round (``rotate``, ``rebalance``) or a plan
    (``rounds.py``) decides over."""
    home, last_start = p.book.home, p.book.last_start
    service = p.slice_order in BY_SERVICE
    slots = [Slot(j.id, j.priority, j.seq, j.num_gpus, home[j.id], j.gpus, last_start.get(j.id),
                  j.attained_at(now) if service else 0.0, j.memory_gb) for j in jobs]
    for sl in slots:
        if sl.gpus and len(sl.home) > 1:
            sl.share = held(cluster, sl.home, sl.gpus)
    return slots


def held(cluster: Cluster, home: tuple[int, ...], gpus: tuple[int, ...]) -> tuple[int, ...]:
    """How many of ``gpus`` are on each server of ``home``."""
    on = [cluster.gpus[g].node for g in gpus]
    return tuple(on.count(t) for t in home)


def gang_share(p: Gandiva, sl: Slot, room: dict[int, int], size: dict[int, int]
               ) -> tuple[int, ...] | None:
    """The GPUs a gang takes on each server of its home in a round, given the ``room`` left
    there (every server of its home is in it); None if it does not fit.

    With ``gang_shares`` it takes what it needs, server by server in home order (a running
    gang: what it holds), and narrower jobs may have the rest; without, it takes its servers
    whole, and only servers no job before it took room on."""
    if sl.gpus and p.gang_shares:
        return sl.share if all(room[t] >= k for t, k in zip(sl.home, sl.share, strict=True)) \
            else None
    return share_on(p, sl.home, sl.width, room, size)


def share_on(p: Gandiva, home: tuple[int, ...], width: int, room: dict[int, int],
             size: dict[int, int]) -> tuple[int, ...] | None:
    """The GPUs a waiting gang of ``width`` takes on each server of ``home`` given the
    ``room`` left there (``gang_share``); None if it does not fit."""
    if not p.gang_shares:
        if any(room[t] < size[t] for t in home):
            return None
        return tuple(size[t] for t in home)
    left, share = width, []
    for t in home:
        k = min(left, room[t])
        share.append(k)
        left -= k
    return tuple(share) if left == 0 else None


def choose(p: Gandiva, slots: list[Slot], size: dict[int, int], now: float, tick: bool,
           ordered: bool = False) -> tuple[set[str], list[Slot]]:
    """Who runs in the round at ``now`` on servers of ``size`` (gangs' servers all among
    them): the running gangs that keep their GPUs, and the jobs chosen, in slice order
    (``slots`` are in it already if ``ordered``).

    In slice order, each job takes GPUs while its server has room; a gang takes the GPUs it
    needs on the servers of its home (``gang_share``). On a ``tick`` (a round boundary)
    running jobs compete like the others, except those whose turn began less than half a
    quantum ago (they took freed GPUs between rounds), and in round-robin order they go behind
    every waiting job of their priority; otherwise (a departure freed GPUs, a priority
    changed) running jobs go before waiting ones of the same priority, so no turn is cut short
    but for a job of higher priority.
    """
    room, inside = dict(size), set(size)
    open_ = len(room)  # servers with room left: none, and no later job fits
    shares = p.gang_shares

    def take(s: Slot) -> None:
        nonlocal open_
        if len(s.home) > 1:  # its share, or (without gang_shares) its servers whole
            for t, k in zip(s.home, s.share, strict=True):
                if t in room:
                    had = room[t]
                    room[t] = had - k if shares else 0
                    open_ -= had > 0 >= room[t]
        else:
            t = s.home[0]
            had = room[t]
            room[t] = had - (len(s.gpus) or s.width)
            open_ -= had > 0 >= room[t]

    # (a gang not ``inside`` has a server outside this round)
    keep = {s.id for s in slots if s.gpus and len(s.home) > 1 and not inside.issuperset(s.home)}
    rest = slots
    if keep:
        for s in slots:
            if s.id in keep:
                take(s)
        rest = [s for s in slots if s.id not in keep]
    if not ordered:
        rest = sorted(rest, key=slice_key(p, now, tick))
    chosen: list[Slot] = []
    for s in rest:
        if not open_:
            break
        if len(s.home) > 1:  # (a running gang here has all its servers inside)
            if s.gpus or inside.issuperset(s.home):
                share = gang_share(p, s, room, size)
                if share is not None:
                    if not s.gpus:  # (a running gang's share is what it holds)
                        s.share = share
                    chosen.append(s)
                    take(s)
            continue
        t = s.home[0]
        had = room[t]
        if s.width <= had:  # ``take(s)``, written out: most jobs of a round come here
            chosen.append(s)
            room[t] = had - (len(s.gpus) or s.width)
            open_ -= had > 0 >= room[t]
    return keep, chosen


def slice_key(p: Gandiva, now: float, tick: bool) -> Callable[[Slot], tuple]:
    """A job's place in the slice order of a round at ``now`` (``choose``), as a sort key."""
    order = p.slice_order
    if p.queue_roundrobin and len(p.unassigned):
        order = "roundrobin"  # jobs wait for a place on a server: keep the places moving
    half = p.quantum / 2
    hold = 0 if p.keep_turn_in_level and order == "levels" else 1
    limits = p.levels

    def key(s: Slot) -> tuple:
        started = s.started
        if order == "levels":  # a job never run comes first, then by level
            turn: float = level(s.attained, limits) if started is not None else -1
        elif order == "las":
            turn = s.attained
        else:
            turn = started if started is not None else float("-inf")
        if not s.gpus:
            return (-s.priority, 1, turn, 1, s.seq)
        if not tick or started is None or now - started < half:
            return (-s.priority, 0, turn, s.seq)  # keeps its turn
        if order != "roundrobin":  # competes on attained service like the others, before
            # those waiting in its level if held
            return (-s.priority, 1, turn, hold, s.seq)
        # round-robin: a job whose turn is over goes behind those waiting, and the one that
        # has run longest gives way first (ordering it by when its turn began, like a waiting
        # job, kept a job that never stopped first in line for ever)
        return (-s.priority, 2, -turn, s.seq)

    return key


def round_of(p: Gandiva, cluster: Cluster, due: set[int]) -> set[int]:
    """The servers of a round at which ``due`` rotate (``group`` adds their gangs' servers):
    with ``balance_all``, every server up with jobs on it too."""
    if not (p.balance and p.balance_all):
        return due
    return due | {s for s, node in enumerate(cluster.nodes) if node.up and p.book.members[s]}


def group(p: Gandiva, cluster: Cluster, servers: set[int]) -> tuple[set[int], list[Job]]:
    """``servers`` with the other servers of their gangs, and the jobs of them all (each once,
    by server then assignment order): what a round on ``servers`` decides over."""
    home, gangs = p.book.home, p.book.gangs
    S = set(servers)
    S.update(chain.from_iterable({home[jid] for s in servers for jid in gangs[s]}))
    return S, members(p, cluster, S)


def members(p: Gandiva, cluster: Cluster, servers: set[int]) -> list[Job]:
    """The jobs of ``servers``, each once, by server then assignment order."""
    on = p.book.members
    return list(map(cluster.jobs.__getitem__,
                    dict.fromkeys(chain.from_iterable(on[s] for s in sorted(servers)))))


def homed(p: Gandiva, cluster: Cluster) -> list[Job]:
    """Every job with a home, in the order it got it."""
    return list(map(cluster.jobs.__getitem__, p.book.home))


def by_server(p: Gandiva, jobs: list[Job]) -> list[Job]:
    """``jobs`` in the order ``members`` lists them: by their first server, then in the order
    they joined it. (The order a round suspends jobs in: the simulator breaks ties between
    events of one instant by it, so it is kept as it was when a round listed its jobs server
    by server; on the whole Philly list another order moved mean JCT from 4.66 to 4.73 h.)"""
    members, home = p.book.members, p.book.home

    def place(job: Job) -> tuple[int, int]:
        first = home[job.id][0]
        return first, list(members[first]).index(job.id)

    return sorted(jobs, key=place) if len(jobs) > 1 else jobs


@dataclass(slots=True)
class Round:
    """What ``rebalance`` found, for ``rotate`` to go on from: the servers and jobs of the
    round, and the jobs' slots in slice order (homes as rebalanced)."""

    servers: set[int]
    jobs: list[Job]
    ordered: list[Slot]


def rebalance(p: Gandiva, cluster: Cluster, servers: set[int]) -> Round | None:
    """One slice order across ``servers`` (those rotating now, with their gangs' servers), as
    LAS has one across the cluster: a waiting job whose own server has no room for it in this
    round, while another has room left after every job before it in that order, moves its
    home there (it resumes there from its checkpoint) and ``rotate`` runs it there.

    The jobs the order runs are found greedily, each at home where it fits, else on the server
    with the most room left; then a running job that landed away from home swaps with a
    waiting job of its width that landed at its home, so that only waiting jobs move. Last,
    with ``idle_to_gangs``, the waiting gangs that found no room at home take, in the order,
    what is left idle (``idle_home``): room no job of the order wanted.
    """
    book, now = p.book, cluster.now
    up = {s for s in servers if cluster.nodes[s].up}
    # with balance_all the round is every server with jobs (``round_of``), and its jobs every
    # job with a home, in the order they got it (a job's place in the round is its slice key)
    S, jobs = (up, homed(p, cluster)) if p.balance_all else group(p, cluster, up)
    if len(S) < 2:
        return None
    size = {s: cluster.nodes[s].size for s in S}
    room = dict(size)
    by_id = sorted(S)
    # servers by room left: the most room anywhere is known without looking at every server,
    # and most jobs that do not fit at home find it too small (a round of 100 crowded servers
    # looked at every server for each such job)
    with_room = [0] * (max(size.values()) + 1)
    for r in room.values():
        with_room[r] += 1
    most = len(with_room) - 1

    def take(t: int, gpus: int) -> None:
        nonlocal most
        with_room[room[t]] -= 1
        room[t] -= gpus
        with_room[room[t]] += 1
        while most and not with_room[most]:
            most -= 1

    ordered = sorted(slots_of(p, cluster, jobs, now), key=slice_key(p, now, True))
    # the servers of running gangs (``spare_gangs``), and of all gangs (and ``idle_to_gangs``)
    ganged, homes = set(), set()
    if p.spare_gangs or p.idle_to_gangs:
        for sl in ordered:
            if len(sl.home) > 1:
                homes.update(sl.home)
                if sl.gpus and p.spare_gangs:
                    ganged.update(sl.home)
    unrun: list[Slot] = []  # waiting gangs that found no room at home (``idle_to_gangs``)
    away: list[tuple[Slot, int]] = []  # 1-server jobs the order runs off their home, where
    at: dict[tuple[int, int], list[Slot]] = {}  # (server, width) -> waiting jobs run at home
    for sl in ordered:
        if not most:  # no room anywhere: no later job takes any
            break
        if len(sl.home) > 1:  # a gang takes its share (``gang_share``), or runs on with it
            # (a gang with a server outside this round runs on if it runs, as in ``choose``)
            share = sl.share if sl.gpus else \
                gang_share(p, sl, room, size) if S.issuperset(sl.home) else None
            if share is not None:
                for t, k in zip(sl.home, share, strict=True):
                    if t in room:
                        take(t, min(k, room[t]) if p.gang_shares else room[t])
            elif not sl.gpus and p.idle_to_gangs:
                unrun.append(sl)
            continue
        h, w = sl.home[0], len(sl.gpus) or sl.width
        r = room[h]
        if ganged and not sl.gpus and h in ganged:
            # a waiting job's turn on a running gang's server would stop the whole gang:
            # it takes its turn on the first server with room that is no gang's home (one
            # where a waiting gang would take its turn only moves the loss)
            dest = next((t for t in by_id if t not in homes and room[t] >= w), None)
            if dest is not None:
                take(dest, w)
                away.append((sl, dest))
                continue
        if w <= r:  # ``take(h, w)``, written out: most jobs of a round come here
            with_room[r] -= 1
            room[h] = r - w
            with_room[r - w] += 1
            while most and not with_room[most]:
                most -= 1
            if not sl.gpus:
                at.setdefault((h, w), []).append(sl)
            continue
        if w <= most:  # the server with the most room, the first by id of those
            dest = next(t for t in by_id if room[t] == most)
            take(dest, w)
            away.append((sl, dest))
    moved = False
    for sl in unrun:  # the GPUs left idle, in slice order (``idle_to_gangs``)
        if not most:
            break
        if most * len(sl.home) < sl.width:
            continue
        dest = idle_home(p, sl, room, size, homes, by_id)
        if dest is None:
            continue
        for t, k in zip(dest, sl.share, strict=True):
            take(t, k)
        book.assign(cluster.jobs[sl.id], dest)
        sl.home = dest
        moved = True
        p.version += 1
    for sl, dest in away:
        if sl.gpus:  # running: a waiting job run at its home goes to ``dest`` instead
            stand_ins = at.get((sl.home[0], len(sl.gpus)))
            if not stand_ins:
                continue  # it is suspended at home this round
            sl = stand_ins.pop()
        book.assign(cluster.jobs[sl.id], (dest,))
        sl.home = (dest,)
        moved = True
        p.version += 1  # a move without an action yet (quiet.py)
    if moved:  # in the order ``group`` lists them now
        jobs = homed(p, cluster) if p.balance_all else members(p, cluster, S)
    return Round(S, jobs, ordered)


def idle_home(p: Gandiva, sl: Slot, room: dict[int, int], size: dict[int, int],
              homes: set[int], by_id: list[int]) -> tuple[int, ...] | None:
    """Servers for a waiting gang among those with ``room`` left idle, no more than its home
    has: those that are no gang's home first, then the most room; None if they have too
    little. Sets the gang's ``share`` of them."""
    dest, found = [], 0
    for t in sorted((t for t in by_id if room[t] > 0), key=lambda t: (t in homes, -room[t])):
        dest.append(t)
        found += room[t]
        if found >= sl.width or len(dest) == len(sl.home):
            break
    if found < sl.width:
        return None
    home = tuple(sorted(dest))
    share = share_on(p, home, sl.width, room, size)
    if share is None:
        return None
    sl.share = share
    return home


def stays_packed(cluster: Cluster, job: Job, run: set[str]) -> bool:
    """Does ``job``, not given a turn in this round, run on where it shares a GPU with a job
    that runs on, none of higher priority than its own?

    Decision: a packed job stays packed through a round that its GPU-mate runs on. The round
    counts room by each job's GPUs, so a packed pair takes two places and one of them lost
    its turn at nearly every round, only for packing to pack it again right after the round:
    on the first 20,000 Philly jobs (120x4), 43,310 of 43,374 packs were a job suspended and
    packed again in the same round, each a suspend and a resume of it, and a new trial.
    Packing's own judgement (``packing.judge``) still unpacks a pair that does not pay."""
    mates = [m for g in job.gpus for m in cluster.gpus[g].jobs if m != job.id]
    return bool(mates) and all(m in run and cluster.jobs[m].priority <= job.priority
                               for m in mates)


def rotate(p: Gandiva, cluster: Cluster, servers: set[int], tick: bool,
           ready: Round | None = None):  # -> Generator[A.Action, None, list[Job]]
    """A round on ``servers`` (plus the other servers of their gangs): who runs next
    (``choose``), carried out; returns the jobs of those servers (``servers`` now holds them
    all). (``ready``: the round ``rebalance`` found on them.)"""
    book, now, home = p.book, cluster.now, p.book.home
    if ready is not None:
        S, jobs = ready.servers | servers, ready.jobs
        keep, chosen_slots = choose(p, ready.ordered, {s: cluster.nodes[s].size for s in S},
                                    now, tick, ordered=True)
    else:
        S, jobs = group(p, cluster, servers)
        keep, chosen_slots = choose(p, slots_of(p, cluster, jobs, now),
                                    {s: cluster.nodes[s].size for s in S}, now, tick)
    chosen = [cluster.jobs[s.id] for s in chosen_slots]
    run = keep | {j.id for j in chosen}
    running = JobStatus.RUNNING
    stopping = by_server(p, [job for job in jobs if job.status is running and job.id not in run
                             and not stays_packed(cluster, job, run)])
    # the highest priority given room on each server: a job is displaced only by a job of
    # higher priority on its own server
    top: dict[int, int] = {}
    if stopping and max((j.priority for j in chosen), default=0) > min(
            j.priority for j in stopping):  # (else none is displaced by a higher one)
        for j in chosen:
            for t in home[j.id]:
                top[t] = max(top.get(t, j.priority), j.priority)
    for job in stopping:
        elsewhere = None
        if len(home[job.id]) == 1 and top.get(home[job.id][0], job.priority) > job.priority:
            elsewhere = free_elsewhere(p, cluster, home[job.id][0], job.num_gpus)
        if elsewhere is not None:
            # a lower-priority job moves away rather than stop, where GPUs are free
            yield A.Migrate(job.id, gpus_on(cluster, elsewhere, job.num_gpus))
            book.assign(job, (elsewhere,))
        else:
            yield A.Suspend(job.id)
    share = {s.id: s.share for s in chosen_slots} if p.gang_shares else {}
    for job in sorted([j for j in chosen if j.status is not running], key=lambda j: -j.num_gpus):
        gpus: list[int] = []
        if job.id in share and len(home[job.id]) > 1:
            for t, k in zip(home[job.id], share[job.id], strict=True):
                gpus.extend(gpus_on(cluster, t, k))
        else:
            for t in home[job.id]:
                gpus.extend(gpus_on(cluster, t, min(job.num_gpus - len(gpus),
                                                    len(cluster.free_gpus(t)))))
        if job.status is JobStatus.SUSPENDED:
            yield A.Resume(job.id, tuple(gpus))
            book.last_start[job.id] = now - switch_delay(job.memory_gb)
        else:
            yield A.Place(job.id, tuple(gpus))
            book.last_start[job.id] = now
    servers.update(S)
    return jobs
