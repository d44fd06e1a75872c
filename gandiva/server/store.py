"""The server's state in a database: users, jobs, and every event of every job.

SQLAlchemy over SQLite by default (a file next to the server's work directory) or PostgreSQL
by URL; the schema is created and upgraded by Alembic (``migrations/``) when a store opens.
Each change is one transaction, committed before the server acts on it or answers: a job
whose submission was acknowledged exists, and a crash loses no acknowledged event.

Tokens are never stored: only their SHA-256, which is enough to find the user of a token
(a token is 32 random bytes, so a plain hash does not need a salt to resist guessing).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from gandiva.node.accounts import DYNAMIC_UIDS
from gandiva.server.jobspec import JobRequest, check_name
from gandiva.shares import Shares
from gandiva.spec import TERMINAL, JobState

CONNECT_TIMEOUT_S = 5  # a PostgreSQL that does not take a new connection in this long is away
STUCK_S = 30.0  # a PostgreSQL command unanswered this long (and no other since): cut it
WRITE_WAIT_S = 10.0  # a request waits this long behind another write, then 503
CHUNK = 500  # jobs read in one query when storing a batch (bound parameters stay few)
TOKEN_RECHECK_S = 10.0  # a cached token is looked up again after this long
STEP_MAX = 2**31 - 1  # metric_points.step is a 32-bit INTEGER (on PostgreSQL)


@dataclass
class JobChange:
    """An event of a job, and the state, reason or priority it moves the job to."""

    job_id: str
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    state: str | None = None
    reason: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class TrialDecision:
    """A sweep's latest decision on a trial, with the value it had at each rung it reached
    (rung -> value)."""

    sweep_id: str
    trial: int
    rungs: dict[int, float]
    decision: str


class Base(DeclarativeBase):
    pass


class Team(Base):
    """A team: its tickets weigh its share of the cluster against other teams'; its quota,
    if any, is GPUs it is guaranteed."""

    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    tickets: Mapped[int] = mapped_column(Integer, default=1)
    quota_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    os_user: Mapped[str | None] = mapped_column(String(32), nullable=True)  # its jobs' account
    uid: Mapped[int | None] = mapped_column(Integer, nullable=True, unique=True)  # else this
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), nullable=True)
    tickets: Mapped[int] = mapped_column(Integer, default=1)  # weight inside its team

    def principal(self) -> Principal:
        return Principal(self.id, self.name, self.admin, self.os_user, self.uid)


class JobRow(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    submission_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created = True  # not stored: False where a submission_id found the job made before


class LabelRow(Base):
    __tablename__ = "job_labels"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(63))


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict] = mapped_column(JSON)


class MetricRow(Base):
    """One value of a metric a job reported, at a step (mini-batches done)."""

    __tablename__ = "metric_points"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    at: Mapped[float] = mapped_column(Float)


class SweepRow(Base):
    __tablename__ = "sweeps"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class TrialRow(Base):
    """A sweep's trial: its job, its parameters, the value it had at each rung it reached
    (rung -> value; JSON keys are strings), and the sweep's last decision on it."""

    __tablename__ = "sweep_trials"
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id"), primary_key=True)
    trial: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), unique=True)
    params: Mapped[dict] = mapped_column(JSON)
    rungs: Mapped[dict] = mapped_column(JSON)
    decision: Mapped[str] = mapped_column(String(16))


@dataclass(frozen=True)
class Principal:
    """Who is asking: a user, and whether they may see and act on every job."""

    id: int
    name: str
    admin: bool
    os_user: str | None = None  # the OS account its jobs run as, where the server maps users
    uid: int | None = None  # else its dynamic uid (``gandiva.node.accounts``)


class StoreError(ValueError):
    pass


class StoreBusy(Exception):
    """A request's write waited ``WRITE_WAIT_S`` behind one the database has not finished."""


@dataclass(frozen=True)
class TeamView:
    name: str
    tickets: int
    quota_gpus: int | None
    members: list[str]


@dataclass(frozen=True)
class UserView:
    name: str
    admin: bool
    created_at: float
    revoked_at: float | None
    os_user: str | None = None
    uid: int | None = None
    team: str | None = None
    tickets: int = 1


class UnknownTeam(StoreError):
    """A request named a team that does not exist."""


UNSET: Any = object()  # (an argument not given, where None means "none")
TICKETS_MAX = 1_000_000


def _tickets(value: int) -> int:
    if not 1 <= value <= TICKETS_MAX:
        raise StoreError(f"tickets: {value} is not from 1 to {TICKETS_MAX}")
    return value


def _quota(value: int | None) -> int | None:
    if value is not None and value < 0:
        raise StoreError(f"quota_gpus: {value} is negative (none: no quota)")
    return value


@dataclass
class _Pending:
    """A submission waiting for the group commit that stores it."""

    job: dict[str, Any]
    event: dict[str, Any]
    labels: list[dict[str, str]]
    done: bool = False
    error: Exception | None = field(default=None, repr=False)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def database_url(url: str) -> str:
    """Accept the forms users write: a path, ``sqlite:///...``, ``postgresql://...``."""
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


# A page of jobs from SQLite is read as one row: Python's sqlite3 releases the GIL around each
# row's step, and a reader then waits up to the switch interval for it at every row while the
# scheduler's loop computes (a page of 50 beside one busy thread: 43 ms at the median row by
# row against 3.5 ms as one row on one 2-core machine, 3.0 against 2.6 ms on another; alone,
# 0.5 against 1.2 ms: benchmarks/store_gil.py). PostgreSQL's driver reads a result at once.
# Floats go through printf('%!.17g'), which gives back every bit of a timestamp, where
# SQLite's JSON writes 15 significant digits. The columns are the table's, so a column a
# migration adds is read too.
_FLOATS = tuple(c.name for c in JobRow.__table__.columns if isinstance(c.type, Float))
_PAGE = literal_column("json_group_array(json_object(" + ", ".join(
    f"'{c.name}', " + (f"CASE WHEN {c.name} IS NULL THEN NULL ELSE printf('%!.17g', {c.name}) END"
                       if c.name in _FLOATS else f"json({c.name})" if isinstance(c.type, JSON)
                       else c.name)
    for c in JobRow.__table__.columns) + "))")


def _one_row(s: Session, q: Any) -> list[JobRow]:
    """The rows of ``q`` (a select of JobRow, limited), fetched as one JSON array: detached
    JobRows, newest first as ``Store.jobs`` orders them (an aggregate's order is SQLite's to
    choose, so it is restored here)."""
    rows = []
    for d in json.loads(s.scalar(select(_PAGE).select_from(q.subquery())) or "[]"):
        for name in _FLOATS:
            if d[name] is not None:
                d[name] = float(d[name])
        rows.append(JobRow(**d))
    rows.sort(key=lambda r: (r.submitted_at, r.id), reverse=True)
    return rows


class Store:
    def __init__(self, url: str) -> None:
        self.url = database_url(url)
        # pre-ping: a connection the database dropped (it restarted) is replaced, not used
        self.engine: Engine = create_engine(self.url, pool_pre_ping=True,
                                            connect_args=_connect_args(self.url))
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            Unsticker(self.engine, STUCK_S)
        self._prober = ThreadPoolExecutor(1, thread_name_prefix="gandiva-store-probe")
        self._probe: Future[None] | None = None
        self._probe_lock = threading.Lock()
        # one write transaction at a time in this process: writers queue here, not in the
        # database's lock (SQLite's busy handler sleeps, up to 100 ms a try)
        self._writer = threading.Lock()
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        # token hash -> who; a revoked or rotated token leaves it at once (``revoke``,
        # ``rotate``); a change made by another process is seen within TOKEN_RECHECK_S
        self._principals: dict[str, tuple[Principal, float]] = {}
        # bumped after each revoke or rotate commits: a lookup that read its row before
        # then does not cache it (it could be the row from before the revoke)
        self._revocations = 0
        self._cache_lock = threading.Lock()
        self.migrate()

    @contextmanager
    def _writing(self, wait_s: float | None = None) -> Iterator[None]:
        """The process's one write transaction at a time. A request's write waits at most
        ``wait_s`` for it, then ``StoreBusy``: a database that hangs holds whoever is
        writing (until ``Unsticker`` cuts it), and requests must not queue behind it."""
        if not self._writer.acquire(timeout=-1 if wait_s is None else wait_s):
            raise StoreBusy(f"the database has not finished the write before this one in "
                            f"{wait_s:g} s")
        try:
            yield
        finally:
            self._writer.release()

    def probe(self) -> Future[None]:
        """A ``SELECT 1`` on a thread of its own, or the one still under way: a caller waits
        on it as long as it likes, and a database that hangs holds one probe, not one per
        caller."""
        with self._probe_lock:
            if self._probe is None or self._probe.done():
                self._probe = self._prober.submit(self._select_one)
            return self._probe

    def _select_one(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def _events_in_commit_order(self, s: Session | Connection) -> None:
        """PostgreSQL numbers events from a sequence as they are inserted, so two writers
        could commit 11 before 10, and a reader following ``after`` would pass 10 for good.
        One writer of events at a time keeps ids in commit order (SQLite has one writer
        anyway); readers are not blocked."""
        if self.engine.dialect.name == "postgresql":
            s.execute(text("LOCK TABLE events IN EXCLUSIVE MODE"))

    def migrate(self) -> None:
        """Bring the schema to the newest revision (creating it in an empty database)."""
        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    # ---- users --------------------------------------------------------------------------
    def add_user(self, name: str, admin: bool = False, os_user: str | None = None,
                 team: str | None = None, tickets: int = 1) -> str:
        """Create ``name`` and return its token (shown once: only its hash is kept). The
        name is a directory's (``users/<name>``): it is checked as a job's name is.
        ``os_user``: the OS account its jobs run as (on a root server); else they run as the
        user's dynamic uid, given here for good."""
        try:
            check_name(name)
        except ValueError as e:
            raise StoreError(f"user name {name!r}: {e}") from None
        if os_user is not None and not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", os_user):
            raise StoreError(f"OS account {os_user!r}: not an account name (lower-case "
                             "letters, digits, _ . -; at most 32)")
        token = secrets.token_urlsafe(32)
        with Session(self.engine) as s, s.begin():
            if s.scalar(select(User).where(User.name == name)) is not None:
                raise StoreError(f"user {name!r} exists already")
            user = User(name=name, token_hash=_hash(token), admin=admin,
                        created_at=time.time(), os_user=os_user, tickets=_tickets(tickets),
                        team_id=None if team is None else self._team(s, team).id)
            s.add(user)
            s.flush()  # its id
            if user.id > len(DYNAMIC_UIDS):
                raise StoreError(f"no dynamic uid left for user {name!r}: users beyond "
                                 f"{len(DYNAMIC_UIDS)} need an OS account (--os-user)")
            user.uid = DYNAMIC_UIDS[user.id - 1]
        return token

    def principal(self, token: str) -> Principal | None:
        who = self.known(token)
        if who is None:
            revocations = self._revocations
            with Session(self.engine) as s:
                user = s.scalar(select(User).where(User.token_hash == _hash(token),
                                                   User.revoked_at.is_(None)))
                if user is None:
                    return None
                who = user.principal()
            with self._cache_lock:
                if self._revocations == revocations:
                    self._principals[user.token_hash] = (who, time.monotonic())
        return who

    def known(self, token: str) -> Principal | None:
        """The user of a token seen lately, without asking the database."""
        seen = self._principals.get(_hash(token))
        if seen is None or time.monotonic() - seen[1] > TOKEN_RECHECK_S:
            return None
        return seen[0]

    def principals(self) -> list[Principal]:
        """Every user whose token works."""
        with Session(self.engine) as s:
            return [u.principal() for u in s.scalars(select(User).where(
                User.revoked_at.is_(None)).order_by(User.id))]

    def users(self) -> list[UserView]:
        with Session(self.engine) as s:
            teams = {t.id: t.name for t in s.scalars(select(Team))}
            return [UserView(u.name, u.admin, u.created_at, u.revoked_at, u.os_user, u.uid,
                             teams.get(u.team_id) if u.team_id is not None else None,
                             u.tickets)
                    for u in s.scalars(select(User).order_by(User.name))]

    def set_user(self, name: str, team: str | None = UNSET, tickets: int | None = None
                 ) -> UserView:
        """Move a user to ``team`` (None: to no team) or give them ``tickets`` in it."""
        with Session(self.engine) as s, s.begin():
            user = None if "\x00" in name else s.scalar(select(User).where(User.name == name))
            if user is None:
                raise StoreError(f"no user {name!r}")
            if team is not UNSET:
                user.team_id = None if team is None else self._team(s, team).id
            if tickets is not None:
                user.tickets = _tickets(tickets)
        return next(u for u in self.users() if u.name == name)

    # ---- teams --------------------------------------------------------------------------
    @staticmethod
    def _team(s: Session, name: str) -> Team:
        team = None if "\x00" in name else s.scalar(select(Team).where(Team.name == name))
        if team is None:
            raise UnknownTeam(f"no team {name!r}")
        return team

    def add_team(self, name: str, tickets: int = 1, quota_gpus: int | None = None) -> TeamView:
        try:
            check_name(name)
        except ValueError as e:
            raise StoreError(f"team name {name!r}: {e}") from None
        with Session(self.engine) as s, s.begin():
            if s.scalar(select(Team).where(Team.name == name)) is not None:
                raise StoreError(f"team {name!r} exists already")
            s.add(Team(name=name, tickets=_tickets(tickets), quota_gpus=_quota(quota_gpus),
                       created_at=time.time()))
        return self.team(name)

    def set_team(self, name: str, tickets: int | None = None,
                 quota_gpus: int | None = UNSET) -> TeamView:
        """Change a team's tickets or its quota (None: no quota)."""
        with Session(self.engine) as s, s.begin():
            team = self._team(s, name)
            if tickets is not None:
                team.tickets = _tickets(tickets)
            if quota_gpus is not UNSET:
                team.quota_gpus = _quota(quota_gpus)
        return self.team(name)

    def shares(self) -> Shares:
        """Teams' tickets and each user's team and tickets, for the policy; a user in no
        team is a team of its own."""
        with Session(self.engine) as s:
            rows = list(s.scalars(select(Team)))
            teams = {t.id: (t.name, float(t.tickets)) for t in rows}
            users = {u.name: (teams[u.team_id][0], float(u.tickets))
                     for u in s.scalars(select(User)) if u.team_id in teams}
        return Shares(dict(teams.values()), users, {t.name: t.quota_gpus for t in rows
                                                    if t.quota_gpus})

    def team(self, name: str) -> TeamView:
        found = [t for t in self.teams() if t.name == name]
        if not found:
            raise UnknownTeam(f"no team {name!r}")
        return found[0]

    def teams(self) -> list[TeamView]:
        """Every team with its members, by name."""
        with Session(self.engine) as s:
            members: dict[int, list[str]] = {}
            for u in s.scalars(select(User).where(User.team_id.is_not(None))
                               .order_by(User.name)):
                members.setdefault(u.team_id, []).append(u.name)
            return [TeamView(t.name, t.tickets, t.quota_gpus, members.get(t.id, []))
                    for t in s.scalars(select(Team).order_by(Team.name))]

    def _forget(self, user_id: int) -> None:
        """After a revoke or rotate commits: the user's cached tokens go, and no lookup
        that began before is cached."""
        with self._cache_lock:
            self._revocations += 1
            for key, (who, _) in list(self._principals.items()):
                if who.id == user_id:
                    self._principals.pop(key, None)

    def revoke(self, name: str) -> None:
        """The user's token stops working at once; their jobs stay (an admin sees them)."""
        with Session(self.engine) as s, s.begin():
            user = None if "\x00" in name else s.scalar(select(User).where(User.name == name))
            if user is None:
                raise StoreError(f"no user {name!r}")
            user.revoked_at = time.time()
            user_id = user.id
        self._forget(user_id)

    def rotate(self, name: str) -> str:
        """A new token for the user (a revoked user is enabled again); the old one stops
        working at once."""
        token = secrets.token_urlsafe(32)
        with Session(self.engine) as s, s.begin():
            user = None if "\x00" in name else s.scalar(select(User).where(User.name == name))
            if user is None:
                raise StoreError(f"no user {name!r}")
            user.token_hash, user.revoked_at = _hash(token), None
            user_id = user.id
        self._forget(user_id)
        return token

    # ---- jobs ---------------------------------------------------------------------------
    def submit(self, who: Principal, request: JobRequest) -> str:
        """Store a new job (queued) and its first event; return its id."""
        return self.add_job(who, request).id

    def add_job(self, who: Principal, request: JobRequest) -> JobRow:
        """Store a new job (queued) and its first event; return it once committed. With a
        ``submission_id`` the user used before, the job that id made (``created`` False).

        Group commit: submissions that arrive while a transaction commits are stored
        together in the next one, so a flood costs one commit (one fsync) per batch, not
        per job. (The API looks a ``submission_id`` up before it checks limits; here the
        unique index catches the id used before, or by a concurrent twin.)"""
        mine = _new(who, request)
        job = mine.job
        with self._pending_lock:
            self._pending.append(mine)
        try:
            with self._writing(WRITE_WAIT_S):
                if not mine.done:  # else an earlier writer's batch took it along
                    with self._pending_lock:
                        batch, self._pending = self._pending, []
                    self._commit(batch)
        except StoreBusy:
            with self._pending_lock:
                if any(p is mine for p in self._pending):  # not taken along by the writer
                    self._pending = [p for p in self._pending if p is not mine]
                    raise
            with self._writing():  # taken along: its fate is that transaction's
                pass
        if mine.error is not None:
            if isinstance(mine.error, IntegrityError) and request.submission_id is not None:
                earlier = self.by_submission(who, request.submission_id)  # a concurrent twin
                if earlier is not None:
                    return earlier
            raise mine.error
        if not mine.done:  # its batch's writer was interrupted
            raise StoreError(f"job {request.name!r} was not stored; submit it again")
        return JobRow(**job)

    def by_submission(self, who: Principal, submission_id: str) -> JobRow | None:
        if "\x00" in submission_id:
            return None
        with Session(self.engine, expire_on_commit=False) as s:
            row = s.scalar(select(JobRow).where(JobRow.user_id == who.id,
                                                JobRow.submission_id == submission_id))
        if row is not None:
            row.created = False
        return row

    def labels(self, job_ids: list[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {j: {} for j in job_ids}
        if job_ids:
            with Session(self.engine) as s:
                for r in s.scalars(select(LabelRow).where(LabelRow.job_id.in_(job_ids))):
                    out[r.job_id][r.key] = r.value
        return out

    def _commit(self, batch: list[_Pending]) -> None:
        """One transaction for the batch; each submission learns how it went. A row the
        database refuses fails only itself: the others are then stored one by one."""
        error: Exception | None = None
        try:
            with self.engine.begin() as conn:
                self._events_in_commit_order(conn)
                conn.execute(insert(JobRow), [p.job for p in batch])
                conn.execute(insert(EventRow), [p.event for p in batch])
                labels = [label for p in batch for label in p.labels]
                if labels:
                    conn.execute(insert(LabelRow), labels)
        except OperationalError as e:  # the database itself: none of them is stored
            error = e
        except Exception as e:
            if len(batch) > 1:
                for p in batch:
                    self._commit([p])
                return
            error = e
        for p in batch:
            p.error, p.done = error, True

    def record(self, job_id: str, kind: str, data: dict[str, Any] | None = None,
               state: str | None = None, reason: str | None = None,
               priority: int | None = None) -> None:
        """Append an event of a job, and move it to ``state`` (or ``priority``) if given, in
        one transaction."""
        refused = self.record_many([JobChange(job_id, kind, data or {}, state, reason, priority)],
                                   wait_s=WRITE_WAIT_S)
        if refused:
            raise StoreError(refused[0])

    def record_many(self, changes: list[JobChange],
                    decisions: list[TrialDecision] | tuple[()] = (),
                    wait_s: float | None = None) -> list[str]:
        """Store ``changes`` and sweeps' ``decisions`` in one transaction (one commit for a
        whole time-slicing round); returns why each change that could not apply was left
        out (no such job, or a state after the end), the rest stored.

        In three statements per chunk of jobs, whatever their number: one read of the jobs'
        rows, one UPDATE run for every changed job, one multi-row INSERT of the events.
        (Through the ORM, a row at a time, a round of 3,000 changes took 1.2 s on SQLite
        and 3.6 s on PostgreSQL: ``benchmarks/store_batch.py``.)"""
        now = time.time()
        refused: list[str] = []
        rows: dict[str, dict] = {}  # job -> its columns, as the changes leave them
        changed: dict[str, None] = {}
        events: list[dict] = []
        cols = (JobRow.id, JobRow.state, JobRow.reason, JobRow.priority, JobRow.started_at,
                JobRow.finished_at)
        ids = list(dict.fromkeys(c.job_id for c in changes))
        with self._writing(wait_s), self.engine.begin() as conn:
            self._events_in_commit_order(conn)
            for i in range(0, len(ids), CHUNK):
                for row in conn.execute(select(*cols).where(JobRow.id.in_(ids[i:i + CHUNK]))):
                    rows[row.id] = row._asdict()
            for c in changes:
                job = rows.get(c.job_id)
                if job is None:
                    refused.append(f"no job {c.job_id!r}")
                    continue
                if c.state is not None:
                    if job["state"] in TERMINAL:
                        refused.append(f"job {c.job_id!r} is {job['state']}; it cannot become "
                                       f"{c.state}")
                        continue
                    job["state"] = c.state
                    if c.state == JobState.RUNNING and job["started_at"] is None:
                        job["started_at"] = now
                    if c.state in TERMINAL:
                        job["finished_at"] = now
                if c.reason is not None:
                    job["reason"] = c.reason
                if c.priority is not None:
                    job["priority"] = c.priority
                if c.state is not None or c.reason is not None or c.priority is not None:
                    changed[c.job_id] = None
                events.append({"job_id": c.job_id, "at": now, "kind": c.kind, "data": c.data})
            if changed:
                conn.execute(
                    update(JobRow).where(JobRow.id == bindparam("key")).values(
                        state=bindparam("state"), reason=bindparam("reason"),
                        priority=bindparam("priority"), started_at=bindparam("started_at"),
                        finished_at=bindparam("finished_at")),
                    [{**{k: v for k, v in rows[j].items() if k != "id"}, "key": j}
                     for j in changed])
            if events:
                conn.execute(insert(EventRow), events)
            for d in decisions:
                self._set_trial(conn, d)
        return refused

    def job(self, who: Principal, job_id: str) -> JobRow | None:
        """The job if ``who`` may see it (their own, or any for an admin); else None, as if
        it did not exist (so ids of others' jobs leak nothing)."""
        if "\x00" in job_id:  # no id holds NUL, and PostgreSQL's text cannot
            return None
        with Session(self.engine, expire_on_commit=False) as s:
            job = s.get(JobRow, job_id)
            if job is None or not (who.admin or job.user_id == who.id):
                return None
            return job

    def owner(self, job_id: str) -> Principal:
        with Session(self.engine) as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise StoreError(f"no job {job_id!r}")
            user = s.get(User, job.user_id)
            return user.principal()

    def jobs(self, who: Principal, states: tuple[str, ...] = (), limit: int = 1000,
             after: str | None = None, user: str | None = None,
             labels: dict[str, str | None] | None = None) -> list[JobRow]:
        """Newest first. ``after``: a job id from the previous page (keyset pagination: the
        jobs submitted before it). ``user``: only that user's (an admin's filter; others
        see only their own anyway). ``labels``: jobs with every one of these labels (a
        None value: the key with any value)."""
        clean = [st for st in states if "\x00" not in st]  # PostgreSQL's text cannot hold NUL
        if "\x00" in (user or "") or any("\x00" in k + (v or "")
                                          for k, v in (labels or {}).items()):
            return []  # no name or label holds NUL
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(JobRow).order_by(JobRow.submitted_at.desc(), JobRow.id.desc())
            if not who.admin:
                q = q.where(JobRow.user_id == who.id)
            elif user is not None:
                q = q.join(User, User.id == JobRow.user_id).where(User.name == user)
            if states:
                q = q.where(JobRow.state.in_(clean))
            if after is not None:
                cursor = None if "\x00" in after else s.get(JobRow, after)
                if cursor is None or not (who.admin or cursor.user_id == who.id):
                    raise StoreError(f"after={after!r} is no job id; give the id of the last "
                                     "job of the previous page (its next link)")
                q = q.where((JobRow.submitted_at < cursor.submitted_at)
                            | ((JobRow.submitted_at == cursor.submitted_at)
                               & (JobRow.id < cursor.id)))
            for key, value in (labels or {}).items():  # value None: any value
                tag = LabelRow.__table__.alias()
                match = select(tag.c.job_id).where(tag.c.job_id == JobRow.id, tag.c.key == key)
                if value is not None:
                    match = match.where(tag.c.value == value)
                q = q.where(match.exists())
            if self.engine.dialect.name == "sqlite":
                return _one_row(s, q.limit(limit))
            return list(s.scalars(q.limit(limit)))

    def events(self, job_id: str, after: int = 0, limit: int = 10_000) -> list[EventRow]:
        with Session(self.engine, expire_on_commit=False) as s:
            q = (select(EventRow).where(EventRow.job_id == job_id, EventRow.id > after)
                 .order_by(EventRow.id).limit(limit))
            return list(s.scalars(q))

    def all_events(self, who: Principal, after: int = 0, limit: int = 1000) -> list[EventRow]:
        """Events of every job ``who`` may see, after event id ``after``, oldest first."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = (select(EventRow).where(EventRow.id > after).order_by(EventRow.id).limit(limit))
            if not who.admin:
                q = q.join(JobRow, JobRow.id == EventRow.job_id).where(JobRow.user_id == who.id)
            return list(s.scalars(q))

    def lived(self, since: float, until: float) -> list[tuple[JobRow, str, list[EventRow]]]:
        """Every job alive at some time in [since, until), with its owner's name and its
        events (oldest first): what usage is counted from."""
        with Session(self.engine, expire_on_commit=False) as s:
            jobs = [(row, name) for row, name in s.execute(
                select(JobRow, User.name).join(User, User.id == JobRow.user_id)
                .where(JobRow.submitted_at < until,
                       or_(JobRow.finished_at.is_(None), JobRow.finished_at >= since))
                .order_by(JobRow.submitted_at, JobRow.id))]
            events: dict[str, list[EventRow]] = {row.id: [] for row, _ in jobs}
            ids = list(events)
            for i in range(0, len(ids), CHUNK):
                for e in s.scalars(select(EventRow).where(EventRow.job_id.in_(ids[i:i + CHUNK]))
                                   .order_by(EventRow.id)):
                    events[e.job_id].append(e)
        return [(row, name, events[row.id]) for row, name in jobs]

    def unfinished(self) -> list[JobRow]:
        """Jobs to take up again after a restart, oldest first."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = (select(JobRow).where(JobRow.state.not_in(TERMINAL))
                 .order_by(JobRow.submitted_at, JobRow.id))
            return list(s.scalars(q))

    # ---- learning curves ----------------------------------------------------------------
    def add_points(self, points: list[dict[str, Any]]) -> None:
        """Store metric points (job_id, name, step, value, at) in one multi-row INSERT
        (the cost per point: ``benchmarks/store_batch.py``)."""
        if points:
            with self._writer, self.engine.begin() as conn:
                conn.execute(insert(MetricRow), points)

    def points(self, job_id: str, names: list[str] | None = None, after: int = -1,
               limit: int = 10_000) -> dict[str, list[tuple[int, float, float]]]:
        """A job's curves: metric -> (step, value, at) from step ``after`` on (exclusive),
        in step order, at most ``limit`` points in all. A step reported twice (a job that
        restored from a checkpoint and ran it again) has its latest value."""
        q = (select(MetricRow.name, MetricRow.step, MetricRow.value, MetricRow.at)
             .where(MetricRow.job_id == job_id, MetricRow.step > after)
             .order_by(MetricRow.step, MetricRow.id).limit(limit))
        if names:
            q = q.where(MetricRow.name.in_(names))
        out: dict[str, dict[int, tuple[int, float, float]]] = {}
        with self.engine.connect() as conn:
            for name, step, value, at in conn.execute(q):
                out.setdefault(name, {})[step] = (step, value, at)
        return {name: list(by_step.values()) for name, by_step in out.items()}

    def last_points(self, job_ids: list[str], name: str) -> dict[str, tuple[int, float]]:
        """Each job's latest point (step, value) of metric ``name``: one query for a whole
        sweep, reading one row a job (the newest, through the curve index)."""
        out: dict[str, tuple[int, float]] = {}
        for i in range(0, len(job_ids), CHUNK):
            newest = (select(func.max(MetricRow.id).label("id"))
                      .where(MetricRow.job_id.in_(job_ids[i:i + CHUNK]), MetricRow.name == name)
                      .group_by(MetricRow.job_id).subquery())
            q = (select(MetricRow.job_id, MetricRow.step, MetricRow.value)
                 .join(newest, MetricRow.id == newest.c.id))
            with self.engine.connect() as conn:
                out.update({job: (step, value) for job, step, value in conn.execute(q)})
        return out

    # ---- sweeps -------------------------------------------------------------------------
    def add_sweep(self, who: Principal, sweep_id: str, name: str, spec: dict[str, Any],
                  trials: list[tuple[dict[str, Any], JobRequest]]
                  ) -> tuple[SweepRow, list[JobRow]]:
        """Store a sweep, its trials' jobs (queued) and the trials, in one transaction:
        ``trials`` is (parameters, the trial's job) in trial order."""
        sweep = {"id": sweep_id, "user_id": who.id, "name": name, "spec": spec,
                 "created_at": time.time()}
        news = [_new(who, request) for _, request in trials]
        with self._writing(WRITE_WAIT_S), self.engine.begin() as conn:
            self._events_in_commit_order(conn)
            conn.execute(insert(SweepRow), [sweep])
            conn.execute(insert(JobRow), [p.job for p in news])
            conn.execute(insert(EventRow), [p.event for p in news])
            conn.execute(insert(LabelRow), [lab for p in news for lab in p.labels])
            conn.execute(insert(TrialRow), [
                {"sweep_id": sweep["id"], "trial": i, "job_id": p.job["id"], "params": params,
                 "rungs": {}, "decision": "running"}
                for i, ((params, _), p) in enumerate(zip(trials, news, strict=True))])
        return SweepRow(**sweep), [JobRow(**p.job) for p in news]

    def sweeps(self, who: Principal | None = None, sweep_id: str | None = None,
               limit: int | None = None, unfinished: bool = False) -> list[SweepRow]:
        """Sweeps ``who`` may see (all: None), newest first, at most ``limit``; or the one
        with ``sweep_id``; ``unfinished``: only those with a trial not yet finished (what a
        restarted server takes up, whatever the number of sweeps that ended before)."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(SweepRow).order_by(SweepRow.created_at.desc(), SweepRow.id)
            if who is not None and not who.admin:
                q = q.where(SweepRow.user_id == who.id)
            if sweep_id is not None:
                q = q.where(SweepRow.id == sweep_id)
            if unfinished:
                live = (select(TrialRow.sweep_id).join(JobRow, JobRow.id == TrialRow.job_id)
                        .where(JobRow.state.not_in(TERMINAL)))
                q = q.where(SweepRow.id.in_(live))
            return list(s.scalars(q.limit(limit)))

    def trials(self, sweep_ids: list[str]) -> list[tuple[TrialRow, JobRow]]:
        """The sweeps' trials with their jobs, in sweep and trial order."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = (select(TrialRow, JobRow).join(JobRow, JobRow.id == TrialRow.job_id)
                 .where(TrialRow.sweep_id.in_(sweep_ids))
                 .order_by(TrialRow.sweep_id, TrialRow.trial))
            return [(t, j) for t, j in s.execute(q)]

    def set_trial(self, decision: TrialDecision) -> None:
        """A sweep's decision on a trial (a server that restarts carries it out again)."""
        with self._writer, self.engine.begin() as conn:
            self._set_trial(conn, decision)

    @staticmethod
    def _set_trial(conn: Connection, d: TrialDecision) -> None:
        conn.execute(update(TrialRow).where(TrialRow.sweep_id == d.sweep_id,
                                            TrialRow.trial == d.trial)
                     .values(rungs={str(r): v for r, v in d.rungs.items()},
                             decision=d.decision))


def _new(who: Principal, request: JobRequest) -> _Pending:
    """A new job's row (queued), its first event and its labels, not yet stored."""
    job_id = f"{request.name[:31]}-{uuid.uuid4().hex[:8]}"  # at most 40: the id columns
    now = time.time()
    job = {"id": job_id, "user_id": who.id, "name": request.name,
           "spec": request.model_dump(), "state": JobState.QUEUED, "reason": "",
           "priority": request.priority, "submitted_at": now, "started_at": None,
           "finished_at": None, "submission_id": request.submission_id}
    return _Pending(job, {"job_id": job_id, "at": now, "kind": "submitted",
                          "data": {"by": who.name}},
                    [{"job_id": job_id, "key": k, "value": v} for k, v in request.labels.items()])


def _connect_args(url: str) -> dict[str, Any]:
    """libpq's own timeouts: a connection attempt gives up after ``CONNECT_TIMEOUT_S``, and
    TCP ends a connection whose peer vanished (a crashed host, a partition: keepalives
    unanswered for ~25 s, or data unacknowledged for 30 s)."""
    if not url.startswith("postgresql"):
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 10,
            "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 30_000}


class Unsticker:
    """Cuts a PostgreSQL connection whose command has waited ``stuck_s`` for an answer, with
    no other command run on it meanwhile.

    A database that hangs rather than refuses (its processes stopped, its VM paused) still
    has a kernel that acknowledges TCP, so neither keepalives nor libpq's timeouts end the
    wait: whoever waits on it (a request's thread, the store's writer, the pool's pre-ping)
    waits until it thaws. Cut, the socket reads as a lost connection: the pool drops it,
    the writer tries again, a request is answered 503. A commit that was cut may still
    land when the database thaws; a retry with the submission's id finds it (decision
    0028)."""

    def __init__(self, engine: Engine, stuck_s: float) -> None:
        self.stuck_s = stuck_s
        self._conns: weakref.WeakKeyDictionary[Any, list] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "before_cursor_execute", self._executing)
        threading.Thread(target=self._watch, args=(weakref.ref(engine),), daemon=True,
                         name="gandiva-store-unsticker").start()

    def _connected(self, dbapi_conn: Any, _record: Any) -> None:
        with self._lock:
            self._conns[dbapi_conn] = [0, None, 0]  # commands run, since when seen busy, at

    def _executing(self, conn: Connection, *_: Any) -> None:
        seen = self._conns.get(conn.connection.dbapi_connection)
        if seen is not None:
            seen[0] += 1

    def _watch(self, engine: weakref.ref) -> None:
        from psycopg.pq import TransactionStatus

        while engine() is not None:  # ends with its store
            time.sleep(self.stuck_s / 10)
            now = time.monotonic()
            with self._lock:
                conns = list(self._conns.items())
            for conn, seen in conns:
                if conn.closed or conn.info.transaction_status != TransactionStatus.ACTIVE:
                    seen[1] = None
                elif seen[1] is None or seen[2] != seen[0]:
                    seen[1], seen[2] = now, seen[0]
                elif now - seen[1] > self.stuck_s:
                    _cut(conn.fileno())
                    seen[1] = None


def _cut(fd: int) -> None:
    """End a connection's socket under whoever waits on it (they read end-of-file)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cur.execute("PRAGMA synchronous=FULL")  # a committed event survives a power cut
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()
