"""The store and the scheduler's loop, joined: what the API calls.

``Service`` composes the parts, each with one job: ``Confinement`` (where a user's jobs may
run), ``Submissions`` (checks, limits, submission ids), ``Views`` (what readers see),
``Sweeps`` (a sweep's decisions on its trials) and the ``Writer`` (what the loop reports,
stored on a thread of its own: the loop never waits for the database). What users ask of a
job (cancel, hold, release, a priority) is stored before the loop is told.
"""

import math
import time
from pathlib import Path

from fastapi import HTTPException

from gandiva.backends.driver import Driver, JobRecord
from gandiva.server.confinement import Confinement
from gandiva.server.jobspec import JobRequest
from gandiva.server.metrics import Metrics
from gandiva.server.persistence import Journal, Writer, change_of
from gandiva.server.store import (
    STEP_MAX,
    JobChange,
    JobRow,
    Principal,
    Store,
    SweepRow,
    TrialDecision,
)
from gandiva.server.submissions import (
    MAX_UNFINISHED_PER_USER,
    Accepted,
    Submissions,
    to_scheduler,
)
from gandiva.server.sweeps import Sweeps
from gandiva.server.tenancy import Tenancy
from gandiva.server.views import JobView, Views
from gandiva.shares import CEILING
from gandiva.spec import TERMINAL, JobState
from gandiva.sweep.spec import SweepSpec

CLOSE_S = 30.0  # how long a stopping server waits for the database to take what is queued



def below_ceiling(who: Principal, priority: int) -> None:
    """403 for a member's priority above the ceiling: above it is the admins' class, which
    orders jobs across teams before their shares (decision 0037)."""
    if priority > CEILING and not who.admin:
        raise HTTPException(403, f"priority: {priority} is above {CEILING}, the highest a "
                            f"member may set; a priority orders your own jobs, and only an "
                            f"admin may put a job in the class above {CEILING}")

class LoopTrials:
    """``sweeps.Trials`` over the loop: events go to the journal, steps to the loop."""

    def __init__(self, journal: Journal, backend: Driver) -> None:
        self.journal, self.backend = journal, backend

    def devices(self) -> int:
        return self.backend.cluster.total_gpus

    def decided(self, decision: TrialDecision) -> None:
        self.journal.decided(decision)

    def note(self, job_id: str, kind: str, why: str) -> None:
        self.journal.change(JobChange(job_id, kind, {"why": why}))

    def set_priority(self, job_id: str, priority: int, kind: str, why: str) -> None:
        self.journal.change(JobChange(job_id, kind, {"why": why, "to": priority},
                                      priority=priority))
        self.backend.set_priority(job_id, priority)

    def hold(self, job_id: str, why: str) -> None:
        self.note(job_id, "sweep-paused", why)
        self.backend.hold(job_id)

    def release(self, job_id: str, why: str) -> None:
        self.note(job_id, "sweep-unpaused", why)
        self.backend.release(job_id)

    def stop(self, job_id: str, why: str) -> None:
        self.note(job_id, "sweep-stopped", why)
        self.backend.cancel(job_id, reason=f"stopped by {why}")


class Service:
    def __init__(self, store: Store, backend: Driver, base_dir: Path,
                 max_unfinished_per_user: int = MAX_UNFINISHED_PER_USER,
                 tenancy: Tenancy | None = None) -> None:
        self.store = store
        self.tenancy = tenancy or Tenancy.shared()
        self.backend = backend
        self.base_dir = base_dir
        self.max_unfinished_per_user = max_unfinished_per_user
        self.metrics = Metrics(backend)
        self.writer = Writer(store)
        self.metrics.registry.register(self.writer)
        self.journal = Journal(self.writer)
        self.confinement = Confinement(base_dir)
        self.submissions = Submissions(store, self.confinement, lambda: len(backend.devices),
                                       backend.has, max_unfinished_per_user, self.tenancy)
        self.views = Views(backend)
        self.sweeps = Sweeps(LoopTrials(self.journal, backend))
        backend.on_change = self._changed
        backend.on_flush = self.journal.hand_over
        backend.on_points = self._points
        self.refresh_shares()

    def refresh_shares(self) -> None:
        """Teams' and users' tickets, as stored, for the policy's fair shares. (One immutable
        object swapped in: the loop reads whichever it finds at its next event.)"""
        self.backend.cluster.shares = self.store.shares()

    def user_dir(self, who: Principal) -> Path:
        return self.confinement.user_dir(who)

    # ---- submissions -----------------------------------------------------------------------
    def submit(self, who: Principal, req: JobRequest) -> JobRow:
        """Store and queue a job (a ``submission_id`` used before: the job it made)."""
        below_ceiling(who, req.priority)
        row, accepted = self.submissions.job(who, req)
        if accepted is not None:
            if row.created:
                self.metrics.submitted.inc()
            try:
                self._queue(accepted)
            except ValueError:  # "submitted twice": a concurrent retry queued it first
                if row.created:
                    raise
        return row

    def submit_sweep(self, who: Principal, spec: SweepSpec) -> tuple[SweepRow, list[JobRow]]:
        """Store a sweep and its trials, then queue every trial."""
        below_ceiling(who, spec.priority)
        sweep, trials = self.submissions.sweep(who, spec)
        self.sweeps.add(sweep.id, spec, [t.row.id for t in trials])  # before any can report
        for trial in trials:
            self.metrics.submitted.inc()
            self._queue(trial)
        return sweep, [t.row for t in trials]

    def resume_unfinished(self) -> int:
        """After a restart: give the scheduler every job not yet finished; those that had
        started restore from their latest checkpoints. Held jobs stay held."""
        jobs = self.submissions.unfinished()
        for accepted, held in jobs:
            if not held:
                self.store.record(accepted.row.id, "requeued", {"after": "server restart"},
                                  state=JobState.QUEUED)
            self._queue(accepted, held=held)
        rows = self.store.sweeps(unfinished=True)  # after their trials are back in the loop
        self.sweeps.load(rows, self.store.trials([row.id for row in rows]))
        self.journal.hand_over()  # what the sweeps carried out again
        return len(jobs)

    def _queue(self, job: Accepted, held: bool = False) -> None:
        self.views.own(job.row.id, job.owner.id, job.row.name)
        self.backend.submit(*to_scheduler(job.row.id, job.request, job.cwd, job.account,
                                          user=job.owner.name),
                            time_limit=job.request.time_limit, held=held)

    # ---- what users ask of a job ------------------------------------------------------------
    def cancel(self, who: Principal, row: JobRow) -> None:
        live(row)
        self.store.record(row.id, "cancel-requested", {"by": who.name})
        self.backend.cancel(row.id)

    def hold(self, who: Principal, row: JobRow) -> None:
        live(row)
        if row.state == JobState.HELD:
            raise HTTPException(409, f"job {row.id!r} is held already")
        self.store.record(row.id, "suspend-requested", {"by": who.name})
        self.backend.hold(row.id)

    def release(self, who: Principal, row: JobRow) -> None:
        if row.state != JobState.HELD:
            raise HTTPException(409, f"job {row.id!r} is {row.state}, not held: only a job "
                                "suspended by its user can be resumed")
        self.store.record(row.id, "resume-requested", {"by": who.name})
        self.backend.release(row.id)

    def change(self, who: Principal, row: JobRow, priority: int) -> None:
        live(row)
        below_ceiling(who, priority)
        self.store.record(row.id, "priority", {"by": who.name, "from": row.priority,
                                               "to": priority}, priority=priority)
        self.backend.set_priority(row.id, priority)

    # ---- what readers see ---------------------------------------------------------------------
    def view(self, row: JobRow) -> JobView:
        return self.views.job(row)

    def cluster_json(self, who: Principal) -> bytes:
        return self.views.cluster_json(who)

    # ---- the loop's reports -------------------------------------------------------------------
    def _changed(self, rec: JobRecord, what: str) -> None:
        """(The loop's ``on_change``.)"""
        change = change_of(rec, what)
        self.journal.change(change)
        self.metrics.changed(what, change.state, change.reason)
        if change.state in TERMINAL:
            self.submissions.quotas.ended(rec.spec.id)
            self.views.forget(rec.spec.id)
            self.sweeps.forget(rec.spec.id)

    def _points(self, rec: JobRecord, series: dict[str, list[list[float]]]) -> None:
        """(The loop's ``on_points``.) A job's metric points, to store, and to judge if the
        job is a sweep's trial."""
        now = time.time()
        kept = {name[:64]: [(int(step), float(value)) for step, value in points
                            if 0 <= step <= STEP_MAX and math.isfinite(value)]
                for name, points in series.items()}
        self.journal.points([{"job_id": rec.spec.id, "name": name, "step": step,
                              "value": value, "at": now}
                             for name, points in kept.items() for step, value in points])
        self.sweeps.observe(rec.spec.id, kept)

    # ---- the store's writes -----------------------------------------------------------------
    def flush(self, timeout: float) -> bool:
        """Hand over what the loop has reported and wait until the store has all of it (at
        most ``timeout`` s); True if it has."""
        self.journal.hand_over()
        return self.writer.flush(timeout)

    def close(self, timeout: float = CLOSE_S) -> bool:
        """After the loop has stopped: store what is queued (waiting at most ``timeout`` s),
        then stop the writer. True if nothing was left unstored."""
        self.journal.hand_over()
        return self.writer.close(timeout)


def live(row: JobRow) -> None:
    if row.state in TERMINAL:
        raise HTTPException(409, f"job {row.id!r} is {row.state} already")
