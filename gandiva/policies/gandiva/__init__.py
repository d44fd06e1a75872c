"""``gandiva``: the Gandiva policy (Xiao et al., OSDI 2018), reactive and introspective.

Reactive: place arrivals by affinity, over-subscribing servers (Algorithm 1); on departures,
and when a server joins, start waiting jobs and lower the cluster's height by moving waiting
jobs onto the free GPUs.
Introspective, continuously: time-slice over-subscribed servers, pack under overload when the
profiles say it pays, migrate for locality, defragment, grow and shrink elastic jobs.

Each introspective step can be switched off to measure it alone, e.g. ``gandiva:-pack:-migrate``
(steps: ``pack``, ``migrate``, ``defrag``, ``elastic``, ``oversubscribe``).

Beyond the paper, by default (issue 17: the paper's round-robin lost to LAS by up to 1.6x in
mean JCT when jobs are wide): time slices ordered by attained-service level, a job never run
first, and a running job keeps its turn within its level, of which there are more than
Tiresias' two (``slice_order``, ``keep_turn_in_level``, ``level_step``); one slice order
across the servers that rotate (``balance``), and across every server with jobs,
time-slicing or not (``balance_all``); and, when no server has a place for
a newcomer, the place of the job with the most attained service (``las_admission``); a gang
takes only the GPUs it uses on its servers at its turn (``gang_shares``), a waiting job
takes its turn off a running gang's servers where it can (``spare_gangs``), a waiting gang
with no room at home takes GPUs a round leaves idle elsewhere (``idle_to_gangs``), and a
packed job takes GPUs left idle on another server (``spread_packed``). The paper's policy
is ``gandiva:slice_order=roundrobin:-balance:-las_admission:-gang_shares:-spread_packed``.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva import (
    admission,
    elastic,
    migration,
    packing,
    quiet,
    rounds,
    timeslice,
)
from gandiva.policies.gandiva.book import Book, Waiting
from gandiva.policies.gandiva.placement import choose_server, gang_gpus, gang_servers, gpus_on
from gandiva.state import Cluster, Job, JobStatus


@dataclass
class Gandiva:
    # the switches, one per mechanism
    oversubscribe: bool = True
    pack: bool = True
    migrate: bool = True
    defrag: bool = True
    elastic: bool = True
    # the paper's suspend/resume quantum
    quantum: float = 60.0
    # the order of time slices (timeslice.py): "roundrobin" (the paper: the job that had a GPU
    # least recently first), "las" (least attained service first), or "levels" (a job never
    # run first, for its early feedback, then attained-service levels, Tiresias' and more
    # beyond them (level_step), first come first served within one). Decision: "levels".
    # Round-robin shares the GPUs a quantum at a time among jobs that could run one after the
    # other, so they all end late, and that lost to LAS by up to 1.6x on the Pollux workloads
    # (benchmarks/results/policy-matrix-*.txt)
    slice_order: str = "levels"
    # ...and under "levels", a running job whose turn is over still goes before the jobs
    # waiting in its own level: it keeps its GPUs until it reaches the next level, or a job
    # never run or of a lower level needs them, instead of first come first served within a
    # level. Decision (2026-12-04): on. A newcomer's first turn (its early feedback) stopped
    # the running job of its level, which took its GPUs back at the next round: a suspend and
    # a resume more per newcomer than under LAS, which queues the newcomer behind it
    # (tiresias-60, long: 8-GPU gangs sliced out 21.5 min, none under LAS). Over the policy
    # matrix: at or below LAS in 77 of 88 cells, not 74; geometric mean 0.820 -> 0.807;
    # tiresias-60 (long) 1.012 -> 0.865; but pollux-realistic-8 (long) 1.005 -> 1.068 and
    # gavel-philly-2869ce 1.008 -> 1.036, allocation at least both others' in 43 cells, not
    # 47 (README, policy-matrix-gandiva_-idle_to_gangs-2026-12-04.txt)
    keep_turn_in_level: bool = True
    # ...and under "levels", beyond Tiresias' two levels (1 and 10 GPU-hours, the las
    # policy's), a level every time a job's attained service grows by this factor (1: none).
    # Decision (2026-12-04): sqrt(10), two levels a decade. With the last level at 10
    # GPU-hours, a job that reached it held its turn there to its end, ahead of every job that
    # came there before it: a 32-GPU gang ran its 718 min ahead of an older 16- and 8-GPU gang
    # (pollux-realistic-8, long queue: 1.068 of LAS's mean JCT); making that level first come
    # first served, as in Tiresias, lost elsewhere (pollux-realistic-7, long, 0.934 -> 1.012;
    # geometric mean 0.806 -> 0.819). More levels let a job hold its turn a while longer each
    # time, so the long jobs take turns at ever longer stretches, the multi-level feedback
    # queue's answer. Over the policy matrix: at or below LAS in 80 of 88 cells, not 78;
    # geometric mean of gandiva/LAS 0.806 -> 0.787; pollux-realistic-8 (long) 1.068 -> 1.051,
    # gavel-philly-2869ce 1.036 -> 1.004, pollux-realistic-1 (long) 1.024 -> 0.99,
    # alibaba-2023 (long) 0.73 -> 0.52. A step of 10 (Tiresias' own): 79 cells, 0.789,
    # pollux-realistic-1 (long) 1.034; of 3: 80 cells, 0.787, pollux-realistic-8 (long)
    # 1.077 (README, policy-matrix-gandiva_-spread_packed-2026-12-04.txt, the default then;
    # policy-matrix-gandiva_level_step=*-2026-12-04.txt)
    level_step: float = 10 ** 0.5
    # beyond the paper: one slice order across all servers rotating at a round, not one per
    # server, as LAS has one across the cluster: a waiting job moves to a server where it ranks
    # high enough to run (timeslice.rebalance). Without it a short job waits behind its own
    # server's jobs while another server runs a job of a lower level
    balance: bool = True
    # ...and that order spans every server with jobs, not only those time-slicing: a job
    # alone on its server yields it, at a round, to waiting jobs of lower attained-service
    # levels from crowded servers (they move there, timeslice.round_of), as under LAS.
    # Decision: on. Without it, affinity placement piles the narrow jobs onto the few servers
    # of their affinity while wide gangs hold the rest for hours: on gavel-philly-b436b2 at
    # the short-queue load the 1-GPU jobs spent 42 min time-sliced out (0.9 under LAS, 20 s
    # with it), and the policy lost to LAS by 7% there (1.07; with it 0.98). Over the policy
    # matrix: at or below LAS in 67 of 88 cells, not 63 (README, policy-matrix-*.txt)
    balance_all: bool = True
    # when every server is at max_height (no place for a newcomer), the newcomer takes the
    # place of the job of its width with the most attained service (Tiresias' idea,
    # cluster-wide), which goes back to the queue, ordered by attained service; a gang with no
    # place makes room likewise on the servers it needs (admission.make_room). Decision
    # (2026-12-04): on. The
    # places are few under a long queue, and ordering slices by level starves the jobs that
    # hold them, so they hold them longest and newcomers queue behind (gavel-philly-6c71a0,
    # long queue: first feedback 26,336 min). Giving the places back by attained service
    # fixes that at its cause: over the policy matrix, with queue_roundrobin off, the
    # geometric mean of gandiva/LAS goes 0.847 -> 0.835, no cell turns into a loss,
    # tiresias-60 long 1.14 -> 1.01, 6c71a0 long 0.55 -> 0.37 (first feedback 4,969 -> 12
    # min), philly long first feedback 43 -> 2.7 min; but gavel-philly-7f04ca and -ee9e8c
    # (long) 0.58 -> 0.77 and 0.59 -> 0.76, whose wide gangs wait longer for places (README,
    # policy-matrix-gandiva_las_admission_-queue_roundrobin-2026-12-04.txt)
    las_admission: bool = True
    # ...but only from a job that has had this many GPU-seconds more than the newcomer, so
    # that jobs of similar age do not evict each other back and forth
    displace_margin: float = 3600.0
    # a gang takes only the GPUs it uses on each server of its home at its turn, server by
    # server in home order, and narrower jobs have the rest (timeslice.gang_share); without,
    # it takes its servers whole, and only servers no job before it in the order took a GPU
    # of. The paper does not say how gangs time-slice. Decision (2026-12-04): on. Taking
    # servers whole idled 2 GPUs at every turn of a 6-GPU gang on two 4-GPU servers, and a
    # job ahead of a gang on one GPU of its servers cost it the turn: the Pollux workloads
    # (1-48 GPUs) were the cells still lost to LAS. With spare_gangs and admission.make_room
    # over the policy matrix: at or below LAS in 74 of 88 cells, not 67; geometric mean of
    # gandiva/LAS 0.835 -> 0.820; pollux-6, -3 and -1 (long) 1.07, 1.04, 1.04 -> 1.00, 0.98,
    # 0.97 (README, policy-matrix-gandiva_-keep_turn_in_level-2026-12-04.txt, the default
    # then; without spare_gangs 72 cells, 0.822)
    gang_shares: bool = True
    # a waiting 1-server job whose turn would fall on a server where a gang runs (stopping
    # the whole gang for it) takes it on the first server with room that is no gang's home,
    # if any (timeslice.rebalance, with balance). Decision (2026-12-04): on. Over the policy
    # matrix with gang_shares: at or below LAS in 74 of 88 cells, not 72; geometric mean
    # 0.822 -> 0.820; gavel-philly-e13805 1.00 -> 0.98, pollux-realistic-8 (long) 1.01 ->
    # 1.005; philly (long) 0.51 -> 0.55. Moving it to any server no running gang holds
    # instead: 72 cells, 0.817, e13805 1.03 (the moved jobs took waiting gangs' turns; README)
    spare_gangs: bool = True
    # a waiting gang with no room on its home servers at its turn takes GPUs the round
    # leaves idle on as many other servers as its home, if they have enough, and resumes
    # there from its checkpoint (timeslice.rebalance, with balance): LAS runs a gang on any
    # free GPUs, while a gang bound to its home waited with GPUs idle (pollux-1, long queue:
    # 75% allocated against LAS's 83%). Decision (2026-12-04): on. Over the policy matrix:
    # at or below LAS in 78 of 88 cells, not 77; geometric mean 0.807 -> 0.806; pollux-1
    # (long) 1.007 -> 0.950, pollux-realistic-6 (long) 0.92 -> 0.87; worse gavel-philly-ee9e8c
    # (long) 0.59 -> 0.66, pollux-6 (long) 0.94 -> 0.99. Taking room any later job in the
    # order had (as LAS does), or more servers than its home: 1.09 on pollux-6 (long) and
    # 1.11 on pollux-realistic-8 (long), philly (short) 0.62 -> 0.76 (spread gangs run
    # slower; README, policy-matrix-gandiva_level_step=1-2026-12-04.txt)
    idle_to_gangs: bool = True
    # round-robin slices while jobs wait for a place on a server, the earlier answer to the
    # starving of places' holders (6c71a0 long 31,095 -> 11,673 min, LAS 20,856). Decision
    # (2026-12-04): off, as las_admission answers it; round-robin cost the wide gangs their
    # turns whenever a newcomer waited (tiresias-60 long: 16.6 min with it, 14.7 without,
    # LAS 14.6)
    queue_roundrobin: bool = False
    # at most this many jobs' demand per GPU on an over-subscribed server: each job still
    # gets a 60 s slice every 8 minutes (early feedback), and the suspended jobs' state, kept
    # in host memory, stays well inside a server's RAM. At 3 the paper's 180-GPU experiment
    # queued jobs for ~37 min before their first mini-batches (benchmarks/paper/cluster180.py)
    max_height: float = 8.0
    # a packed pair must beat time-slicing's normalised throughput of 1.0 by this much;
    # profiles are noisy, and a pair that only ties is not worth its interference risk
    pack_min_gain: float = 0.05
    # packing is for overload only: GPUs still free a quantum after a departure, on a server
    # with jobs and none waiting, and no job waiting for a place, go to packed jobs of other
    # servers, which resume there from their checkpoints (packing.spread_elsewhere; on its
    # own server a packed job takes a free GPU at its rounds, packing.spread_out). Decision
    # (2026-12-04): on. Without it a pair packed under a burst stayed packed, each job at
    # part of its speed, while GPUs of other servers sat idle after the burst
    # (gavel-artifact_evaluation, short queue: eight jobs packed on one server for 22 min
    # while six GPUs elsewhere were idle; 1.058 of LAS's mean JCT). Over the policy matrix:
    # at or below LAS in 81 of 88 cells, not 80; geometric mean 0.787 -> 0.784;
    # artifact_evaluation (short) 1.058 -> 0.939, pollux-realistic-8 (long) 1.051 -> 1.033,
    # gavel-max_min_fairness (short) 0.957 -> 0.922; no cell worse by more than 0.005.
    # Moving at once instead: the Philly replay's mean JCT 231 -> 257 min (benchmarks/
    # fidelity.py; the newcomers of the next seconds found the freed GPUs taken: their wait
    # for a first turn 3.6 -> 16.7 min), against 232 with the quantum's wait (README,
    # policy-matrix-gandiva_-spread_packed-2026-12-04.txt)
    spread_packed: bool = True
    # what a packed pair must beat (packing.pays): "gain", the paper's, time-slicing's
    # throughput (the two normalised throughputs add up to more than 1 + pack_min_gain);
    # "jct", the mean JCT of running the two one after the other, the one with less
    # attained service first, with the cluster's queue per GPU behind them. Decision: "gain".
    # Over the 56 matrix cells where packing acts, "jct" won 47 against 46 (artifact_evaluation
    # short 1.06 -> 0.96) but lost philly long 0.50 -> 0.59 (README, policy-matrix-*jct*)
    pack_rule: str = "gain"
    # elastic jobs grow into GPUs idle this long: long enough that a burst of arrivals is not
    # met by a job that must shrink again at once
    grow_idle_s: float = 300.0
    # defragmentation runs this often while a job waits on fragmented GPUs
    defrag_interval: float = 300.0
    # "negligible loss": a move costing more than this (estimated from memory) is not made
    defrag_max_move_s: float = 10.0
    # locality migrations per decision, so one departure cannot trigger a migration storm
    max_moves: int = 4
    # waiting jobs examined per decision
    scan_depth: int = 256
    name: str = "gandiva"
    spec: str = "gandiva"
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if self.slice_order not in timeslice.ORDERS:
            raise ValueError(f"slice_order must be one of {', '.join(timeslice.ORDERS)}, "
                             f"not {self.slice_order!r}")
        if self.pack_rule not in packing.RULES:
            raise ValueError(f"pack_rule must be one of {', '.join(packing.RULES)}, "
                             f"not {self.pack_rule!r}")
        if self.quantum <= 0:
            raise ValueError("quantum must be positive (seconds)")
        if not (self.level_step == 1 or timeslice.LEAST_STEP <= self.level_step < math.inf):
            raise ValueError(f"level_step must be 1 (no levels beyond the las policy's) or "
                             f"from {timeslice.LEAST_STEP:.3f} (at most "
                             f"{timeslice.MORE_LEVELS} levels more) "
                             f"to a finite number (each level's limit over the one before), "
                             f"not {self.level_step}")
        self.levels = timeslice.slice_levels(self.level_step)  # (GPU-seconds)
        self.book: Book | None = None  # type: ignore[assignment]
        self.unassigned = Waiting()
        # timers by instant and kind, each with the servers armed then: a round arms one
        # (every server's next round falls on the same instant)
        self.timers: list[tuple[float, str]] = []
        self.armed_at: dict[tuple[float, str], set[int]] = {}  # (when, kind) -> servers
        self._armed: dict[tuple[str, int], float] = {}  # (kind, server) -> when
        self.planned: dict[int, A.Rounds] = {}  # server -> its planned rounds (rounds.py)
        self.ticking = False  # the event being decided is a tick
        self.unplannable: dict[tuple[int, ...], float] = {}  # group -> no plan tried till
        # servers at each round's planning step, by what kept their rounds from being
        # planned (rounds.unquiet), or "planned": where the simulator's time goes
        self.plan_stats: Counter[str] = Counter()
        self._wake = -1.0
        # bumped by whatever may change a round's outcome: quiet rounds (quiet.py) are put
        # off while it stays the same
        self.version = 0
        self.quiet: quiet.Quiet | None = None
        self.profiled: dict[str, tuple[float | None, float | None]] = {}  # quiet.news
        self._rounded: set[int] = set()  # the servers of this decision's round (quiet.declare)
        self.solo_mbt: dict[str, float] = {}
        self.packed_mbt: dict[str, float] = {}
        self.trials = packing.Trials()
        self.bad_pairs: set[frozenset[str]] = set()
        self.pack_gains: list[float] = []
        self.spread: dict[str, None] = {}
        self.elastic_jobs: dict[str, None] = {}
        self._placed_on: set[int] = set()
        self.packed_on: set[int] = set()  # servers packing packed on (``spread_packed``)
        # per width, the priority and service of the last job ``admission.displace`` found no
        # job to send back for, in this scan of the queue since its last placing
        self.no_victim: dict[int, tuple[int, float]] = {}
        self.idle_since: dict[int, float] = {}
        self.defrags = 0
        # The last scan of the waiting jobs placed none and made no action, and since then
        # only arrivals came (and profile samples that made no action): the state those jobs
        # failed in is unchanged, so an arrival's scan starts at the newcomer. Decision: off
        # with las_admission, whose displacing depends on attained service, i.e. on time.
        self._stuck = False

    # ---- timers -------------------------------------------------------------------------
    def timer(self, at: float, kind: str, *servers: int) -> None:
        """Arm ``kind`` at ``at`` on each of ``servers`` (none: the policy's own, -1) where it
        is not armed already. (A round arms a slice timer on every server it slices.)"""
        armed, bucket = self._armed, None
        for server in servers or (-1,):
            if (kind, server) in armed:
                continue
            armed[kind, server] = at
            if bucket is None:
                bucket = self.armed_at.get((at, kind))
                if bucket is None:
                    bucket = self.armed_at[at, kind] = set()
                    heapq.heappush(self.timers, (at, kind))
            bucket.add(server)

    def cancel(self, kind: str, server: int = -1) -> None:
        at = self._armed.pop((kind, server), None)
        if at is not None:  # (an instant left with no server is skipped when due)
            self.armed_at[at, kind].discard(server)

    def _due(self, now: float) -> list[tuple[str, int]]:
        """The timers due at ``now``, disarmed, by instant, kind and server."""
        due = []
        while self.timers and self.timers[0][0] <= now + 1e-9:
            at, kind = heapq.heappop(self.timers)
            for server in sorted(self.armed_at.pop((at, kind))):
                del self._armed[kind, server]
                due.append((kind, server))
        return due

    # ---- the decision -------------------------------------------------------------------
    def decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        # what may end a packing trial: a job stopping, and the policy's own actions
        if isinstance(event, E.Departure):
            self.trials.changed(event.job_id)
        elif isinstance(event, E.Failure):
            self.trials.changed_all()
        if isinstance(event, E.Tick) and self.quiet and self.quiet.until <= cluster.now + 1e-9:
            self.quiet = None  # the put-off round is due
        if isinstance(event, E.ProfileSample):
            self.version += quiet.news(self, cluster, event)
        elif not isinstance(event, E.Tick):
            self.version += 1
        before = self.version
        for action in self._decide(event, cluster):
            if not isinstance(action, A.Wake | A.Rounds | A.Thaw):
                self.trials.changed(action.job_id)
                self.version += 1
            yield action
        if self.quiet is not None and self.version != self.quiet.version:
            quiet.rouse(self, cluster)
            yield from self._wake_up()
        elif self._rounded and self.version == before:
            quiet.declare(self, cluster)
            yield from self._wake_up()

    def _decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        if self.book is None:
            self.book = Book.of(cluster)
        touched: set[int] = set()
        self.ticking = isinstance(event, E.Tick)
        self._rounded = set()
        if not isinstance(event, E.Arrival | E.ProfileSample):
            self._stuck = False
        arrived = None
        if isinstance(event, E.Arrival):
            job = arrived = cluster.jobs[event.job.id]
            self.unassigned.add(job)
            if job.spec.elastic:
                self.elastic_jobs[job.id] = None
        elif isinstance(event, E.Departure):
            job = cluster.jobs[event.job_id]
            touched.update(self.book.home.get(job.id, ()))
            self._forget(job)
        elif isinstance(event, E.Failure):
            self._recover(cluster, event.node)
        elif isinstance(event, E.Join):
            self.book.add_servers(cluster)
        elif isinstance(event, E.PriorityChange):
            job = cluster.jobs[event.job_id]
            yield from rounds.thaw(self, cluster, self.book.home.get(job.id, ()))
            if job.id in self.unassigned:
                self.unassigned.add(job, self._rank(job, cluster))
            for s in self.book.home.get(job.id, ()):  # at a tick of this instant: see below
                self.timer(cluster.now, "refill", s)
        elif isinstance(event, E.ProfileSample):
            packing.observe(self, cluster, event)
            if self.pack:
                for action in packing.judge(self, cluster):
                    self._stuck = False
                    yield action
            return
        elif isinstance(event, E.RoundsEnd):  # the state is the round in progress already
            rounds.ended(self, cluster, self.planned[event.servers[0]], event.round)
            yield from self._wake_up()
            return

        due = []
        if isinstance(event, E.Tick):
            due = self._due(cluster.now)
            self._wake = -1.0  # this tick was the one asked for: a timer due now needs another
            # Decision: a priority change reorders its servers at a tick of the same instant,
            # once every change of that instant is in: a controller changing several at once
            # (a sweep promoting its top trials) had each change carried out alone, so a job
            # resumed for one change was suspended for the next before it ran a mini-batch
            touched.update(server for kind, server in due if kind == "refill")
        slices = {server for kind, server in due if kind == "slice"}
        for s in list(slices):  # plans that end now: all their servers take the round
            if s in self.planned:
                slices.update(self.planned[s].servers)
        if slices:
            slices = timeslice.round_of(self, cluster, slices)
        yield from rounds.thaw(self, cluster, slices, due=True)
        if slices:
            yield from self._refill(cluster, slices, tick=True)
            self._rounded = slices  # (with their gangs' servers: rotate adds them)
        # (planned rounds are rounds too: see rounds.keep_lowering)
        if slices or self.planned and ("lower", -1) in due:
            if any(True for _ in cluster.nodes_with_free(cluster.max_free_bucket)):
                yield from self._lower_height(cluster)  # a gang whose turn ended may move
        if touched - slices:
            yield from self._refill(cluster, touched - slices, tick=False)
        touched |= slices
        if not isinstance(event, E.Tick):  # time slices move no job between servers
            yield from self._place_waiting(cluster, arrived)
        if isinstance(event, E.Departure | E.Join):  # GPUs became free, or new ones came
            yield from self._lower_height(cluster)
            # (packing.spread_elsewhere; a departure while one is armed waits with it: it
            # looks at every free GPU then, whichever departure freed it)
            if (self.spread_packed and self.packed_on and not self.unassigned
                    and cluster.free_count() and ("spread", -1) not in self._armed
                    and packing.still_packed(self, cluster)):
                self.timer(cluster.now + self.quantum, "spread")
            if self.migrate:
                yield from migration.consolidate(self, cluster)
        for kind, server in due:
            if kind == "grow" and self.elastic:
                yield from elastic.grow(self, cluster, server)
            elif kind == "spread" and self.packed_on and not self.unassigned:
                yield from packing.spread_elsewhere(self, cluster)
            elif kind == "defrag" and self.defrag:
                yield from migration.defragment(self, cluster)
                yield from self._place_waiting(cluster)
        if self.elastic and self.elastic_jobs:
            elastic.note_idle(self, cluster, touched | self._placed_on)
        self._placed_on.clear()
        if (self.defrag and self.unassigned and ("defrag", -1) not in self._armed
                and migration.fragmented_job(self, cluster)):
            self.timer(cluster.now + self.defrag_interval, "defrag")
        if self.planned:
            rounds.keep_lowering(self, cluster)
        yield from self._wake_up()

    def _wake_up(self) -> Iterator[A.Action]:
        """Ask for a tick at the first timer, if it is not asked for already."""
        while self.timers and not self.armed_at[self.timers[0]]:
            del self.armed_at[heapq.heappop(self.timers)]
        if self.timers and self.timers[0][0] != self._wake:
            self._wake = self.timers[0][0]
            yield A.Wake(self._wake)

    # ---- steps --------------------------------------------------------------------------
    def _forget(self, job: Job) -> None:
        self.book.release(job)
        self.unassigned.discard(job.id)  # a job cancelled before it had a server
        for d in (self.solo_mbt, self.packed_mbt, self.spread, self.elastic_jobs):
            d.pop(job.id, None)
        self.trials.end(job.id)
        self.book.last_start.pop(job.id, None)
        self.profiled.pop(job.id, None)

    def _refill(self, cluster: Cluster, servers: set[int], tick: bool) -> Iterator[A.Action]:
        """A round of time-slicing on ``servers`` (and packing where they stay over-subscribed)."""
        ready = timeslice.rebalance(self, cluster, servers) if tick and self.balance else None
        jobs = yield from timeslice.rotate(self, cluster, servers, tick, ready)
        # each server's waiting jobs, from the round's (spreading out and packing on a server
        # leave the others' as they are; a round looked at every server's members twice)
        home, running = self.book.home, JobStatus.RUNNING
        waits: dict[int, list[Job]] = {}
        for job in jobs:
            if job.status is not running:
                for s in home[job.id]:
                    waits.setdefault(s, []).append(job)
        slicing = set()
        for server in sorted(servers):
            waiting = server in waits  # spreading out leaves it so
            if self.pack:
                if cluster.free_gpus(server):  # (most servers of a round have none)
                    yield from packing.spread_out(self, cluster, server)
                guests = packing.guests(self, waits[server]) if waiting else None
                if guests:
                    _, packed = yield from _noting(packing.try_pack(self, cluster, server,
                                                                    guests))
                    waiting = not packed or self.book.has_waiting(server, cluster)
            if waiting:
                slicing.add(server)
        if tick and cluster.fast_rounds:  # plan the rounds of quiet groups ahead
            yield from rounds.plan_quiet(self, cluster, slicing)
        if slicing:
            self.timer(timeslice.next_round(self, cluster.now), "slice", *sorted(slicing))

    def _place_waiting(self, cluster: Cluster, arrived: Job | None = None
                       ) -> Iterator[A.Action]:
        """Algorithm 1 for the jobs not yet on a server, highest priority then oldest first.
        (After a scan that was ``_stuck``, an ``arrived`` job's scan starts at it: the jobs
        before it would fail again as they just did, changing nothing.)"""
        i = 0
        widths: set[int] = set()  # the first waiting job of each width is at its head
        if arrived is not None and self._stuck and not self.las_admission:
            i = self.unassigned.index(arrived.id)
            if i >= self.scan_depth:
                return
            widths = {cluster.jobs[j].num_gpus for j in self.unassigned.first(i)}
        changed = False
        self.no_victim = {}  # (``admission.displace``)
        while i < min(self.scan_depth, len(self.unassigned)):
            job = cluster.jobs[self.unassigned[i]]
            head = job.num_gpus not in widths
            widths.add(job.num_gpus)
            placed, acted = yield from _noting(self._place(cluster, job, first=head))
            changed = changed or placed or acted
            if placed:
                self.unassigned.discard(job.id)
                self.no_victim.clear()
            else:
                i += 1
        self._stuck = not changed

    def _grown(self, cluster: Cluster) -> bool:
        """Does any elastic job run wider than it asked (so that it could shrink)?"""
        return any(len(cluster.jobs[j].gpus) > cluster.jobs[j].num_gpus for j in self.elastic_jobs)

    def _rank(self, job: Job, cluster: Cluster) -> float:
        return job.attained_at(cluster.now) if self.las_admission else 0.0

    def _place(self, cluster: Cluster, job: Job, first: bool = False):  # -> Generator[..., bool]
        if job.num_gpus > cluster.max_free_bucket:
            gpus = yield from self._gang_gpus(job, cluster)
            if gpus is None:
                servers = gang_servers(job, cluster, self.book, self.max_height,
                                       head=first) if self.oversubscribe else None
                if servers is None and self.las_admission and first:
                    # no place under max_height: make room on servers by sending back jobs
                    # with more service, as a 1-server job displaces one (``admission``)
                    yield from admission.make_room(self, cluster, job)
                    gpus = yield from self._gang_gpus(job, cluster)
                    if gpus is None:
                        servers = gang_servers(job, cluster, self.book, self.max_height,
                                               head=True)
            if gpus is None:
                if servers is None:
                    return False
                yield from rounds.thaw(self, cluster, servers)
                self.book.assign(job, servers)  # it starts at a round of one of them
                for s in servers:
                    self.timer(timeslice.next_round(self, cluster.now), "slice", s)
                return True
            self.book.assign(job, tuple(sorted(cluster.servers_of(gpus))))
            yield self._start(job, gpus, cluster.now)
            if migration.is_spread(cluster, job.num_gpus, job.gpus):
                self.spread[job.id] = None
            return True
        choice = choose_server(job, cluster, self.book, self.max_height, self.oversubscribe,
                               head=first)
        if (choice is None or not choice[1]) and self.elastic and self._grown(cluster):
            # shrink at once when new work needs the GPUs, before time-slicing anyone
            shrunk = list(elastic.shrink_for(self, cluster, job))
            yield from shrunk
            if shrunk:
                choice = choose_server(job, cluster, self.book, self.max_height,
                                       self.oversubscribe, head=first)
        if choice is None and self.las_admission:
            if (yield from admission.displace(self, cluster, job)):
                choice = choose_server(job, cluster, self.book, self.max_height,
                                       self.oversubscribe, head=first)
        if choice is None:
            return False
        server, starts = choice
        yield from rounds.thaw(self, cluster, (server,))
        self.book.assign(job, (server,))
        self._placed_on.add(server)
        if starts:
            yield self._start(job, gpus_on(cluster, server, job.num_gpus), cluster.now)
            if migration.is_spread(cluster, job.num_gpus, job.gpus):
                self.spread[job.id] = None
        else:
            self.timer(timeslice.next_round(self, cluster.now), "slice", server)
        return True

    def _start(self, job: Job, gpus: tuple[int, ...], now: float) -> A.Action:
        self.book.last_start[job.id] = now
        if job.status is JobStatus.SUSPENDED:
            return A.Resume(job.id, gpus)
        return A.Place(job.id, gpus)

    def _lower_height(self, cluster: Cluster) -> Iterator[A.Action]:
        """Move waiting jobs from the highest servers onto free GPUs of servers with no queue."""
        book = self.book
        if not cluster.free_count():
            return  # no free GPU anywhere: nothing can move (and 1,000 servers go unsorted)
        # gang widths that found no consolidated GPUs: this step only takes GPUs, and the
        # fewest servers that hold a width never drop as free GPUs go, so they find none again
        # (a busy stretch of Philly asked 700,000 times for 8-GPU gangs' GPUs)
        no_room: set[int] = set()
        for src in book.crowded():
            if src in self.planned and rounds.unseen(self, cluster, src):
                yield from rounds.thaw(self, cluster, (src,))
            for job in sorted(book.waiting(src, cluster), key=lambda j: j.seq):
                if timeslice.is_gang(self, job):
                    # a time-sliced gang moves to whole free servers as soon as there are some
                    if job.num_gpus in no_room:
                        continue
                    if not migration.may_consolidate(cluster, job.num_gpus):
                        no_room.add(job.num_gpus)
                        continue
                    gpus = yield from self._gang_gpus(job, cluster)
                    if gpus is None or migration.is_spread(cluster, job.num_gpus, gpus):
                        no_room.add(job.num_gpus)
                        continue
                    book.assign(job, tuple(sorted(cluster.servers_of(gpus))))
                    yield self._start(job, gpus, cluster.now)
                    continue
                dest = timeslice.free_elsewhere(self, cluster, src, job.num_gpus)
                if dest is None:
                    return
                book.assign(job, (dest,))
                yield self._start(job, gpus_on(cluster, dest, job.num_gpus), cluster.now)

    def _gang_gpus(self, job: Job, cluster: Cluster):  # -> Generator[..., gpus | None]
        """``gang_gpus``, chosen again where they are on planned servers (rounds.thaw_gpus)."""
        gpus = gang_gpus(job, cluster)
        if gpus is not None and (yield from self.thaw_gpus(cluster, gpus)):
            gpus = gang_gpus(job, cluster)
        return gpus

    def thaw_gpus(self, cluster: Cluster, gpus: tuple[int, ...]):  # -> Generator[.., bool]
        if not self.planned:
            return False
        return (yield from rounds.thaw_gpus(self, cluster, gpus))

    def _recover(self, cluster: Cluster, node: int) -> None:
        """Jobs of a failed server go back to placement (from their last checkpoint)."""
        for jid in list(self.book.members[node]):
            job = cluster.jobs[jid]
            self.book.release(job)
            self.spread.pop(jid, None)
            self.unassigned.add(job, self._rank(job, cluster))


POLICY = Gandiva


def _noting(actions):  # -> Generator[Action, None, tuple[result, bool]]
    """Pass on what ``actions`` yields; return its result and whether it yielded any."""
    acted = False
    while True:
        try:
            action = next(actions)
        except StopIteration as end:
            return end.value, acted
        acted = True
        yield action
