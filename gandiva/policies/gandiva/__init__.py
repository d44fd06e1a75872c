"""``gandiva``: the Gandiva policy (Xiao et al., OSDI 2018), reactive and introspective.

Reactive: place arrivals by affinity, over-subscribing servers (Algorithm 1, ``placement.py``);
on departures, and when a server joins, start waiting jobs and lower the cluster's height by
moving waiting jobs onto the free GPUs. Introspective, continuously: time-slice over-subscribed
servers, pack under overload when the profiles say it pays, migrate for locality, defragment,
grow and shrink elastic jobs.

The policy is a composition of small mechanisms, each owning its state, sharing only the
policy's book, queue and timers (``shared.py``), and plugged into the hooks of ``framework.py``,
which this module calls in order (docs/policy.md#hooks):

- time-slicing (``timeslice.py``), with its slice order (``order.py``) and gang shares
  (``gangs.py``);
- packing (``packing.py``), migration and defragmentation (``migration.py``), elastic jobs
  (``elastic.py``), admission when every server is full (``admission.py``);
- quiet rounds put off (``quiet.py``), by the mechanisms' votes: the simulator's accelerator.

Its settings are one section per mechanism (``config.py``), under two presets: ``gandiva``
(the default) and ``gandiva-paper`` (the paper's policy). docs/policy.md says why each
default is what it is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.admission import Admission, LasAdmission, Queue
from gandiva.policies.gandiva.book import Book, Waiting
from gandiva.policies.gandiva.config import PRESETS, Config, parse, settings
from gandiva.policies.gandiva.elastic import Elastic
from gandiva.policies.gandiva.fair import FairShare
from gandiva.policies.gandiva.framework import Cycle, Mechanism, overriders, plug_in, plugged
from gandiva.policies.gandiva.gangs import GangShares
from gandiva.policies.gandiva.migration import Defrag, Locality
from gandiva.policies.gandiva.order import Las, Levels, RoundRobin, SliceOrder
from gandiva.policies.gandiva.packing import Packing
from gandiva.policies.gandiva.placement import (
    Placer,
    allowed_on,
    gang_gpus,
    gang_servers,
    gpus_on,
    lower_height,
)
from gandiva.policies.gandiva.quiet import Quiet
from gandiva.policies.gandiva.shared import Decision, Shared, noting
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.policies.gandiva.timeslice import TimeSlicing
from gandiva.state import Cluster, Job, JobStatus

__all__ = ["Config", "Cycle", "Gandiva", "Mechanism", "PRESETS", "build", "parameters", "plug_in"]


def slice_order(config: Config) -> SliceOrder:
    q, s = config.quantum, config.slices
    if s.order == "levels":
        return Levels(q, s.level_step, s.keep_turn)
    return Las(q) if s.order == "las" else RoundRobin(q)


class Gandiva:
    def __init__(self, config: Config | None = None, name: str = "gandiva",
                 spec: str | None = None, plugins: Iterable[Mechanism] = ()) -> None:
        """The policy of ``config``, its mechanisms built from it, and ``plugins`` (mechanisms
        from outside the package) after them."""
        c = self.config = config or Config()
        self.name, self.spec = name, spec or name
        s = self.s = Shared(c.quantum)
        self.slicing = TimeSlicing(s, slice_order(c), GangShares(c.gangs.share == "used"),
                                   c.balance)
        self.packing = Packing(s, c.packing) if c.packing.enabled else None
        self.locality = Locality(s, c.migration.max_moves) if c.migration.enabled else None
        self.elastic = Elastic(s, c.elastic.grow_idle_s) if c.elastic.enabled else None
        self.admission: Admission = (
            LasAdmission(s, c.admission.displace_margin, c.placement.max_height,
                         self._send_back) if c.admission.rule == "las" else Queue())
        self.defrag = (Defrag(s, c.defrag.interval, c.defrag.max_move_s,
                              c.placement.scan_depth) if c.defrag.enabled else None)
        self.fair = FairShare(s, c.fair.gang_wait) if c.fair.enabled else None
        # the order hooks run in: some hooks' order decides (room is made by shrinking an
        # elastic job before displacing one; spreading is armed before locality moves)
        self.mechanisms: list[Mechanism] = [
            m for m in (self.slicing, self.packing, self.locality, self.elastic,
                        self.admission, self.defrag, self.fair, *plugged(c.plugins, s),
                        *plugins)
            if m is not None]
        ms = self.mechanisms
        self._observe, self._acted = overriders(ms, "observe"), overriders(ms, "acted")
        self._forget_hooks = overriders(ms, "forget")
        self._permit, self._make_room = overriders(ms, "permit"), overriders(ms, "make_room")
        self._after_round = overriders(ms, "after_round")
        self._after_decision = overriders(ms, "after_decision")
        self._on_timer: dict[TimerKind, Callable[..., Decision[bool]]] = {}
        owner: dict[TimerKind, Mechanism] = {}
        for m in ms:
            for kind, method in m.timers.items():
                if kind in owner:
                    raise ValueError(f"timer {kind.value!r} has two owners: "
                                     f"{type(owner[kind]).__name__} and {type(m).__name__}")
                owner[kind] = m
                self._on_timer[kind] = getattr(m, method)
        s.filters = overriders(ms, "filter")
        self._placer = Placer(c.placement, s, overriders(ms, "score"))
        self._orders = overriders(ms, "order")
        self.slicing.order_by(self._orders)
        self.quiet = Quiet(s, ms, self.slicing.steady_until)
        self._started = False
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

    def put_off_quiet_rounds(self) -> None:
        """The backend watches no time-slicing round (the simulator without its timeline or a
        controller): rounds that would change nothing may be put off (``quiet.py``)."""
        self.quiet.enabled = True

    def attach(self, cluster: Cluster) -> Book:
        """Open the book on ``cluster``'s servers: done at the first decision, and by a test
        that sets a state up by hand before it."""
        if not self._started:
            self.s.book.add_servers(cluster)
            self._started = True
        return self.s.book

    # ---- the decision -------------------------------------------------------------------
    def decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        s, acted = self.s, self._acted
        cycle = Cycle(event)
        if isinstance(event, E.Tick):
            self.quiet.at_tick(cluster.now)
        elif isinstance(event, E.ProfileSample):
            s.changes += self.quiet.news(cluster, event)
        else:
            s.changes += 1
        before = s.changes
        for action in self._decide(event, cluster, cycle):
            if not isinstance(action, A.Control):
                for hook in acted:
                    hook(action)
                s.changes += 1
            yield action
        if self.quiet.after(cluster, before, cycle.rounded):
            yield from s.timers.wake()

    def _decide(self, event: E.Event, cluster: Cluster, cycle: Cycle) -> Iterator[A.Action]:
        s, book, timers = self.s, self.attach(cluster), self.s.timers
        touched = cycle.touched
        if not isinstance(event, E.Arrival | E.ProfileSample):
            self._stuck = False
        for observe in self._observe:
            _, acted = yield from noting(observe(cluster, event, cycle))
            if acted:
                self._stuck = False
        if isinstance(event, E.Arrival):
            job = cycle.arrived = cluster.jobs[event.job.id]
            self._queue(job, cluster.now)
        elif isinstance(event, E.Departure):
            job = cluster.jobs[event.job_id]
            touched.update(book.home.get(job.id, ()))
            self._forget(job)
        elif isinstance(event, E.Failure):
            for jid in list(book.members[event.node]):  # back to placement, from checkpoints
                job = cluster.jobs[jid]
                self._send_back(cluster, job, self.admission.rank(job, cluster.now))
        elif isinstance(event, E.Join):
            book.add_servers(cluster)
        elif isinstance(event, E.PriorityChange):
            job = cluster.jobs[event.job_id]
            if job.id in s.waiting:
                self._queue(job, cluster.now, self.admission.rank(job, cluster.now))
            # its servers reorder at a tick of this instant, once every change of the instant
            # is in: a controller changing several at once (a sweep promoting its top trials)
            # had each change carried out alone, a job resumed for one suspended for the next
            for server in book.home.get(job.id, ()):
                timers.arm(cluster.now, TimerKind.REFILL, server)
        elif isinstance(event, E.ProfileSample | E.OutOfMemory):
            yield from timers.wake()  # (a packed job that left its mate waits for a round)
            return  # news for the mechanisms alone (``observe``)

        due = []
        if isinstance(event, E.Tick):
            due = timers.due(cluster.now)
            touched.update(server for kind, server in due if kind is TimerKind.REFILL)
        slices = {server for kind, server in due if kind is TimerKind.SLICE}
        if slices:
            slices = self.slicing.round_of(cluster, slices)
            yield from self._refill(cluster, slices, tick=True)
            cycle.rounded = slices  # (with their gangs' servers: rotate adds them)
            if any(True for _ in cluster.nodes_with_free(cluster.max_free_bucket)):
                yield from lower_height(self.s, cluster)  # a gang whose turn ended may move
        if touched - slices:
            yield from self._refill(cluster, touched - slices, tick=False)
        touched |= slices
        if not isinstance(event, E.Tick):  # time slices move no job between servers
            yield from self._place_waiting(cluster, cycle)
        if isinstance(event, E.Departure | E.Join):  # GPUs became free, or new ones came
            yield from lower_height(self.s, cluster)
        for kind, server in due:
            handle = self._on_timer.get(kind)
            if handle is not None and (yield from handle(cluster, server, cycle)):
                yield from self._place_waiting(cluster, cycle)
        for after in self._after_decision:
            yield from after(cluster, cycle)
        yield from timers.wake()

    # ---- steps --------------------------------------------------------------------------
    def _forget(self, job: Job) -> None:
        self.s.book.release(job)
        self.s.waiting.discard(job.id)  # a job cancelled before it had a server
        self.s.book.last_start.pop(job.id, None)
        for forget in self._forget_hooks:
            forget(job.id)

    def _send_back(self, cluster: Cluster, job: Job, rank: float) -> None:
        """The job loses its home (a failed server, a place given to another) and waits for
        placement again, at ``rank`` in the queue."""
        self.s.book.release(job)
        if self.locality is not None:
            self.locality.forget(job.id)
        self._queue(job, cluster.now, rank)

    def _refill(self, cluster: Cluster, servers: set[int], tick: bool) -> Decision[None]:
        """A round of time-slicing on ``servers``, then the mechanisms that seat the jobs it
        left waiting (``after_round``: packing)."""
        s, slicing = self.s, self.slicing
        ready = slicing.rebalance(cluster, servers) if tick and slicing.balance else None
        jobs = yield from slicing.rotate(cluster, servers, tick, ready)
        # each server's waiting jobs, from the round's
        home, running = s.book.home, JobStatus.RUNNING
        waits: dict[int, list[Job]] = {}
        for job in jobs:
            if job.status is not running:
                for server in home[job.id]:
                    waits.setdefault(server, []).append(job)
        rotating: Collection[int] = waits.keys()
        for after in self._after_round:
            rotating = yield from after(cluster, sorted(servers), waits)
            waits = {t: waits.get(t, []) for t in rotating}
        if rotating:
            s.timers.arm(s.next_round(cluster.now), TimerKind.SLICE, *sorted(rotating))

    def _place_waiting(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        """Algorithm 1 for the jobs not yet on a server, highest priority then oldest first."""
        waiting, admission, permit = self.s.waiting, self.admission, self._permit
        i = self._scan_start(cluster, cycle.arrived)
        if i is None:
            return
        # the first waiting job of each width is at its head
        widths = {cluster.jobs[j].num_gpus for j in waiting.first(i)} if i else set()
        changed = False
        admission.new_scan()
        scan_depth = self.config.placement.scan_depth
        while i < min(scan_depth, len(waiting)):
            job = cluster.jobs[waiting[i]]
            if permit and not all(may(job, cluster) for may in permit):
                i += 1
                continue
            head = job.num_gpus not in widths
            widths.add(job.num_gpus)
            placed, acted = yield from noting(self._place(cluster, job, cycle, first=head))
            changed = changed or placed or acted
            if placed:
                waiting.discard(job.id)
                admission.placed()
            else:
                i += 1
        self._stuck = not changed

    def _scan_start(self, cluster: Cluster, arrived: Job | None) -> int | None:
        """Where a scan of the waiting jobs starts (None: it need not). After a scan that was
        ``_stuck``, an ``arrived`` job's scan starts at it: the jobs before it would fail again
        as they just did, changing nothing. (A test replaces this with a full rescan.)"""
        if arrived is None or not self._stuck or self.admission.displaces:
            return 0
        self.scans_from_arrival += 1
        i = self.s.waiting.index(arrived.id)
        return i if i < self.config.placement.scan_depth else None

    def _place(self, cluster: Cluster, job: Job, cycle: Cycle, first: bool = False
               ) -> Decision[bool]:
        """Place one waiting job (``first``: the first of its width in the queue); whether
        it got a home."""
        s, book, now = self.s, self.s.book, cluster.now
        max_height = self.config.placement.max_height
        if job.num_gpus > cluster.max_free_bucket:
            may = s.may_go(job, cluster)
            gpus = allowed_on(cluster, gang_gpus(job, cluster), may)
            servers = None
            if gpus is None:
                servers = gang_servers(job, cluster, book, max_height, first, may) \
                    if self.config.placement.oversubscribe else None
                if servers is None and self.admission.displaces and first:
                    # no place under max_height: make room on servers by sending back jobs
                    # with more service, as a 1-server job displaces one
                    yield from self.admission.clear_for_gang(cluster, job)
                    gpus = allowed_on(cluster, gang_gpus(job, cluster), may)
                    if gpus is None:
                        servers = gang_servers(job, cluster, book, max_height, True, may)
            if gpus is None:
                if servers is None:
                    return False
                book.assign(job, servers)  # it starts at a round of one of them
                for server in servers:
                    s.timers.arm(s.next_round(now), TimerKind.SLICE, server)
                return True
            book.assign(job, tuple(sorted(cluster.servers_of(gpus))))
            yield s.start(job, gpus, now)
            if self.locality is not None:
                self.locality.placed(cluster, job)
            return True
        choose = self._placer.choose
        choice = choose(job, cluster, book, first)
        for make_room in self._make_room:
            if (yield from make_room(cluster, job, choice)):
                choice = choose(job, cluster, book, first)
        if choice is None:
            return False
        server, starts = choice
        book.assign(job, (server,))
        cycle.placed_on.add(server)
        if starts:
            yield s.start(job, gpus_on(cluster, server, job.num_gpus), now)
            if self.locality is not None:
                self.locality.placed(cluster, job)
        else:
            s.timers.arm(s.next_round(now), TimerKind.SLICE, server)
        return True

    def _queue(self, job: Job, now: float, rank: float = 0.0) -> None:
        """Queue ``job`` for a place: by priority, the mechanisms' ``order``, then ``rank``."""
        self.s.waiting.add(job, rank, sum(order(job, now) for order in self._orders),
                           self.s.tier(job), self.s.rank(job))



def build(name: str, options: list[str], spec: str | None = None) -> Gandiva:
    """The policy of preset ``name`` with a spec's ``options`` over it."""
    return Gandiva(parse(name, options), name=name, spec=spec)


def parameters(name: str) -> dict[str, object]:
    """The settings of preset ``name``, by dotted path."""
    return settings(parse(name, []))


POLICY = Gandiva
