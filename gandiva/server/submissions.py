"""Taking a submission: checked, counted against its user's limit, stored once.

A submission is stored (committed) before the scheduler sees it. A ``submission_id`` used
before returns the job it made, before any other check (a retry of a job that exists is never
refused); the same id with another spec is refused. A user has at most
``max_unfinished_per_user`` jobs not yet finished: a place is taken before a submission is
stored, and becomes the job's once it is, until the job ends.
"""

import collections
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import HTTPException

from gandiva.node.accounts import Account
from gandiva.node.agent import Launch
from gandiva.server.confinement import Confinement, unprocessable
from gandiva.server.jobspec import JobRequest
from gandiva.server.store import JobRow, Principal, Store, SweepRow
from gandiva.server.tenancy import Tenancy
from gandiva.spec import TERMINAL, JobSpec, JobState
from gandiva.sweep.spec import SweepSpec

MAX_UNFINISHED_PER_USER = 10_000  # a user's jobs not yet done, failed or cancelled


def to_scheduler(job_id: str, req: JobRequest, cwd: Path, account: Account | None = None,
                 user: str = "default") -> tuple[JobSpec, Launch]:
    """The scheduler's view (JobSpec) and the agent's (Launch) of a request.

    Decision: ``python``/``python3`` as the program means the server's own interpreter, so a
    job runs with the packages the server has (torch, the job library), and can start in a
    warm process."""
    command = list(req.command)
    if command[0] in ("python", "python3"):
        command[0] = "{python}"
    spec = JobSpec(job_id, 0.0, req.gpus, req.model, user=user, priority=req.priority,
                   min_gpus=req.elastic.min if req.elastic else None,
                   max_gpus=req.elastic.max if req.elastic else None,
                   checkpoints=req.checkpoints)
    return spec, Launch(command, cwd=cwd, env=dict(req.env), account=account)


class Quotas:
    """Each user's jobs not yet finished, against one limit for all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._unfinished: collections.Counter[int] = collections.Counter()  # user -> jobs
        self._counted: dict[str, int] = {}  # job -> its user, while counted
        self._lock = threading.Lock()

    def unfinished(self, user_id: int) -> int:
        return self._unfinished[user_id]

    def take(self, user_id: int, n: int, refusal: Callable[[int], str]) -> None:
        """Take ``n`` places for a submission being stored; 429 with ``refusal(unfinished)``
        if they pass the limit."""
        with self._lock:
            if self._unfinished[user_id] + n > self.limit:
                raise HTTPException(429, refusal(self._unfinished[user_id]))
            self._unfinished[user_id] += n

    def settle(self, user_id: int, taken: int, job_ids: list[str]) -> None:
        """The places taken become these jobs'; the rest are given back."""
        with self._lock:
            self._counted.update(dict.fromkeys(job_ids, user_id))
            self._unfinished[user_id] -= taken - len(job_ids)

    def count(self, job_id: str, user_id: int) -> None:
        """A job taken up again after a restart."""
        with self._lock:
            if job_id not in self._counted:
                self._counted[job_id] = user_id
                self._unfinished[user_id] += 1

    def ended(self, job_id: str) -> None:
        with self._lock:
            user_id = self._counted.pop(job_id, None)
            if user_id is not None:
                self._unfinished[user_id] -= 1


@dataclass(frozen=True)
class Accepted:
    """A stored submission, ready for the scheduler."""

    row: JobRow
    request: JobRequest
    cwd: Path
    owner: Principal
    account: Account | None = None  # who it runs as (None: as the server)


class Submissions:
    """Checks a job or a sweep, stores it, and says what the scheduler should be given."""

    def __init__(self, store: Store, confinement: Confinement, devices: Callable[[], int],
                 queued: Callable[[str], bool],
                 max_unfinished_per_user: int = MAX_UNFINISHED_PER_USER,
                 tenancy: Tenancy | None = None) -> None:
        self.store = store
        self.confinement = confinement
        self.tenancy = tenancy or Tenancy.shared()
        self.devices = devices
        self.queued = queued
        self.quotas = Quotas(max_unfinished_per_user)

    def job(self, who: Principal, req: JobRequest) -> tuple[JobRow, Accepted | None]:
        """The stored job, and what to queue (None: a retry of a job already queued).

        A retry can find a job the scheduler never had: its commit was cut off (the
        database hung and the connection was cut) and landed when the database thawed,
        after the client was answered 503. That job is queued now."""
        if req.submission_id is not None:
            earlier = self.store.by_submission(who, req.submission_id)
            if earlier is not None:
                same(earlier, req)
                if earlier.state in TERMINAL or self.queued(earlier.id):
                    return earlier, None
                self.quotas.count(earlier.id, who.id)
                return earlier, Accepted(earlier, req, self.confinement.workdir(who, req), who,
                                         self._account(who))
        account = self._account(who)
        cwd = self.confinement.workdir(who, req)
        if req.gpus > self.devices():
            raise unprocessable("gpus", f"{req.gpus} GPUs asked; this cluster has "
                                f"{self.devices()}")
        self.quotas.take(who.id, 1, lambda unfinished: (
            f"you have {unfinished} jobs not yet finished, the limit per user "
            "(--max-unfinished-per-user); wait for some or cancel them"))
        row = None
        try:
            row = self.store.add_job(who, req)  # committed before the scheduler sees it
        finally:
            self.quotas.settle(who.id, 1, [row.id] if row is not None and row.created else [])
        if not row.created:  # a concurrent retry stored it first
            return same(row, req), None
        return row, Accepted(row, req, cwd, who, account)

    def sweep(self, who: Principal, spec: SweepSpec) -> tuple[SweepRow, list[Accepted]]:
        """Store a sweep and its trials (one transaction): each is checked as a job
        submission is (its directory, its paths, the cluster's size, the user's limit of
        unfinished jobs), all before any is stored."""
        sweep_id = f"{spec.name[:31]}-{uuid.uuid4().hex[:8]}"
        params = spec.draw()
        requests = [spec.trial_request(i, p, sweep_id) for i, p in enumerate(params)]
        account = self._account(who)
        cwds = [self.confinement.workdir(who, r) for r in requests]
        if spec.gpus > self.devices():
            raise unprocessable("gpus", f"{spec.gpus} GPUs asked for each trial; this "
                                f"cluster has {self.devices()}")
        n = len(requests)
        self.quotas.take(who.id, n, lambda unfinished: (
            f"{n} trials and your {unfinished} jobs not yet finished pass the limit per "
            f"user ({self.quotas.limit}, --max-unfinished-per-user); ask for fewer trials"))
        rows: list[JobRow] = []
        try:
            sweep, rows = self.store.add_sweep(who, sweep_id, spec.name,
                                               spec.model_dump(mode="json"),
                                               list(zip(params, requests, strict=True)))
        finally:
            self.quotas.settle(who.id, n, [row.id for row in rows])
        return sweep, [Accepted(row, request, cwd, who, account)
                       for row, request, cwd in zip(rows, requests, cwds, strict=True)]

    def unfinished(self) -> list[tuple[Accepted, bool]]:
        """After a restart: every job not yet finished, to give the scheduler again, and
        whether it is held; each counts against its user's limit again."""
        out = []
        for row in self.store.unfinished():
            req = JobRequest.model_validate(row.spec).model_copy(
                update={"priority": row.priority})
            owner = self.store.owner(row.id)
            self.quotas.count(row.id, owner.id)
            base = self.confinement.user_dir(owner)
            account = self.tenancy.account(owner, base, check=False)  # (refused on the node)
            out.append((Accepted(row, req, base / req.workdir, owner, account),
                        row.state == JobState.HELD))
        return out

    def _account(self, who: Principal) -> Account | None:
        return self.tenancy.account(who, self.confinement.user_dir(who))


def same(earlier: JobRow, req: JobRequest) -> JobRow:
    """The job a submission_id made, if this is a retry of the same spec; a different spec
    under a used id is a client's mistake, refused (409), never silently merged."""
    if earlier.spec != req.model_dump():
        raise HTTPException(409, f"submission_id {req.submission_id!r} was used for "
                            f"another spec (job {earlier.id}); choose a new id")
    return earlier
