"""Time-slicing on over-subscribed servers: a round of suspends and resumes every quantum.

Each round gives the servers' GPUs to their jobs in the slice order (``order.py``): a higher
priority first (a job is never suspended for a lower-priority one), then the order's own rule.
Packed jobs take their turns like the others, but one whose GPU-mate runs on stays packed
(``stays_packed``), and the packing step packs after the round. A multi-GPU job is suspended
and resumed as a whole. With ``balance`` (the default) the servers of a round share one slice
order (``rebalance``), as LAS has one across the cluster; with ``balance.servers=all`` every
server with jobs joins the round (``round_of``), so that a job alone on its server yields it
to waiting jobs of lower levels.

Gangs wider than a server time-slice too (beyond the paper, which does not say how they share):
such a gang belongs to whole servers and takes its turn on all of them at once. Rounds fall on
multiples of the quantum on every server, so servers that share gangs decide together, in one
slice order (docs/decisions/0034): a gang runs when the jobs before it left room enough for it
on its servers (``gangs.py``), and narrower jobs fill what is left. With ``spare_gangs`` a
waiting job takes its turn off the servers of a running gang where it can, and with
``idle_to_gangs`` a waiting gang with no room at home takes the GPUs the round leaves idle on
as many other servers (``rebalance``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

from gandiva import actions as A
from gandiva.policies.gandiva.config import BalanceSettings
from gandiva.policies.gandiva.framework import Mechanism, ignores_samples
from gandiva.policies.gandiva.gangs import GangShares
from gandiva.policies.gandiva.order import Key, Levels, SliceOrder, Slot
from gandiva.policies.gandiva.placement import free_elsewhere, gpus_on
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.state import Cluster, Job, JobStatus

# The paper: suspend+resume takes <100 ms for image models, ~1 s for large ones. Estimated
# from the job's profiled memory, the delay is charged back: the job's turn counts as having
# begun that much earlier, so the time lost to switching does not cost it its share.
SWITCH_FIXED_S, SWITCH_PER_GB_S = 0.05, 0.06


def switch_delay(memory_gb: float | None) -> float:
    return SWITCH_FIXED_S + SWITCH_PER_GB_S * (memory_gb or 0.0)


def held(cluster: Cluster, home: tuple[int, ...], gpus: tuple[int, ...]) -> tuple[int, ...]:
    """How many of ``gpus`` are on each server of ``home``."""
    on = [cluster.gpus[g].node for g in gpus]
    return tuple(on.count(t) for t in home)


@dataclass(slots=True)
class Round:
    """What ``rebalance`` found, for ``rotate`` to go on from: the servers and jobs of the
    round, and the jobs' slots in slice order (homes as rebalanced)."""

    servers: set[int]
    jobs: list[Job]
    ordered: list[Slot]


class TimeSlicing(Mechanism):
    """The rounds themselves. Their timers (``SLICE``, ``REFILL``) are the policy's own: it
    runs each instant's due rounds together (``Gandiva._refill``)."""

    may_change = ignores_samples

    def __init__(self, shared: Shared, order: SliceOrder, gangs: GangShares,
                 balance: BalanceSettings) -> None:
        self.s = shared
        self.slice_order = order
        self.gangs = gangs
        self.balance = balance.enabled
        self.balance_all = balance.enabled and balance.servers == "all"
        self.spare_gangs = balance.enabled and balance.spare_gangs
        self.idle_to_gangs = balance.enabled and balance.idle_to_gangs
        # the order of levels, where a round's outcome moves with time only as levels change
        self.levels = order if isinstance(order, Levels) and self.balance else None
        self.before: list[Callable[[Job, float], float]] = []  # the mechanisms' ``order``

    def order_by(self, orders: list[Callable[[Job, float], float]]) -> None:
        """Put each job, among those of its priority, by the sum of ``orders`` before the
        slice order's own rule (the mechanisms' ``order`` hooks)."""
        self.before = orders

    def key(self, now: float, tick: bool) -> Key:
        """The slice order's sort key at ``now``, with the mechanisms' orders in it."""
        key = self.slice_order.key(now, tick)
        if not self.before:
            return key
        return lambda s: (k := key(s))[:2] + (s.before, -s.rank) + k[2:]

    # ---- votes (``quiet.py``) -----------------------------------------------------------
    def time_dependent(self) -> bool:
        return self.levels is None or bool(self.before)

    def steady_until(self, cluster: Cluster, servers: set[int]) -> float | None:
        """After a round on ``servers`` that changed nothing: until when rounds on them would
        change nothing either, if nothing else changes (inf: for ever); None if the next may.
        The ``levels`` order reads a job's priority, whether it has run, its attained-service
        level and arrival: of these only the level of a running job moves with time."""
        assert self.levels is not None
        now, home = cluster.now, self.s.book.home
        if self.balance_all:  # every server with jobs takes the round: every running job
            jobs = [cluster.jobs[j] for j in cluster.running if j in home]
        else:
            _, jobs = self.group(cluster, self.round_of(cluster, servers))
        last_start, half = self.s.book.last_start, self.s.quantum / 2
        until = math.inf
        for job in jobs:
            if job.status is not JobStatus.RUNNING:
                continue
            if now - last_start.get(job.id, -math.inf) < half:
                return None  # it kept its turn in this round; in the next it competes
            attained = job.attained_at(now)
            limit = self.levels.next_limit(attained)
            if limit is not None:  # when ``las.level`` will say the next one
                until = min(until, now + (limit - attained) / len(job.gpus))
        return until

    # ---- the jobs of a round ------------------------------------------------------------
    def slots_of(self, cluster: Cluster, jobs: list[Job], now: float) -> list[Slot]:
        """The jobs' slots at ``now``: what a round decides over."""
        home, last_start = self.s.book.home, self.s.book.last_start
        service = self.slice_order.by_service
        tier = self.s.tier
        slots = [Slot(j.id, tier(j), j.seq, j.num_gpus, home[j.id], j.gpus,
                      last_start.get(j.id), j.attained_at(now) if service else 0.0, j.memory_gb)
                 for j in jobs]
        if self.before:
            for sl, j in zip(slots, jobs, strict=True):
                sl.before = sum(order(j, now) for order in self.before)
                sl.rank = self.s.rank(j)
        for sl in slots:
            if sl.gpus and len(sl.home) > 1:
                sl.share = held(cluster, sl.home, sl.gpus)
        return slots

    def round_of(self, cluster: Cluster, due: set[int]) -> set[int]:
        """The servers of a round at which ``due`` rotate (``group`` adds their gangs'
        servers): with ``balance.servers=all``, every server up with jobs on it too."""
        if not self.balance_all:
            return due
        members = self.s.book.members
        return due | {s for s, node in enumerate(cluster.nodes) if node.up and members[s]}

    def group(self, cluster: Cluster, servers: set[int]) -> tuple[set[int], list[Job]]:
        """``servers`` with the other servers of their gangs, and the jobs of them all (each
        once, by server then assignment order): what a round on ``servers`` decides over."""
        home, gangs = self.s.book.home, self.s.book.gangs
        S = set(servers)
        S.update(chain.from_iterable({home[jid] for s in servers for jid in gangs[s]}))
        return S, self.members(cluster, S)

    def members(self, cluster: Cluster, servers: set[int]) -> list[Job]:
        """The jobs of ``servers``, each once, by server then assignment order."""
        on = self.s.book.members
        return list(map(cluster.jobs.__getitem__,
                        dict.fromkeys(chain.from_iterable(on[s] for s in sorted(servers)))))

    def homed(self, cluster: Cluster) -> list[Job]:
        """Every job with a home, in the order it got it."""
        return list(map(cluster.jobs.__getitem__, self.s.book.home))

    def by_server(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` in the order ``members`` lists them: by their first server, then in the
        order they joined it: the order a round suspends jobs in, which the simulator breaks
        ties between events of one instant by (docs/decisions/0034)."""
        members, home = self.s.book.members, self.s.book.home

        def place(job: Job) -> tuple[int, int]:
            first = home[job.id][0]
            return first, list(members[first]).index(job.id)

        return sorted(jobs, key=place) if len(jobs) > 1 else jobs

    # ---- who runs -----------------------------------------------------------------------
    def choose(self, slots: list[Slot], size: dict[int, int], now: float, tick: bool,
               ordered: bool = False) -> tuple[set[str], list[Slot]]:
        """Who runs in the round at ``now`` on servers of ``size`` (gangs' servers all among
        them): the running gangs that keep their GPUs, and the jobs chosen, in slice order
        (``slots`` are in it already if ``ordered``). Each job takes GPUs while its server has
        room; a gang takes its share on the servers of its home (``gangs.py``)."""
        room, inside = dict(size), set(size)
        open_ = len(room)  # servers with room left: none, and no later job fits
        taken = self.gangs.taken

        def take(s: Slot) -> None:
            nonlocal open_
            if len(s.home) > 1:
                for t, k in zip(s.home, s.share, strict=True):
                    if t in room:
                        had = room[t]
                        room[t] = taken(had, k)
                        open_ -= had > 0 >= room[t]
            else:
                t = s.home[0]
                had = room[t]
                room[t] = had - (len(s.gpus) or s.width)
                open_ -= had > 0 >= room[t]

        # (a gang not ``inside`` has a server outside this round: it runs on if it runs)
        keep = {s.id for s in slots if s.gpus and len(s.home) > 1 and not inside.issuperset(s.home)}
        rest = slots
        if keep:
            for s in slots:
                if s.id in keep:
                    take(s)
            rest = [s for s in slots if s.id not in keep]
        if not ordered:
            rest = sorted(rest, key=self.key(now, tick))
        chosen: list[Slot] = []
        for s in rest:
            if not open_:
                break
            if len(s.home) > 1:  # (a running gang here has all its servers inside)
                if s.gpus or inside.issuperset(s.home):
                    share = self.gangs.share(s, room, size)
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

    def rebalance(self, cluster: Cluster, servers: set[int]) -> Round | None:
        """One slice order across ``servers`` (those rotating now, with their gangs' servers):
        a waiting job whose own server has no room for it in this round, while another has
        room left after every job before it in that order, moves its home there (it resumes
        there from its checkpoint) and ``rotate`` runs it there.

        The jobs the order runs are found greedily, each at home where it fits, else on the
        server with the most room left; then a running job that landed away from home swaps
        with a waiting job of its width that landed at its home, so that only waiting jobs
        move. Last, with ``idle_to_gangs``, the waiting gangs that found no room at home
        take, in the order, what is left idle (``idle_home``)."""
        book, now, used = self.s.book, cluster.now, self.gangs.used
        up = {s for s in servers if cluster.nodes[s].up}
        # with balance.servers=all the round is every server with jobs (``round_of``), and
        # its jobs every job with a home, in the order they got it
        S, jobs = (up, self.homed(cluster)) if self.balance_all else self.group(cluster, up)
        if len(S) < 2:
            return None
        size = {s: cluster.nodes[s].size for s in S}
        room = dict(size)
        by_id = sorted(S)
        # servers by room left: the most room anywhere is known without looking at every
        # server, and most jobs that do not fit at home find it too small
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

        ordered = sorted(self.slots_of(cluster, jobs, now), key=self.key(now, True))
        filtered, allows = bool(self.s.filters), self.s.allows

        def may(sl: Slot, t: int) -> bool:  # may the slot's job go on server ``t``
            return allows(cluster.jobs[sl.id], t, cluster)

        # the servers of running gangs (``spare_gangs``), and of all gangs
        ganged: set[int] = set()
        homes: set[int] = set()
        if self.spare_gangs or self.idle_to_gangs:
            for sl in ordered:
                if len(sl.home) > 1:
                    homes.update(sl.home)
                    if sl.gpus and self.spare_gangs:
                        ganged.update(sl.home)
        unrun: list[Slot] = []  # waiting gangs that found no room at home (``idle_to_gangs``)
        away: list[tuple[Slot, int]] = []  # 1-server jobs the order runs off their home
        at: dict[tuple[int, int], list[Slot]] = {}  # (server, width) -> waiting run at home
        for sl in ordered:
            if not most:  # no room anywhere: no later job takes any
                break
            if len(sl.home) > 1:  # a gang takes its share, or runs on with it
                share = sl.share if sl.gpus else \
                    self.gangs.share(sl, room, size) if S.issuperset(sl.home) else None
                if share is not None:
                    for t, k in zip(sl.home, share, strict=True):
                        if t in room:
                            take(t, min(k, room[t]) if used else room[t])
                elif not sl.gpus and self.idle_to_gangs:
                    unrun.append(sl)
                continue
            h, w = sl.home[0], len(sl.gpus) or sl.width
            r = room[h]
            if ganged and not sl.gpus and h in ganged:
                # a waiting job's turn on a running gang's server would stop the whole gang:
                # it takes its turn on the first server with room that is no gang's home
                dest = next((t for t in by_id if t not in homes and room[t] >= w
                             and (not filtered or may(sl, t))), None)
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
                if not filtered:
                    dest = next(t for t in by_id if room[t] == most)
                else:  # of those the job may go on
                    dest = max((t for t in by_id if room[t] >= w and may(sl, t)),
                               key=room.__getitem__, default=None)
                    if dest is None:
                        continue
                take(dest, w)
                away.append((sl, dest))
        moved = False
        idle = sum(room.values()) if unrun else 0
        for sl in unrun:  # the GPUs left idle, in slice order (``idle_to_gangs``)
            if not most:
                break
            if most * len(sl.home) < sl.width or idle < sl.width:
                continue
            home = self.idle_home(sl, room, size, homes,
                                  [t for t in by_id if may(sl, t)] if filtered else by_id)
            if home is None:
                continue
            for t, k in zip(home, sl.share, strict=True):
                take(t, k)
            idle -= sum(sl.share)
            book.assign(cluster.jobs[sl.id], home)
            sl.home = home
            moved = True
            self.s.changes += 1
        for sl, dest in away:
            if sl.gpus:  # running: a waiting job run at its home goes to ``dest`` instead
                stand_ins = at.get((sl.home[0], len(sl.gpus)))
                if filtered and stand_ins:  # (the last of those that may go there)
                    fits = [i for i, s in enumerate(stand_ins) if may(s, dest)]
                    stand_ins = [stand_ins.pop(fits[-1])] if fits else None
                if not stand_ins:
                    continue  # it is suspended at home this round
                sl = stand_ins.pop()
            book.assign(cluster.jobs[sl.id], (dest,))
            sl.home = (dest,)
            moved = True
            self.s.changes += 1  # a move without an action yet (quiet.py)
        if moved:  # in the order ``group`` lists them now
            jobs = self.homed(cluster) if self.balance_all else self.members(cluster, S)
        return Round(S, jobs, ordered)

    def idle_home(self, sl: Slot, room: dict[int, int], size: dict[int, int],
                  homes: set[int], by_id: list[int]) -> tuple[int, ...] | None:
        """Servers for a waiting gang among those with ``room`` left idle, no more than its
        home has: those that are no gang's home first, then the most room; None if they have
        too little. Sets the gang's ``share`` of them."""
        dest, found = [], 0
        for t in sorted((t for t in by_id if room[t] > 0), key=lambda t: (t in homes, -room[t])):
            dest.append(t)
            found += room[t]
            if found >= sl.width or len(dest) == len(sl.home):
                break
        if found < sl.width:
            return None
        home = tuple(sorted(dest))
        share = self.gangs.share_on(home, sl.width, room, size)
        if share is None:
            return None
        sl.share = share
        return home

    # ---- the round, carried out ---------------------------------------------------------
    def rotate(self, cluster: Cluster, servers: set[int], tick: bool,
               ready: Round | None = None) -> Decision[list[Job]]:
        """A round on ``servers`` (plus the other servers of their gangs): who runs next
        (``choose``), carried out; returns the jobs of those servers (``servers`` now holds
        them all). (``ready``: the round ``rebalance`` found on them.)"""
        book, now = self.s.book, cluster.now
        home = book.home
        if ready is not None:
            S, jobs = ready.servers | servers, ready.jobs
            keep, chosen_slots = self.choose(ready.ordered,
                                             {s: cluster.nodes[s].size for s in S},
                                             now, tick, ordered=True)
        else:
            S, jobs = self.group(cluster, servers)
            keep, chosen_slots = self.choose(self.slots_of(cluster, jobs, now),
                                             {s: cluster.nodes[s].size for s in S}, now, tick)
        chosen = [cluster.jobs[s.id] for s in chosen_slots]
        run = keep | {j.id for j in chosen}
        running, tier = JobStatus.RUNNING, self.s.tier
        stopping = self.by_server([job for job in jobs if job.status is running
                                   and job.id not in run
                                   and not stays_packed(cluster, job, run, tier)])
        # the highest priority given room on each server: a job is displaced only by a job
        # of higher priority on its own server
        top: dict[int, int] = {}
        if stopping and max((tier(j) for j in chosen), default=0) > min(
                tier(j) for j in stopping):  # (else none is displaced by a higher one)
            for j in chosen:
                for t in home[j.id]:
                    top[t] = max(top.get(t, tier(j)), tier(j))
        for job in stopping:
            elsewhere = None
            if len(home[job.id]) == 1 and top.get(home[job.id][0], tier(job)) > tier(job):
                elsewhere = free_elsewhere(book, cluster, home[job.id][0], job.num_gpus,
                                           may=self.s.may_go(job, cluster))
            if elsewhere is not None:
                # a lower-priority job moves away rather than stop, where GPUs are free
                yield A.Migrate(job.id, gpus_on(cluster, elsewhere, job.num_gpus))
                book.assign(job, (elsewhere,))
            else:
                yield A.Suspend(job.id)
        share = {s.id: s.share for s in chosen_slots} if self.gangs.used else {}
        for job in sorted([j for j in chosen if j.status is not running],
                          key=lambda j: -j.num_gpus):
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


def stays_packed(cluster: Cluster, job: Job, run: set[str], tier: Callable[[Job], int]
                 ) -> bool:
    """Does ``job``, not given a turn in this round, run on where it shares a GPU with a job
    that runs on, none of higher priority than its own? A packed pair takes two places in a
    round's count, so one of them lost its turn at nearly every round only for packing to pack
    it again after it (docs/decisions/0004); packing's own judgement still unpacks a pair that
    does not pay."""
    mates = [m for g in job.gpus for m in cluster.gpus[g].jobs if m != job.id]
    return bool(mates) and all(m in run and tier(cluster.jobs[m]) <= tier(job) for m in mates)
