"""What the scheduler's loop reports, stored by a thread of its own.

The loop never waits for the database: what it reports (jobs' transitions, metric points, a
sweep's decisions) is kept in a ``Journal`` and handed, at each of the loop's flushes, to the
``Writer`` as one batch. The writer stores batches in the order they came, several queued ones
in one transaction. A write the database cannot take now (it is down, restarting, locked by
another writer) is tried again after a back-off that doubles up to ``RETRY_MAX_S``, for as
long as it takes: nothing queued is dropped, and a database that comes back gets every
queued write in order. A batch the database refuses for what it holds (a row it can never
take) is tried alone, then dropped with an error in the log, so that it cannot stop the rest.

How far behind the writer is shows in ``/metrics`` (``gandiva_store_writes_queued``,
``gandiva_store_behind_seconds``, ``gandiva_store_write_retries_total``) and in ``/readyz``
(``healthy``). Stopping, a server flushes what is queued (``close``), for at most the time it
is given; a process that exits without closing gets ``EXIT_FLUSH_S`` (at exit).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from gandiva.backends.driver import JobRecord
from gandiva.server.store import JobChange, Store, TrialDecision
from gandiva.spec import JobState

log = logging.getLogger("gandiva.server")
RETRY_FIRST_S = 0.1  # the first retry of a write the database could not take
RETRY_MAX_S = 5.0  # back-off doubles up to this: a database that is back is found soon
MERGED_MAX = 5000  # writes in one transaction when batches queued up (a database was away)
STALL_S = 10.0  # the oldest queued write older than this: the writer is not healthy
EXIT_FLUSH_S = 10.0  # what a process that exits without closing its writer gives it
# what happened to a job -> the state it leaves the job in (the rest leave it as it was)
LEAVES_IN = {**{s.value: s for s in JobState}, "released": JobState.QUEUED,
             "node-lost": JobState.QUEUED}


def change_of(rec: JobRecord, what: str) -> JobChange:
    """What the loop reported of a job, as it is stored: the event and the state it leaves."""
    state = LEAVES_IN.get(what)
    data: dict[str, Any] = {"steps": rec.steps, "restarts": rec.restarts}
    if what in ("running", "migrated", "resized"):
        data["devices"] = list(rec.devices)
    if what in ("profile", "feedback", "done"):
        data.update(rec.profile, metrics=dict(rec.metrics))
    if what == "checkpoint-refused":  # on the event only: the job's own state and reason stay
        data["reason"] = rec.refused
    # why, on the event: a later end overwrites the job's
    if what in ("restarted", "node-lost", "out-of-memory"):
        data["reason"] = rec.reason
    reason = rec.reason if what in ("failed", "restarted", "cancelled") else None
    if what == "done" and rec.reason:  # (ranks killed at its end: said, and counted)
        reason = rec.reason
    return JobChange(rec.spec.id, what, data, state, reason)


@dataclass
class Batch:
    """Writes handed over together; ``points`` are emptied once stored (they are stored
    apart from the rest)."""

    changes: list[JobChange] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[TrialDecision] = field(default_factory=list)
    at: float = field(default_factory=time.monotonic)

    def size(self) -> int:
        return len(self.changes) + len(self.points) + len(self.decisions)


def transient(e: SQLAlchemyError) -> bool:
    """Is this the database's state (down, restarting, locked, read-only for now), so that
    the same write may be taken later?"""
    return isinstance(e, OperationalError | InterfaceError) or (
        isinstance(e, DBAPIError) and e.connection_invalidated)


class Writer:
    """The one thread that stores what the loop reports; see the module's docstring."""

    def __init__(self, store: Store, retry_first_s: float = RETRY_FIRST_S,
                 retry_max_s: float = RETRY_MAX_S) -> None:
        self.store = store
        self.retry_first_s, self.retry_max_s = retry_first_s, retry_max_s
        self._batches: deque[Batch] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._failing = False  # the latest try failed
        self._stopping = False
        self._moves = 0  # batches handed over, stored, or tried and failed
        self.retries = 0  # tries that failed and were made again
        self.dropped = 0  # writes refused for what they hold, or left at a close
        _open.add(self)

    # ---- the loop's side: never waits ----------------------------------------------------
    def put(self, batch: Batch) -> None:
        if not batch.size():
            return
        with self._cond:
            if self._stopping:
                self.dropped += batch.size()
                log.error("store writer closed: %d writes not stored", batch.size())
                return
            self._batches.append(batch)
            self._moves += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gandiva-store-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    # ---- how far behind ------------------------------------------------------------------
    def queued(self) -> int:
        """Writes handed over and not yet stored."""
        with self._cond:
            return sum(b.size() for b in self._batches)

    def behind_s(self) -> float:
        """How long the oldest write not yet stored has waited."""
        with self._cond:
            return time.monotonic() - self._batches[0].at if self._batches else 0.0

    def healthy(self) -> bool:
        """The latest try succeeded and nothing has waited ``STALL_S``."""
        return not self._failing and self.behind_s() < STALL_S

    def wait(self, until: Callable[[], bool], timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until ``until()`` holds, looking again whenever a
        batch is handed over or stored, or a try fails (``until`` runs without the writer's
        lock: it may read the store, or ask the API)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._moves
            if until():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not self._moved(seen, left):
                return until()

    def _moved(self, seen: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._moves != seen, timeout)

    def flush(self, timeout: float) -> bool:
        """Wait until every write handed over is stored (at most ``timeout`` s)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._batches, timeout)

    def close(self, timeout: float) -> bool:
        """Store what is queued (waiting at most ``timeout`` s), then stop; what is left is
        logged as lost (a try under way may still land). True if nothing was left."""
        flushed = self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)  # a try under way may hang on an unreachable database
        with self._cond:
            left = sum(b.size() for b in self._batches)
            self._batches.clear()
            self.dropped += left
        if left:
            log.error("store writer closed with %d writes not stored: the database did not "
                      "take them in %g s", left, timeout)
        _open.discard(self)
        return flushed

    # ---- the writer's thread -------------------------------------------------------------
    def _run(self) -> None:
        tries = 0
        one_at_a_time = False  # after a refused merge, to find the batch at fault
        while True:
            with self._cond:
                if tries:  # back off, unless the writer is closed meanwhile
                    self._cond.wait_for(lambda: self._stopping,
                                        min(self.retry_first_s * 2 ** (tries - 1),
                                            self.retry_max_s))
                self._cond.wait_for(lambda: self._batches or self._stopping)
                if self._stopping:
                    return
                taken = self._take(1 if one_at_a_time else MERGED_MAX)
            try:
                self._land(taken)
            except SQLAlchemyError as e:
                if transient(e):
                    tries += 1
                    self.retries += 1
                    log.warning("cannot store %d writes (%s); trying again",
                                sum(b.size() for b in taken), e.__class__.__name__)
                elif len(taken) > 1:
                    one_at_a_time = True
                else:
                    self._done(taken, dropped=True)
                    log.error("dropped %d writes the database refused: %s", taken[0].size(), e)
                with self._cond:
                    self._failing = transient(e)
                    self._moves += 1
                    self._cond.notify_all()
                continue
            tries, one_at_a_time = 0, False
            self._done(taken)

    def _take(self, most: int) -> list[Batch]:
        """The oldest batches, as many as make ``most`` writes (at least one)."""
        taken: list[Batch] = []
        n = 0
        for batch in self._batches:
            if taken and n + batch.size() > most:
                break
            taken.append(batch)
            n += batch.size()
        return taken

    def _land(self, taken: list[Batch]) -> None:
        points = [p for b in taken for p in b.points]
        if points:
            self.store.add_points(points)
            for b in taken:
                b.points = []  # stored: not again if the rest must be tried again
        changes = [c for b in taken for c in b.changes]
        decisions = [d for b in taken for d in b.decisions]
        if changes or decisions:
            for why in self.store.record_many(changes, decisions):  # e.g. a job that ended
                log.warning("not stored: %s", why)  # as it was cancelled

    def _done(self, taken: list[Batch], dropped: bool = False) -> None:
        with self._cond:
            for batch in taken:
                if not self._batches or self._batches[0] is not batch:
                    break  # a close gave up on it meanwhile
                self._batches.popleft()
                if dropped:
                    self.dropped += batch.size()
            self._failing = False
            self._moves += 1
            self._cond.notify_all()

    # ---- a Prometheus collector ----------------------------------------------------------
    def describe(self) -> list:
        return []  # computed at each scrape

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("gandiva_store_writes_queued", "Writes of the scheduler's "
                                "loop (job changes, metric points, sweep decisions) not yet "
                                "stored", value=self.queued())
        yield GaugeMetricFamily("gandiva_store_behind_seconds", "How long the oldest write "
                                "not yet stored has waited", value=self.behind_s())
        yield CounterMetricFamily("gandiva_store_write_retries", "Tries to store that failed "
                                  "for the database's state and were made again",
                                  value=self.retries)
        yield CounterMetricFamily("gandiva_store_writes_dropped", "Writes the database "
                                  "refused for what they hold, or left at a close",
                                  value=self.dropped)


class Journal:
    """What the loop reports, in order, until its flush hands it to the writer in one
    batch. Safe from any thread (a restarted server's sweeps report before the loop runs)."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self._batch = Batch()
        self._lock = threading.Lock()

    def change(self, change: JobChange) -> None:
        with self._lock:
            self._batch.changes.append(change)

    def points(self, points: list[dict[str, Any]]) -> None:
        with self._lock:
            self._batch.points.extend(points)

    def decided(self, decision: TrialDecision) -> None:
        with self._lock:
            self._batch.decisions.append(decision)

    def hand_over(self) -> None:
        """(The loop's ``on_flush``.) Queue everything reported since the last hand-over."""
        with self._lock:
            batch, self._batch = self._batch, Batch()
            self.writer.put(batch)  # under the lock: batches are queued in the order made


_open: weakref.WeakSet[Writer] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """Daemon threads still run while atexit handlers do: give each writer its time."""
    for writer in list(_open):
        writer.close(EXIT_FLUSH_S)
