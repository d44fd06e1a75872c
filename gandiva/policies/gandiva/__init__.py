"""``gandiva``: the Gandiva policy (Xiao et al., OSDI 2018), reactive and introspective.

Reactive: place arrivals by affinity, over-subscribing servers (Algorithm 1, ``placement.py``);
on departures, and when a server joins, start waiting jobs and lower the cluster's height by
moving waiting jobs onto the free GPUs. Introspective, continuously: time-slice over-subscribed
servers, pack under overload when the profiles say it pays, migrate for locality, defragment,
grow and shrink elastic jobs.

The policy is a composition of small mechanisms, each owning its state, sharing only the
policy's book, queue and timers (``shared.py``):

- slice order (``order.py``) and gang shares (``gangs.py``), which time-slicing
  (``timeslice.py``) runs its rounds with;
- admission when every server is full (``admission.py``);
- packing (``packing.py``), migration and defragmentation (``migration.py``), elastic jobs
  (``elastic.py``);
- quiet rounds put off (``quiet.py``), the simulator's one accelerator.

Its settings are one section per mechanism (``config.py``), under two presets: ``gandiva``
(the default) and ``gandiva-paper`` (the paper's policy). docs/policy.md says why each
default is what it is.
"""

from __future__ import annotations

from collections.abc import Iterator

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.admission import Admission, LasAdmission, Queue
from gandiva.policies.gandiva.book import Book, Waiting
from gandiva.policies.gandiva.config import PRESETS, Config, parse, settings
from gandiva.policies.gandiva.elastic import Elastic
from gandiva.policies.gandiva.gangs import GangShares
from gandiva.policies.gandiva.migration import Defrag, Locality, is_spread, may_consolidate
from gandiva.policies.gandiva.order import Las, Levels, RoundRobin, SliceOrder
from gandiva.policies.gandiva.packing import Packing
from gandiva.policies.gandiva.placement import (
    choose_server,
    free_elsewhere,
    gang_gpus,
    gang_servers,
    gpus_on,
)
from gandiva.policies.gandiva.quiet import Quiet
from gandiva.policies.gandiva.shared import Decision, Shared, T
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.policies.gandiva.timeslice import TimeSlicing
from gandiva.state import Cluster, Job, JobStatus

__all__ = ["Config", "Gandiva", "PRESETS", "build", "parameters"]


def slice_order(config: Config) -> SliceOrder:
    q, s = config.quantum, config.slices
    if s.order == "levels":
        return Levels(q, s.level_step, s.keep_turn)
    return Las(q) if s.order == "las" else RoundRobin(q)


class Gandiva:
    # a fast path, switched off only by the test that checks it decides as a full rescan
    SCAN_FROM_ARRIVAL = True

    def __init__(self, config: Config | None = None, name: str = "gandiva",
                 spec: str | None = None) -> None:
        c = self.config = config or Config()
        self.name, self.spec = name, spec or name
        s = self.s = Shared(c.quantum)
        self.order = slice_order(c)
        self.slicing = TimeSlicing(s, self.order, GangShares(c.gangs.share == "used"),
                                   c.balance)
        self.admission: Admission = (
            LasAdmission(s, c.admission.displace_margin, c.placement.max_height,
                         self._send_back) if c.admission.rule == "las" else Queue())
        self.packing = Packing(s, c.packing)
        self.locality = Locality(s, c.migration.enabled, c.migration.max_moves)
        self.defrag = Defrag(s, c.defrag.enabled, c.defrag.interval, c.defrag.max_move_s,
                             c.placement.scan_depth)
        self.elastic = Elastic(s, c.elastic.enabled, c.elastic.grow_idle_s)
        self.quiet = Quiet(s, self.order, self.slicing, self.packing, self.elastic)
        self.oversubscribe = c.placement.oversubscribe
        self.max_height = c.placement.max_height
        self.scan_depth = c.placement.scan_depth
        self._started = False
        self._rounded: set[int] = set()  # the servers of this decision's round (``quiet``)
        self._placed_on: set[int] = set()  # servers given a job in this decision (``elastic``)
        # The last scan of the waiting jobs placed none and made no action, and since then
        # only arrivals came (and profile samples that made no action): the state those jobs
        # failed in is unchanged, so an arrival's scan starts at the newcomer. Not under
        # ``LasAdmission``, whose displacing depends on attained service, i.e. on time.
        self._stuck = False
        self.scans_from_arrival = 0  # how often the fast path was taken

    @property
    def book(self) -> Book:
        """Its homes and heights (read them; the policy writes them)."""
        return self.s.book

    @property
    def quantum(self) -> float:
        return self.config.quantum

    def placements(self) -> Book:
        """Where jobs belong, for readers (``backends.explain``), who read it through
        ``Book.placement`` and ``Book.moved_since`` only."""
        return self.s.book

    @property
    def waiting(self) -> Waiting:
        """The jobs with no home yet, in the order they are placed."""
        return self.s.waiting

    def attach(self, cluster: Cluster) -> Book:
        """Open the book on ``cluster``'s servers: done at the first decision, and by a test
        that sets a state up by hand before it."""
        if not self._started:
            self.s.book.add_servers(cluster)
            self._started = True
        return self.s.book

    # ---- the decision -------------------------------------------------------------------
    def decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        s, packing = self.s, self.packing
        # what may end a packing trial: a job stopping, and the policy's own actions
        if isinstance(event, E.Departure):
            packing.touched(event.job_id)
        elif isinstance(event, E.Failure):
            packing.touched_all()
        if isinstance(event, E.Tick):
            self.quiet.at_tick(cluster.now)
        elif isinstance(event, E.ProfileSample):
            s.changes += self.quiet.news(cluster, event)
        else:
            s.changes += 1
        before = s.changes
        for action in self._decide(event, cluster):
            if not isinstance(action, A.Control):
                packing.touched(action.job_id)
                s.changes += 1
            yield action
        if self.quiet.after(cluster, before, self._rounded):
            yield from s.timers.wake()

    def _decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        s, book, timers = self.s, self.attach(cluster), self.s.timers
        touched: set[int] = set()
        self._rounded = set()
        if not isinstance(event, E.Arrival | E.ProfileSample):
            self._stuck = False
        arrived = None
        if isinstance(event, E.Arrival):
            job = arrived = cluster.jobs[event.job.id]
            s.waiting.add(job)
            self.elastic.arrived(job)
        elif isinstance(event, E.Departure):
            job = cluster.jobs[event.job_id]
            touched.update(book.home.get(job.id, ()))
            self._forget(job)
        elif isinstance(event, E.Failure):
            for jid in list(book.members[event.node]):  # back to placement, from checkpoints
                job = cluster.jobs[jid]
                self._send_back(job, self.admission.rank(job, cluster.now))
        elif isinstance(event, E.Join):
            book.add_servers(cluster)
        elif isinstance(event, E.PriorityChange):
            job = cluster.jobs[event.job_id]
            if job.id in s.waiting:
                s.waiting.add(job, self.admission.rank(job, cluster.now))
            # its servers reorder at a tick of this instant, once every change of the instant
            # is in: a controller changing several at once (a sweep promoting its top trials)
            # had each change carried out alone, a job resumed for one suspended for the next
            for server in book.home.get(job.id, ()):
                timers.arm(cluster.now, TimerKind.REFILL, server)
        elif isinstance(event, E.ProfileSample):
            self.packing.observe(cluster, event)
            if self.packing.enabled:
                for action in self.packing.judge(cluster):
                    self._stuck = False
                    yield action
            return
        elif isinstance(event, E.OutOfMemory):
            yield from self.packing.out_of_memory(cluster, cluster.jobs[event.job_id])
            return

        due = []
        if isinstance(event, E.Tick):
            due = timers.due(cluster.now)
            touched.update(server for kind, server in due if kind is TimerKind.REFILL)
        slices = {server for kind, server in due if kind is TimerKind.SLICE}
        if slices:
            slices = self.slicing.round_of(cluster, slices)
            yield from self._refill(cluster, slices, tick=True)
            self._rounded = slices  # (with their gangs' servers: rotate adds them)
            if any(True for _ in cluster.nodes_with_free(cluster.max_free_bucket)):
                yield from self._lower_height(cluster)  # a gang whose turn ended may move
        if touched - slices:
            yield from self._refill(cluster, touched - slices, tick=False)
        touched |= slices
        if not isinstance(event, E.Tick):  # time slices move no job between servers
            yield from self._place_waiting(cluster, arrived)
        if isinstance(event, E.Departure | E.Join):  # GPUs became free, or new ones came
            yield from self._lower_height(cluster)
            # (a departure while a spread is armed waits with it: it looks at every free GPU
            # then, whichever departure freed it)
            if timers.when(TimerKind.SPREAD) is None and self.packing.wants_spread(cluster):
                timers.arm(cluster.now + s.quantum, TimerKind.SPREAD)
            if self.locality.enabled:
                yield from self.locality.consolidate(cluster)
        for kind, server in due:
            if kind is TimerKind.GROW and self.elastic.enabled:
                yield from self.elastic.grow(cluster, server)
            elif kind is TimerKind.SPREAD and self.packing.packed_on and not len(s.waiting):
                yield from self.packing.spread_elsewhere(cluster)
            elif kind is TimerKind.DEFRAG and self.defrag.enabled:
                yield from self.defrag.run(cluster)
                yield from self._place_waiting(cluster)
        if self.elastic.enabled and self.elastic.jobs:
            self.elastic.note_idle(cluster, touched | self._placed_on)
        self._placed_on.clear()
        if (self.defrag.enabled and len(s.waiting) and timers.when(TimerKind.DEFRAG) is None
                and self.defrag.blocked(cluster)):
            timers.arm(cluster.now + self.defrag.interval, TimerKind.DEFRAG)
        yield from timers.wake()

    # ---- steps --------------------------------------------------------------------------
    def _forget(self, job: Job) -> None:
        self.s.book.release(job)
        self.s.waiting.discard(job.id)  # a job cancelled before it had a server
        self.packing.forget(job.id)
        self.locality.forget(job.id)
        self.elastic.forget(job.id)
        self.s.book.last_start.pop(job.id, None)
        self.quiet.forget(job.id)

    def _send_back(self, job: Job, rank: float) -> None:
        """The job loses its home (a failed server, a place given to another) and waits for
        placement again, at ``rank`` in the queue."""
        self.s.book.release(job)
        self.locality.forget(job.id)
        self.s.waiting.add(job, rank)

    def _refill(self, cluster: Cluster, servers: set[int], tick: bool) -> Decision[None]:
        """A round of time-slicing on ``servers`` (and packing where they stay
        over-subscribed)."""
        s, slicing, packing = self.s, self.slicing, self.packing
        book = s.book
        ready = slicing.rebalance(cluster, servers) if tick and slicing.balance else None
        jobs = yield from slicing.rotate(cluster, servers, tick, ready)
        # each server's waiting jobs, from the round's
        home, running = book.home, JobStatus.RUNNING
        waits: dict[int, list[Job]] = {}
        for job in jobs:
            if job.status is not running:
                for server in home[job.id]:
                    waits.setdefault(server, []).append(job)
        rotating = set()
        for server in sorted(servers):
            waiting = server in waits  # spreading out leaves it so
            if packing.enabled:
                if cluster.free_gpus(server):  # (most servers of a round have none)
                    yield from packing.spread_out(cluster, server)
                guests = packing.guests(waits[server]) if waiting else None
                if guests:
                    _, packed = yield from noting(packing.try_pack(cluster, server, guests))
                    waiting = not packed or book.has_waiting(server, cluster)
            if waiting:
                rotating.add(server)
        if rotating:
            s.timers.arm(s.next_round(cluster.now), TimerKind.SLICE, *sorted(rotating))

    def _place_waiting(self, cluster: Cluster, arrived: Job | None = None) -> Decision[None]:
        """Algorithm 1 for the jobs not yet on a server, highest priority then oldest first.
        (After a scan that was ``_stuck``, an ``arrived`` job's scan starts at it: the jobs
        before it would fail again as they just did, changing nothing.)"""
        waiting, admission = self.s.waiting, self.admission
        i = 0
        widths: set[int] = set()  # the first waiting job of each width is at its head
        if (arrived is not None and self._stuck and not admission.displaces
                and self.SCAN_FROM_ARRIVAL):
            self.scans_from_arrival += 1
            i = waiting.index(arrived.id)
            if i >= self.scan_depth:
                return
            widths = {cluster.jobs[j].num_gpus for j in waiting.first(i)}
        changed = False
        admission.new_scan()
        while i < min(self.scan_depth, len(waiting)):
            job = cluster.jobs[waiting[i]]
            head = job.num_gpus not in widths
            widths.add(job.num_gpus)
            placed, acted = yield from noting(self._place(cluster, job, first=head))
            changed = changed or placed or acted
            if placed:
                waiting.discard(job.id)
                admission.placed()
            else:
                i += 1
        self._stuck = not changed

    def _place(self, cluster: Cluster, job: Job, first: bool = False) -> Decision[bool]:
        """Place one waiting job (``first``: the first of its width in the queue); whether
        it got a home."""
        s, book, now = self.s, self.s.book, cluster.now
        if job.num_gpus > cluster.max_free_bucket:
            gpus = gang_gpus(job, cluster)
            servers = None
            if gpus is None:
                servers = gang_servers(job, cluster, book, self.max_height,
                                       head=first) if self.oversubscribe else None
                if servers is None and self.admission.displaces and first:
                    # no place under max_height: make room on servers by sending back jobs
                    # with more service, as a 1-server job displaces one
                    yield from self.admission.make_room(cluster, job)
                    gpus = gang_gpus(job, cluster)
                    if gpus is None:
                        servers = gang_servers(job, cluster, book, self.max_height, head=True)
            if gpus is None:
                if servers is None:
                    return False
                book.assign(job, servers)  # it starts at a round of one of them
                for server in servers:
                    s.timers.arm(s.next_round(now), TimerKind.SLICE, server)
                return True
            book.assign(job, tuple(sorted(cluster.servers_of(gpus))))
            yield self._start(job, gpus, now)
            self.locality.placed(cluster, job)
            return True
        choice = choose_server(job, cluster, book, self.max_height, self.oversubscribe,
                               head=first)
        if ((choice is None or not choice[1]) and self.elastic.enabled
                and self.elastic.grown(cluster)):
            # shrink at once when new work needs the GPUs, before time-slicing anyone (the
            # shrinks are chosen together, before any is applied)
            shrunk = list(self.elastic.shrink_for(cluster, job))
            yield from shrunk
            if shrunk:
                choice = choose_server(job, cluster, book, self.max_height,
                                       self.oversubscribe, head=first)
        if choice is None and self.admission.displaces:
            if (yield from self.admission.displace(cluster, job)):
                choice = choose_server(job, cluster, book, self.max_height,
                                       self.oversubscribe, head=first)
        if choice is None:
            return False
        server, starts = choice
        book.assign(job, (server,))
        self._placed_on.add(server)
        if starts:
            yield self._start(job, gpus_on(cluster, server, job.num_gpus), now)
            self.locality.placed(cluster, job)
        else:
            s.timers.arm(s.next_round(now), TimerKind.SLICE, server)
        return True

    def _start(self, job: Job, gpus: tuple[int, ...], now: float) -> A.JobAction:
        self.s.book.last_start[job.id] = now
        if job.status is JobStatus.SUSPENDED:
            return A.Resume(job.id, gpus)
        return A.Place(job.id, gpus)

    def _lower_height(self, cluster: Cluster) -> Decision[None]:
        """Move waiting jobs from the highest servers onto free GPUs of servers with no
        queue."""
        book = self.s.book
        if not cluster.free_count():
            return  # no free GPU anywhere: nothing can move (and 1,000 servers go unsorted)
        # gang widths that found no consolidated GPUs: this step only takes GPUs, and the
        # fewest servers that hold a width never drop as free GPUs go, so they find none again
        # (a busy stretch of Philly asked 700,000 times for 8-GPU gangs' GPUs)
        no_room: set[int] = set()
        for src in book.crowded():
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
                    book.assign(job, tuple(sorted(cluster.servers_of(gpus))))
                    yield self._start(job, gpus, cluster.now)
                    continue
                dest = free_elsewhere(book, cluster, src, job.num_gpus)
                if dest is None:
                    return
                book.assign(job, (dest,))
                yield self._start(job, gpus_on(cluster, dest, job.num_gpus), cluster.now)


def build(name: str, options: list[str], spec: str | None = None) -> Gandiva:
    """The policy of preset ``name`` with a spec's ``options`` over it."""
    return Gandiva(parse(name, options), name=name, spec=spec)


def parameters(name: str) -> dict[str, object]:
    """The settings of preset ``name``, by dotted path."""
    return settings(parse(name, []))


POLICY = Gandiva


def noting(actions: Decision[T]) -> Decision[tuple[T, bool]]:
    """Pass on what ``actions`` yields; return its result and whether it yielded any."""
    acted = False
    while True:
        try:
            action = next(actions)
        except StopIteration as end:
            return end.value, acted
        acted = True
        yield action
