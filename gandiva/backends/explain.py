"""Why is my job pending? The cluster view and a job's explanation, read from a snapshot.

The loop owns the cluster state; the API's threads must neither see it half-changed nor wait
for the loop. So the loop takes a ``Snapshot`` now and then (``Seen.take``), swapped in whole,
and every reader works from the latest one. Taking one reads again only what changed since
the last: the jobs that events and actions touched (``Seen.touch``), and the devices whose
jobs changed (``Seen.track``); the table of jobs is copied only when it changed, else the
last snapshot's is kept, and the policy's homes and heights come as a read-only copy that the
policy makes again only when they changed (``Placements``). At 20,000 jobs, copying them all
five times a second was a fifth of the server's time (``benchmarks/scale.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import Any, Protocol

from gandiva.policies import AssignsServers, TimeSlices
from gandiva.spec import TERMINAL, JobState
from gandiva.state import Cluster, JobStatus

QUEUE_SHOWN = 100  # the head of the queue in the cluster view (its length comes beside it)
WAITING = (JobStatus.SUSPENDED, JobStatus.QUEUED)  # while a job waits on the servers it belongs to


class Placement(Protocol):
    """A read-only copy of where a policy's jobs belong (``gandiva.policies.gandiva.book``)."""

    @property
    def changes(self) -> int: ...  # the policy's count of changes when it was copied
    @property
    def home(self) -> Mapping[str, tuple[int, ...]]: ...  # job -> the servers it belongs to
    @property
    def height(self) -> Sequence[float]: ...  # server -> its height


class Placements(Protocol):
    """What a policy that assigns jobs to servers shows its readers (the gandiva policy's
    ``Book``): copies, and which jobs moved, never the book itself."""

    def placement(self, last: Placement | None = None) -> Placement:
        """Where jobs belong now (``last`` itself if nothing changed since it)."""

    def moved_since(self, changes: int) -> Iterable[str] | None:
        """Jobs whose home changed after ``changes`` (None: look at every job)."""


def placements(policy: object) -> object | None:
    """The policy's placements, if it assigns jobs to servers (None: it does not)."""
    return policy.placements() if isinstance(policy, AssignsServers) else None


def quantum(policy: object) -> float | None:
    """The policy's time slice in seconds, if it time-slices."""
    return policy.quantum if isinstance(policy, TimeSlices) else None


def gang_wait(policy: object) -> float | None:
    """After how long a waiting gang reserves its servers, under fair shares (else None)."""
    return getattr(getattr(policy, "fair", None), "gang_wait", None)


@dataclass(frozen=True)
class Copy:
    changes: int
    home: Mapping[str, tuple[int, ...]]
    height: tuple[float, ...]


@dataclass
class Copied:
    """``Placements`` of a book that offers only ``changes``, ``home`` and ``height(server)``
    (read, never written): copied when it changed, every job looked at again."""

    book: Any
    servers: Callable[[], int]

    def placement(self, last: Placement | None = None) -> Placement:
        b = self.book
        if last is not None and last.changes == b.changes:
            return last
        return Copy(b.changes, MappingProxyType(dict(b.home)),
                    tuple(b.height(s) for s in range(self.servers())))

    def moved_since(self, changes: int) -> None:
        return None


@dataclass(frozen=True)
class Snapshot:
    free: int
    devices: int
    queue: list[tuple[float, int, str]]  # (submit time, seq, job): the queue, sorted
    jobs: dict[str, tuple[str, tuple[int, ...], int, int]]  # job -> (status, gpus, want, prio)
    transitions: dict[str, str]
    on: list[list[str]]  # device -> its jobs (lists are replaced, never changed)
    home: Mapping[str, tuple[int, ...]]  # job -> the servers it belongs to (the policy's)
    height: Sequence[float]  # server -> its height
    # server -> the jobs that belong to it and wait there (suspended for their turn, or
    # admitted and queued), sorted; a server's tuple is replaced when it changes, never changed
    waits: list[tuple[str, ...]]


@dataclass
class Seen:
    """What the readers of one loop see: the latest snapshot, and the cluster view of it."""

    cluster: Cluster
    policy: object
    names: list[str]  # device names
    snapshot: Snapshot = field(init=False)
    _jobs: dict[str, tuple] = field(default_factory=dict)  # each unfinished job, as of it
    _changed: set[str] | None = None  # jobs changed since it (None: any might have)
    _on: list[list[str]] = field(default_factory=list)
    _view: tuple[Snapshot, dict] | None = None  # (the snapshot, the view built of it)
    # node -> (what it was built of, its part of the view, the device lists it used)
    _nodes: dict[int, tuple[tuple, dict, list, tuple]] = field(default_factory=dict)
    _read: Placements | None = None  # the policy's placements this has read
    _copied: Copied | None = None  # (where those are a plain book's)
    _placed: Placement | None = None  # ... as of the last snapshot
    # who waits on each server, kept up to date from the jobs touched and the jobs the policy
    # moved (``Placements.moved_since``), so that no one looks at every job for it: at 20,000
    # jobs that look was half of building the cluster view, at every snapshot a reader asked
    _waits: list[tuple[str, ...]] = field(default_factory=list)  # as in ``Snapshot.waits``
    _wait_sets: list[set[str]] = field(default_factory=list)  # the same, as sets
    _waiting: dict[str, tuple[int, ...]] = field(default_factory=dict)  # job -> those servers

    def __post_init__(self) -> None:
        self._on = [[] for _ in self.cluster.gpus]
        self.take()  # the empty cluster: readers always have a snapshot

    # ---- the loop's side ----------------------------------------------------------------
    def touch(self, job_id: str | None) -> None:
        """The job changed (None: many jobs may have: a node failed or joined)."""
        if job_id is None:
            self._changed = None
        elif self._changed is not None:
            self._changed.add(job_id)

    def track(self, devices: Iterable[int]) -> None:
        """The jobs on ``devices`` changed."""
        gpus = self.cluster.gpus
        if len(self._on) < len(gpus):  # a node joined
            self._on.extend([] for _ in range(len(gpus) - len(self._on)))
        for g in devices:
            self._on[g] = sorted(gpus[g].jobs)  # a new list: snapshots keep the old one

    def take(self) -> None:
        c, read = self.cluster, self._placements()
        last = getattr(self, "snapshot", None)
        jobs, changed = self._jobs, self._changed
        touched = changed
        fresh = changed is None or bool(changed)  # the jobs' copy is made again
        if changed is None:
            jobs.clear()
            changed = c.jobs.keys()
        for jid in changed:
            j = c.jobs.get(jid)
            if j is None or j.status in (JobStatus.DONE, JobStatus.KILLED):
                jobs.pop(jid, None)
            else:
                jobs[jid] = (j.status.value, j.gpus, j.num_gpus, j.priority)
        self._changed = set()
        # what did not change is the last snapshot's (readers never change a snapshot)
        seen_jobs = dict(jobs) if fresh or last is None else last.jobs
        before = self._placed if read is self._read else None  # (None: read all again)
        placed = None if read is None else read.placement(before)
        home, height = (placed.home, placed.height) if placed is not None else ({}, ())
        waits = (list(self._waits) if self._wait(read, placed, before, touched)
                 or last is None else last.waits)
        self._read, self._placed = read, placed
        self.snapshot = Snapshot(
            free=c.free_count(), devices=len(c.gpus), queue=list(c.queue), jobs=seen_jobs,
            transitions=dict(c.transitions), on=list(self._on), home=home, height=height,
            waits=waits)

    def _placements(self) -> Placements | None:
        read = placements(self.policy)
        if read is None or hasattr(read, "placement"):
            return read  # type: ignore[return-value]
        if self._copied is None or self._copied.book is not read:
            self._copied = Copied(read, lambda: len(self.cluster.nodes))
        return self._copied

    def _wait(self, read: Placements | None, placed: Placement | None,
              before: Placement | None, touched: Iterable[str] | None) -> bool:
        """Bring who waits on each server up to date for the jobs ``touched`` and those the
        policy moved since ``before`` (None: for every job); whether any server's list
        changed."""
        if read is None or placed is None:
            return False
        sets, waits = self._wait_sets, self._waits
        while len(sets) < len(self.cluster.nodes):  # a node joined
            sets.append(set())
            waits.append(())
        # (asked at the first look too: the policy keeps its moves from then on)
        moved = read.moved_since((before or placed).changes)
        home = placed.home
        if before is None or moved is None or touched is None:  # look at every job
            touched, moved = set(self._waiting) | home.keys(), ()
        dirty: set[int] = set()
        for jid in chain(touched, moved):
            was = self._waiting.pop(jid, ())
            now = home.get(jid, ()) if self._jobs.get(jid, ("",))[0] in WAITING else ()
            if now:
                self._waiting[jid] = now
            if was != now:
                for server in was:
                    sets[server].discard(jid)
                for server in now:
                    sets[server].add(jid)
                dirty.update(was, now)
        for server in dirty:
            waits[server] = tuple(sorted(sets[server]))
        return bool(dirty)

    # ---- the readers' side (any thread) ---------------------------------------------------
    def view(self) -> dict:
        """Who is on which device, and who waits its turn where: built once per snapshot, by
        the first reader (callers must not change it). A node that did not change since the
        last view is the same object in this one, so a reader can keep what it made of it."""
        seen = self.snapshot
        built = self._view
        if built is not None and built[0] is seen:
            return built[1]
        nodes, kept, waits = [], self._nodes, seen.waits
        for node in self.cluster.nodes:
            # a device's list of jobs, and a server's tuple of waiting jobs, are replaced
            # when they change (``track``, ``_wait``): a node whose lists, waiting jobs and
            # state are the same objects as last time is the same (the hit keeps them alive,
            # so their ids are not reused)
            lists = [seen.on[g] if g < len(seen.on) else [] for g in node.gpus]
            sliced = waits[node.id] if node.id < len(waits) else ()
            key = (node.up, id(sliced), *map(id, lists))
            hit = kept.get(node.id)
            if hit is None or hit[0] != key:
                devices = [{"id": g, "name": self.names[g], "jobs": jobs}
                           for g, jobs in zip(node.gpus, lists, strict=True)]
                # suspended for their turn, or admitted to the server and waiting for one
                hit = kept[node.id] = (key, {"id": node.id, "up": node.up,
                                             "devices": devices, "time_sliced": list(sliced)},
                                       lists, sliced)
            nodes.append(hit[1])
        up = sum(node.size for node in self.cluster.nodes if node.up)
        view = {"policy": self.policy.name, "total": up, "free": seen.free,
                "queue": [jid for _, _, jid in seen.queue[:QUEUE_SHOWN]],
                "queue_length": len(seen.queue), "nodes": nodes}
        self._view = (seen, view)
        return view

    def position(self, job_id: str) -> int | None:
        """The job's place in the snapshot's queue (1: next), or None."""
        job = self.cluster.jobs.get(job_id)  # (submit time, seq) never change
        queue = self.snapshot.queue
        if job is None:
            return None
        key = (job.spec.submit_time, job.seq, job.id)
        i = bisect.bisect_left(queue, key)
        return i + 1 if i < len(queue) and queue[i] == key else None

    def explain(self, job_id: str, state: JobState, reason: str,
                devices: tuple[int, ...], shown: Callable[[str], str] = str) -> dict:
        """The job's state, and why it is not running, in words. ``state``, ``reason`` and
        ``devices`` are the loop's latest (its record); the snapshot adds details at most a
        snapshot old (who shares a device, the queue). ``shown``: how another job is named
        to whoever asks (a server names no other user's job)."""
        out = {"state": state, "reason": "", "queue_position": None, "needs": None,
               "share": None}
        if state in TERMINAL:
            out["reason"] = reason or f"the job is {state}"
            return out
        if state == JobState.HELD:
            out["reason"] = "held by its user: resume it to give it back to the scheduler"
            return out
        seen = self.snapshot
        slice_s = quantum(self.policy)
        home = seen.home.get(job_id)
        moving = seen.transitions.get(job_id)
        if moving is not None:
            out["transition"] = moving  # decided; its node has not confirmed it yet
        if state == JobState.RUNNING:
            partners = sorted({shown(j) for g in devices if g < len(seen.on)
                               for j in seen.on[g] if j != job_id})
            out["reason"] = (f"running on device(s) {', '.join(map(str, devices))}"
                             + (f", packed with {', '.join(partners)}" if partners else ""))
        elif state == JobState.SUSPENDED or (home is not None and slice_s):
            rounds = f", in rounds of {slice_s:g} s" if slice_s else ""
            out["reason"] = (f"time-sliced: its server is over-subscribed (height "
                             f"{max(seen.height[s] for s in home):.1f}); it runs at its "
                             f"turn{rounds}" if home else "suspended: it waits for its turn")
            if home and len(home) > 1 and (wait := gang_wait(self.policy)) is not None:
                out["reason"] += (f"; a gang across {len(home)} servers: after {wait:g} s of "
                                  "waiting it reserves them and runs at the next round")
        elif job_id not in seen.jobs:
            out["reason"] = "submitted; the scheduler has not taken it up yet"
        else:
            _, _, want, _ = seen.jobs[job_id]
            out["queue_position"] = self.position(job_id)
            out["needs"] = f"{want} free device(s)"
            out["reason"] = (f"waiting for {want} free device(s); {seen.free} of "
                             f"{seen.devices} free now"
                             + (f"; {out['queue_position']} in line"
                                if out["queue_position"] else ""))
        out["share"] = self.share(job_id)
        return out

    def share(self, job_id: str) -> str | None:
        """Where the job's team stands against its quota (None where no team has one)."""
        shares = self.cluster.shares
        job = self.cluster.jobs.get(job_id)
        if not shares.quotas or job is None:
            return None
        team = shares.of(job.spec.user)[0]
        quota = shares.quotas.get(team, 0)
        held = 0.0
        for jobs in self.snapshot.on:
            for j in jobs:
                other = self.cluster.jobs.get(j)
                if other is not None and shares.of(other.spec.user)[0] == team:
                    held += 1 / len(jobs)
        name = team if team in shares.teams else "you, in no team"
        if held > quota + 1e-9:
            said = (f"your team ({name}) is over its quota: {held:g} of {quota} GPUs, "
                    f"borrowed; taken back first when a team under its quota needs them")
        elif quota:
            said = (f"your team ({name}) holds {held:g} of its {quota} guaranteed GPUs: a "
                    "job of it within the quota takes a borrowed GPU back at the next round")
        else:
            said = (f"your team ({name}) has no quota: it runs on idle GPUs, borrowed, taken "
                    "back first when a team under its quota needs them")
        if not job.spec.checkpoints:
            said += ("; this job cannot checkpoint (checkpoints: false): it runs only within "
                     "its team's quota, never on borrowed GPUs")
        return said
