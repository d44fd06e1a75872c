"""The REST API (version 1): FastAPI over the store and the scheduler's local loop.

Every request carries ``Authorization: Bearer <token>``; a missing or unknown token gets 401.
Users see and act on their own jobs, admins on all; another user's job is a 404, so its id
leaks nothing (in the cluster view it is "(another user)"). A submission is stored
(committed) before it reaches the scheduler, and every transition the scheduler reports is
stored as an event: a restarted server finds every job.

The shapes follow what users know from Ray Jobs and Kueue: a job resource with a state and
a reason, sub-resources for its logs and events, verbs as POSTs (cancel, suspend, resume),
and a PATCH for what may change (its priority).

Confinement: a job runs in a directory inside its user's base directory (no absolute path,
no ``..``, no symlink out), its checkpoints and logs live in the server's own job
directory, and command arguments that are paths (absolute, or with ``..``) must lie inside
the user's base directory. The command itself runs as the server's OS user: isolating
hostile code needs per-user OS accounts or containers, which this server does not provide.
"""

import asyncio
import collections
import json
import logging
import math
import shlex
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.routing import APIRoute
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gandiva.backends.driver import Driver, JobRecord
from gandiva.node.agent import Launch
from gandiva.server import sweep_api
from gandiva.server.jobspec import JobRequest, JsonInt
from gandiva.server.metrics import Metrics
from gandiva.server.store import (
    EventRow,
    JobChange,
    JobRow,
    Principal,
    Store,
    StoreError,
    SweepRow,
)
from gandiva.server.sweeps import Sweeps
from gandiva.spec import TERMINAL, JobSpec, JobState
from gandiva.sweep.spec import SweepSpec

DASHBOARD = Path(__file__).parent / "dashboard"
FOLLOW_POLL_S = 0.25  # how often a followed log or event stream looks for more
EVENT_ID_MAX = 2**31 - 1  # events.id is a 32-bit INTEGER (on PostgreSQL)
PERSIST_TRIES = 8  # a database that went away gets about 25 s to come back
# Limits a platform team can change (``gandiva server --max-body-bytes`` ...); each refusal
# names its limit. A body is refused by its Content-Length before it is read, or as soon as
# a chunked one passes the limit: the server never holds more than this of one request.
MAX_BODY_BYTES = 1024 * 1024
MAX_UNFINISHED_PER_USER = 10_000  # a user's jobs not yet done, failed or cancelled
PAGE_DEFAULT, PAGE_MAX = 100, 1000  # jobs per page of GET /v1/jobs
VIEWERS_KEPT = 16  # readers whose encoded cluster views are kept (most recent first)
MODES = {0: "idle", 1: "exclusive"}  # a device's mode by its count of jobs (more: packed)
JOBS_KEPT = 100_000  # jobs whose encoding a reader keeps (cleared beyond)
ANONYMOUS_JOB = '{"id":null,"name":"(another user)","mine":false}'  # another user's job
# what happened to a job -> the state it leaves the job in (the rest leave it as it was)
LEAVES_IN = {**{s.value: s for s in JobState}, "released": JobState.QUEUED}
log = logging.getLogger("gandiva.server")


class JobView(BaseModel):
    id: str
    name: str
    user_id: int
    state: str  # queued, running, suspended (its turn will come), held, done, failed, cancelled
    reason: str  # why it failed or was stopped
    why: str  # the scheduler's view in words: why it is (not) running
    steps: int  # mini-batches done, as the job last reported (0 before this server saw any)
    priority: int
    gpus: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    labels: dict[str, str] = {}
    submission_id: str | None = None


class EventView(BaseModel):
    id: int
    job_id: str
    at: float
    kind: str
    data: dict[str, Any]

    @classmethod
    def of(cls, e: EventRow) -> "EventView":
        return cls(id=e.id, job_id=e.job_id, at=e.at, kind=e.kind, data=e.data)


class Change(BaseModel):
    """What a user may change of a job after submitting it."""

    model_config = ConfigDict(extra="forbid")
    priority: JsonInt = Field(ge=-100, le=100)


class Problem(BaseModel):
    detail: str


def problem(description: str) -> dict[str, Any]:
    """An error answer as documented: JSON, whatever the operation's own type (logs)."""
    return {"description": description,
            "content": {"application/json": {"schema": Problem.model_json_schema()}}}


# answers every /v1 operation may give besides its own, and those of the per-job ones
UNAUTHORIZED = {401: problem("No valid token")}
NOT_FOUND = {404: problem("No such job, or not yours")}
CONFLICT = {409: problem("Not in this state of the job")}
ADMINS_ONLY = {403: problem("Only an admin may")}
BAD_BODY = {400: problem("A body that cannot be read (not UTF-8)")}
AfterId = Annotated[int, Query(ge=0, le=EVENT_ID_MAX, description="An event id")]


def last_event_id(header: str | None, default: int) -> int:
    """The id a reconnecting event-stream client sends back, if it is one of ours."""
    if header and header.isascii() and header.isdigit() and int(header) <= EVENT_ID_MAX:
        return int(header)
    return default


def finite(value: Any) -> Any:
    """``value`` as JSON can carry it: the floats JSON cannot write (NaN, Infinity) as text,
    and strings with lone surrogates (JSON's "\\udc80" reads as one, UTF-8 cannot encode
    it) with those escaped."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {finite(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before it is read (by
    its Content-Length) or as soon as it passes the limit (a chunked one). Then the app is
    told the client went away, and whatever it answers to that is dropped."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        seen, refused, started = 0, False, False

        async def counted() -> dict:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit and not started:
                refused = True
                await self._refuse(send)
                return {"type": "http.disconnect"}
            return message

        async def watched(message: dict) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body over the limit of {self.limit} bytes "
                                     "(the server's --max-body-bytes)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def resolved(path: Path) -> Path | None:
    """``path`` with its symlinks followed; None if it cannot be (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return None


class Explanation(BaseModel):
    state: str
    reason: str
    queue_position: int | None
    needs: str | None
    # decided, and not yet confirmed by its node: starting, suspending, resuming, moving...
    transition: str | None = None


class WhoAmI(BaseModel):
    name: str
    admin: bool


class Sample(BaseModel):
    at: float
    allocated: int
    busy: float


class Utilisation(BaseModel):
    total: int
    samples: list[Sample]


def to_scheduler(job_id: str, req: JobRequest, cwd: Path) -> tuple[JobSpec, Launch]:
    """The scheduler's view (JobSpec) and the agent's (Launch) of a request.

    Decision: ``python``/``python3`` as the program means the server's own interpreter, so a
    job runs with the packages the server has (torch, the job library), and can start in a
    warm process."""
    command = list(req.command)
    if command[0] in ("python", "python3"):
        command[0] = "{python}"
    spec = JobSpec(job_id, 0.0, req.gpus, req.model, priority=req.priority,
                   min_gpus=req.elastic.min if req.elastic else None,
                   max_gpus=req.elastic.max if req.elastic else None)
    return spec, Launch(command, cwd=cwd, env=dict(req.env))


def unprocessable_query(field: str, msg: str) -> HTTPException:
    return HTTPException(422, detail=[{"loc": ["query", field], "msg": msg,
                                       "type": "value_error"}])


def unprocessable(field: str, msg: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors: the field, and what to do."""
    return HTTPException(422, detail=[{"loc": ["body", field], "msg": msg,
                                       "type": "value_error"}])


def _encoded(job_id: str, name: str) -> tuple[str, str]:
    """A job in the cluster view, encoded as its owner and as an admin see it."""
    return tuple(json.dumps({"id": job_id, "name": name, "mine": mine}, separators=(",", ":"))
                 for mine in (True, False))


class AsSeen(dict):
    """Job -> its encoding in the cluster view as one reader sees it, filled on first use
    (so that joining a device's jobs is one ``map``)."""

    def __init__(self, encode: Callable[[str, Principal], str], who: Principal) -> None:
        super().__init__()
        self.encode, self.who = encode, who

    def __missing__(self, job_id: str) -> str:
        encoded = self[job_id] = self.encode(job_id, self.who)
        return encoded


class Service:
    """The store and the scheduler's loop, joined: what the API calls."""

    def __init__(self, store: Store, backend: Driver, base_dir: Path,
                 max_unfinished_per_user: int = MAX_UNFINISHED_PER_USER) -> None:
        self.store = store
        self.backend = backend
        self.base_dir = base_dir
        self.metrics = Metrics(backend)
        self.max_unfinished_per_user = max_unfinished_per_user
        self.unfinished: collections.Counter[int] = collections.Counter()  # user id -> jobs
        self._counted: dict[str, int] = {}  # job id -> its user, while counted unfinished
        self._count_lock = threading.Lock()
        self._unstored: list[JobChange] = []  # what the loop reported, until it is flushed
        self._points: list[dict[str, Any]] = []  # metric points reported, until flushed
        self.sweeps = Sweeps(self)
        # reader -> (node -> (the view's node, its part encoded for that reader), the jobs
        # as that reader sees them)
        self._views: dict[int, tuple[dict[int, tuple[dict, str]], AsSeen]] = {}
        self._views_lock = threading.Lock()
        # job -> (its user, it encoded for the cluster view as its user and as an admin see
        # it), from its submission until it ends (``_own``, ``_job_json``)
        self._owned: dict[str, tuple[int, str, str]] = {}
        self._device_heads: dict[int, str] = {}  # device -> its part before its jobs, encoded
        backend.on_change = self._persist
        backend.on_flush = self._store
        backend.on_points = self._on_points

    def user_dir(self, who: Principal) -> Path:
        return self.base_dir / "users" / who.name

    def workdir(self, who: Principal, req: JobRequest) -> Path:
        """The job's directory, checked to lie inside the user's base directory (a symlink
        out of it is refused too), and the command's path arguments with it."""
        base = self.user_dir(who).resolve()
        cwd = resolved(base / req.workdir)
        if cwd is None or not cwd.is_relative_to(base):
            raise unprocessable("workdir", f"{req.workdir!r} leads out of your base directory "
                                f"({base}); give a directory inside it")
        try:
            is_dir = cwd.is_dir()
        except OSError:  # e.g. a name longer than the filesystem allows
            is_dir = False
        if not is_dir:
            raise unprocessable("workdir", f"{req.workdir!r} does not exist in your base "
                                f"directory ({base}); create it first")
        for i, arg in enumerate(req.command):
            for value in (arg, arg.partition("=")[2]):  # --data=/elsewhere names a path too
                path = Path(value)
                if value and (path.is_absolute() or ".." in path.parts) and \
                        not (resolved(cwd / path) or Path("/")).is_relative_to(base):
                    raise unprocessable("command", f"argument {i} ({shlex.quote(arg)}) names a "
                                        f"path outside your base directory ({base}); put the "
                                        "file there and name it relative to the workdir")
        return cwd

    def submit(self, who: Principal, req: JobRequest) -> JobRow:
        """Store and queue a job; a ``submission_id`` used before returns that job (before
        any other check: a retry of a job that exists is never refused)."""
        if req.submission_id is not None:
            earlier = self.store.by_submission(who, req.submission_id)
            if earlier is not None:
                return self._same(earlier, req)
        cwd = self.workdir(who, req)
        if req.gpus > len(self.backend.devices):
            raise unprocessable("gpus", f"{req.gpus} GPUs asked; this cluster has "
                                f"{len(self.backend.devices)}")
        with self._count_lock:
            if self.unfinished[who.id] >= self.max_unfinished_per_user:
                raise HTTPException(429, f"you have {self.unfinished[who.id]} jobs not yet "
                                    f"finished, the limit per user "
                                    f"(--max-unfinished-per-user); wait for some or cancel them")
            self.unfinished[who.id] += 1  # this submission's place, while it is stored
        row = None
        try:
            row = self.store.add_job(who, req)  # committed before the scheduler sees it
        finally:
            with self._count_lock:
                if row is not None and row.created:
                    self._counted[row.id] = who.id  # the place becomes the job's
                else:
                    self.unfinished[who.id] -= 1
        if not row.created:  # a concurrent retry stored it first
            return self._same(row, req)
        self.metrics.submitted.inc()
        self._own(row.id, who.id, req.name)
        self.backend.submit(*to_scheduler(row.id, req, cwd), time_limit=req.time_limit)
        return row

    def submit_sweep(self, who: Principal, spec: SweepSpec) -> tuple[SweepRow, list[JobRow]]:
        """Store a sweep and its trials (one transaction), then queue every trial: each is
        checked as a job submission is (its directory, its paths, the cluster's size, the
        user's limit of unfinished jobs), all before any is stored."""
        sweep_id = f"{spec.name[:31]}-{uuid.uuid4().hex[:8]}"
        params = spec.draw()
        requests = [spec.trial_request(i, p, sweep_id) for i, p in enumerate(params)]
        cwds = [self.workdir(who, r) for r in requests]
        if spec.gpus > len(self.backend.devices):
            raise unprocessable("gpus", f"{spec.gpus} GPUs asked for each trial; this "
                                f"cluster has {len(self.backend.devices)}")
        n = len(requests)
        with self._count_lock:
            if self.unfinished[who.id] + n > self.max_unfinished_per_user:
                raise HTTPException(429, f"{n} trials and your {self.unfinished[who.id]} "
                                    "jobs not yet finished pass the limit per user "
                                    f"({self.max_unfinished_per_user}, "
                                    "--max-unfinished-per-user); ask for fewer trials")
            self.unfinished[who.id] += n  # the trials' places, while they are stored
        try:
            sweep, rows = self.store.add_sweep(who, sweep_id, spec.name,
                                               spec.model_dump(mode="json"),
                                               list(zip(params, requests, strict=True)))
        except BaseException:
            with self._count_lock:
                self.unfinished[who.id] -= n
            raise
        with self._count_lock:
            self._counted.update({row.id: who.id for row in rows})
        self.sweeps.add(sweep_id, spec, [row.id for row in rows])  # before any can report
        for row, request, cwd in zip(rows, requests, cwds, strict=True):
            self.metrics.submitted.inc()
            self._own(row.id, who.id, request.name)
            self.backend.submit(*to_scheduler(row.id, request, cwd),
                                time_limit=request.time_limit)
        return sweep, rows

    @staticmethod
    def _same(earlier: JobRow, req: JobRequest) -> JobRow:
        """The job a submission_id made, if this is a retry of the same spec; a different
        spec under a used id is a client's mistake, refused (409), never silently merged."""
        if earlier.spec != req.model_dump():
            raise HTTPException(409, f"submission_id {req.submission_id!r} was used for "
                                f"another spec (job {earlier.id}); choose a new id")
        return earlier

    def _count(self, job_id: str, user_id: int) -> None:
        with self._count_lock:
            if job_id not in self._counted:
                self._counted[job_id] = user_id
                self.unfinished[user_id] += 1

    def _uncount(self, job_id: str) -> None:
        with self._count_lock:
            user_id = self._counted.pop(job_id, None)
            if user_id is not None:
                self.unfinished[user_id] -= 1

    def resume_unfinished(self) -> int:
        """After a restart: give the scheduler every job not yet finished; those that had
        started restore from their latest checkpoints. Held jobs stay held."""
        n = 0
        for row in self.store.unfinished():
            req = JobRequest.model_validate(row.spec).model_copy(
                update={"priority": row.priority})
            owner = self.store.owner(row.id)
            cwd = self.user_dir(owner) / req.workdir
            self._own(row.id, owner.id, row.name)
            self._count(row.id, owner.id)
            held = row.state == JobState.HELD
            if not held:
                self.store.record(row.id, "requeued", {"after": "server restart"},
                                  state=JobState.QUEUED)
            self.backend.submit(*to_scheduler(row.id, req, cwd), time_limit=req.time_limit,
                                held=held)
            n += 1
        self.sweeps.load()  # after their trials are back in the scheduler
        return n

    def _live(self, row: JobRow) -> None:
        if row.state in TERMINAL:
            raise HTTPException(409, f"job {row.id!r} is {row.state} already")

    def cancel(self, who: Principal, row: JobRow) -> None:
        self._live(row)
        self.store.record(row.id, "cancel-requested", {"by": who.name})
        self.backend.cancel(row.id)

    def hold(self, who: Principal, row: JobRow) -> None:
        self._live(row)
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

    def change(self, who: Principal, row: JobRow, change: Change) -> None:
        self._live(row)
        self.store.record(row.id, "priority", {"by": who.name, "from": row.priority,
                                               "to": change.priority},
                          priority=change.priority)
        self.backend.set_priority(row.id, change.priority)

    def why(self, row: JobRow) -> str:
        if row.state in TERMINAL:
            return row.reason or row.state
        try:
            return self.backend.explain(row.id)["reason"]
        except ValueError:
            return ""

    def steps(self, row: JobRow) -> int:
        rec = self.backend.records.get(row.id)
        return rec.steps if rec is not None else 0

    def view(self, row: JobRow) -> JobView:
        return JobView(id=row.id, name=row.name, user_id=row.user_id, state=row.state,
                       reason=row.reason, why=self.why(row), steps=self.steps(row),
                       priority=row.priority,
                       gpus=row.spec["gpus"], submitted_at=row.submitted_at,
                       started_at=row.started_at, finished_at=row.finished_at,
                       labels=row.spec.get("labels") or {},
                       submission_id=row.submission_id)

    def cluster_json(self, who: Principal) -> bytes:
        """The backend's view, each job named, or anonymous if ``who`` may not see it; as
        JSON. Each node's part is encoded once per reader and kept while the backend's view
        has the same node (see ``Driver.view``); a part is joined from encodings kept per
        job (``AsSeen``) and per device. At a thousand servers, encoding 8,000 devices and
        20,000 jobs at every request of every dashboard cost the API its latency. Between two
        views most nodes do not change; in a round most do, and then joining kept encodings
        took 10-12 ms where encoding each node whole took about 50 (1,000 x 8, 20,000 jobs,
        1.6 MB; the same bytes)."""
        view = self.backend.view()
        with self._views_lock:
            kept = self._views.pop(who.id, None) or ({}, AsSeen(self._job_json, who))
            self._views[who.id] = kept  # the most recent readers' parts are kept
            while len(self._views) > VIEWERS_KEPT:
                del self._views[next(iter(self._views))]
        nodes, as_seen = kept
        if len(as_seen) > JOBS_KEPT:  # (mostly jobs long finished)
            as_seen.clear()
        parts = []
        for node in view["nodes"]:
            hit = nodes.get(node["id"])
            if hit is None or hit[0] is not node:
                hit = nodes[node["id"]] = (node, self._node_json(node, as_seen))
            parts.append(hit[1])
        rest = json.dumps({**{k: v for k, v in view.items() if k != "nodes"},
                           "queue": [j if who.admin or self._owned.get(j, (None,))[0] == who.id
                                     else None for j in view["queue"]]},
                          separators=(",", ":"))
        return f'{rest[:-1]},"nodes":[{",".join(parts)}]}}'.encode()

    def _node_json(self, node: dict, as_seen: AsSeen) -> str:
        job = as_seen.__getitem__
        devices = []
        for d in node["devices"]:
            head = self._device_heads.get(d["id"])
            if head is None:
                kind = self.backend.cluster.gpus[d["id"]].type
                head = self._device_heads[d["id"]] = (
                    f'{{"id":{d["id"]},"name":{json.dumps(d["name"])},'
                    f'"kind":{json.dumps(kind)},"jobs":[')
            jobs = d["jobs"]
            devices.append(f'{head}{",".join(map(job, jobs))}],'
                           f'"mode":"{MODES.get(len(jobs), "packed")}"}}')
        up = node["up"]
        return (f'{{"id":{node["id"]},"up":{"true" if up else "false"},'
                f'"name":"node{node["id"]}{"" if up else " (down)"}",'
                f'"time_sliced":[{",".join(map(job, node["time_sliced"]))}],'
                f'"devices":[{",".join(devices)}]}}')

    def _own(self, job_id: str, user: int, name: str) -> None:
        """Whose the job is, and its encodings in the cluster view, made once as it is
        submitted (on the API's thread, not when a reader first sees it in a view)."""
        self._owned[job_id] = (user, *_encoded(job_id, name))

    def _job_json(self, job_id: str, who: Principal) -> str:
        """A job in the cluster view as ``who`` sees it, encoded: named if it is theirs or
        they are an admin, else anonymous."""
        user, as_owner, as_admin = self._owned.get(job_id) or (None, *_encoded(job_id, job_id))
        if user == who.id:
            return as_owner
        return as_admin if who.admin else ANONYMOUS_JOB

    def _persist(self, rec: JobRecord, what: str) -> None:
        state = LEAVES_IN.get(what)
        data: dict[str, Any] = {"steps": rec.steps, "restarts": rec.restarts}
        if what in ("running", "migrated", "resized"):
            data["devices"] = list(rec.devices)
        if what in ("profile", "feedback", "done"):
            data.update(rec.profile, metrics=dict(rec.metrics))
        reason = rec.reason if what in ("failed", "restarted", "cancelled") else None
        if state in TERMINAL:
            self._uncount(rec.spec.id)
            self.sweeps.forget(rec.spec.id)
            self._owned.pop(rec.spec.id, None)
        self.metrics.changed(what, state)
        self._unstored.append(JobChange(rec.spec.id, what, data, state, reason))

    def _on_points(self, rec: JobRecord, series: dict[str, list[list[float]]]) -> None:
        """(The loop.) A job's metric points: kept until the next flush, and judged if the
        job is a sweep's trial."""
        now = time.time()
        series = {name[:64]: [(int(step), float(value)) for step, value in points
                              if 0 <= step <= sweep_api.STEP_MAX and math.isfinite(value)]
                  for name, points in series.items()}
        self._points.extend({"job_id": rec.spec.id, "name": name, "step": step,
                             "value": value, "at": now}
                            for name, points in series.items() for step, value in points)
        self.sweeps.observe(rec.spec.id, series)

    def _store(self) -> None:
        """(The loop's ``on_flush``.) Store the metric points reported since the last flush
        (one INSERT; a batch the database refuses costs a curve a few dots, never a job its
        state: it is not retried), then every change reported since, in one transaction,
        before the actions they describe go to the nodes."""
        points, self._points = self._points, []
        try:
            self.store.add_points(points)
        except SQLAlchemyError as e:
            log.warning("dropped %d metric points: %s", len(points), e)
        changes, self._unstored = self._unstored, []
        if not changes:
            return
        for attempt in range(PERSIST_TRIES):
            try:
                for why in self.store.record_many(changes):  # e.g. a job that ended as it
                    log.warning("not stored: %s", why)  # was cancelled
                return
            except OperationalError as e:  # the database is down or restarting: wait for it
                log.warning("cannot store %d changes (%s); retrying", len(changes), e)
                time.sleep(min(0.1 * 2 ** attempt, 8.0))
        # the scheduler goes on: a lost transition is corrected by the next one it stores
        log.error("gave up storing %d changes: the database is unreachable", len(changes))


class UserInfo(BaseModel):
    name: str
    admin: bool
    created_at: float
    revoked_at: float | None


class NewToken(BaseModel):
    name: str
    token: str


def create_app(service: Service, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="gandiva", version="1", responses=UNAUTHORIZED,
                  description="Submit, watch and steer training jobs on a gandiva cluster.")
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    store = service.store

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, but an input of NaN or Infinity (Python's JSON reads them) is
        echoed as text: JSON cannot carry it, and the answer would be a 500."""
        return JSONResponse({"detail": finite(jsonable_encoder(exc.errors()))}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """A 405's Allow names the methods of every route of the path, not of one."""
        allowed = {m for r in app.router.routes if isinstance(r, APIRoute)
                   and r.path_regex.match(request.url.path) for m in r.methods}
        if exc.status_code == 405 and allowed:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(allowed))}
        return await http_exception_handler(request, exc)

    async def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        """On the event loop for a known token; an unknown one is looked up in a worker
        thread (a flood of bad tokens must not stall the loop)."""
        scheme, _, token = (authorization or "").partition(" ")
        who = None
        if scheme.lower() == "bearer" and token:
            who = store.known(token) or await run_in_threadpool(store.principal, token)
        if who is None:
            raise HTTPException(401, "give a valid token: Authorization: Bearer <token>",
                                headers={"WWW-Authenticate": "Bearer"})
        return who

    Who = Annotated[Principal, Depends(principal)]

    def admin(who: Who) -> Principal:
        if not who.admin:
            raise HTTPException(403, "only an admin may manage users")
        return who

    Admin = Annotated[Principal, Depends(admin)]

    def visible(who: Principal, job_id: str) -> JobRow:
        row = store.job(who, job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return row

    sweep_api.routes(app, service, Who, visible, NOT_FOUND, BAD_BODY)

    @app.get("/v1/whoami")
    def whoami(who: Who) -> WhoAmI:
        return WhoAmI(name=who.name, admin=who.admin)

    @app.post("/v1/jobs", status_code=201, response_model=JobView, responses={
        **BAD_BODY, 200: {"description": "A submission_id used before: the job it made",
                          "model": JobView},
        409: problem("A submission_id used before for another spec"),
        413: problem("A body over the server's limit"),
        429: problem("Too many of your jobs are not finished yet")})
    def submit(req: JobRequest, who: Who) -> Response:
        row = service.submit(who, req)
        # serialised here, once: a returned model would be validated again against itself
        return Response(service.view(row).model_dump_json(), status_code=201 if row.created
                        else 200, media_type="application/json")

    @app.get("/v1/jobs", responses={404: problem("``after`` names no job of yours")})
    def jobs(request: Request, response: Response, who: Who,
             state: Annotated[str | None, Query(
                 description="Comma-separated states, e.g. queued,running")] = None,
             label: Annotated[list[str], Query(
                 description="key=value, or key (any value); repeat for jobs with all of "
                             "them")] = [],  # noqa: B006 (FastAPI copies a default)
             user: Annotated[str | None, Query(description="Only this user's jobs (admins)")]
             = None,
             after: Annotated[str | None, Query(description="The last job id of the page "
                                                "before: this page continues after it")] = None,
             limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT) -> list[JobView]:
        """Your jobs (an admin: everyone's), newest first, a page at a time: the ``Link``
        header's ``rel="next"`` is the next page's URL while there are more."""
        states = tuple(s for s in (state or "").split(",") if s)
        labels: dict[str, str | None] = {}
        for item in label or []:
            key, sep, value = item.partition("=")
            if key:  # key=value: that value; key alone: any value (Kubernetes' "exists")
                labels[key] = value if sep else None
        try:
            rows = store.jobs(who, states, limit + 1, after=after or None, user=user,
                              labels=labels)
        except StoreError as e:  # a cursor naming no job (or none of yours)
            raise HTTPException(404, str(e)) from None
        if len(rows) > limit:
            rows = rows[:limit]
            params = [(k, v) for k, v in request.query_params.multi_items() if k != "after"]
            url = f"{request.url.path}?{urlencode([*params, ('after', rows[-1].id)])}"
            response.headers["Link"] = f'<{url}>; rel="next"'
        return [service.view(r) for r in rows]

    @app.get("/v1/jobs/{job_id}", responses=NOT_FOUND)
    def job(job_id: str, who: Who) -> JobView:
        return service.view(visible(who, job_id))

    @app.patch("/v1/jobs/{job_id}", responses={**BAD_BODY, **NOT_FOUND, **CONFLICT})
    def change(job_id: str, change: Change, who: Who) -> JobView:
        """Change a job's priority; the policy takes it into account at once."""
        service.change(who, visible(who, job_id), change)
        return service.view(visible(who, job_id))

    @app.post("/v1/jobs/{job_id}/cancel", responses={**NOT_FOUND, **CONFLICT})
    def cancel(job_id: str, who: Who) -> JobView:
        """Cancel a queued, running, suspended or held job (its processes are stopped)."""
        service.cancel(who, visible(who, job_id))
        return service.view(visible(who, job_id))

    @app.post("/v1/jobs/{job_id}/suspend", responses={**NOT_FOUND, **CONFLICT})
    def suspend(job_id: str, who: Who) -> JobView:
        """Hold a job: it checkpoints at its next mini-batch boundary and gives up its
        devices until resumed (state "held")."""
        service.hold(who, visible(who, job_id))
        return service.view(visible(who, job_id))

    @app.post("/v1/jobs/{job_id}/resume", responses={**NOT_FOUND, **CONFLICT})
    def resume(job_id: str, who: Who) -> JobView:
        """Give a held job back to the scheduler; it continues from its checkpoint."""
        service.release(who, visible(who, job_id))
        return service.view(visible(who, job_id))

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse, responses=NOT_FOUND)
    def logs(job_id: str, who: Who, tail: Annotated[int, Query(ge=1, le=100_000)] = 200,
             rank: Annotated[int, Query(ge=0, le=1023)] = 0,
             follow: Annotated[bool, Query(description="Keep sending new lines until the "
                                                       "job ends")] = False) -> Response:
        """The last ``tail`` lines of the job's output (one rank's), across its restarts."""
        visible(who, job_id)
        read = service.backend.read_log
        text = read(job_id, rank)
        start = b"".join(line + b"\n" for line in text.splitlines()[-tail:])
        if not follow:
            return PlainTextResponse(start)

        async def more() -> AsyncIterator[bytes]:
            yield start
            offset = len(text)
            while True:
                ended = store.job(who, job_id).state in TERMINAL  # then one last read
                chunk = await asyncio.to_thread(read, job_id, rank, offset)
                if chunk:
                    offset += len(chunk)
                    yield chunk
                elif ended:
                    return
                await asyncio.sleep(FOLLOW_POLL_S)

        return StreamingResponse(more(), media_type="text/plain")

    @app.get("/v1/jobs/{job_id}/explain", responses=NOT_FOUND)
    def explain(job_id: str, who: Who) -> Explanation:
        """Why is my job pending? Its state, the reason in words, its place in line."""
        row = visible(who, job_id)
        try:
            return Explanation(**service.backend.explain(job_id))
        except ValueError:  # stored but not (yet) given to the scheduler, or long finished
            return Explanation(state=row.state, reason=service.why(row) or row.state,
                               queue_position=None, needs=None)

    @app.get("/v1/jobs/{job_id}/events", responses=NOT_FOUND)
    def job_events(job_id: str, who: Who, after: AfterId = 0,
                   limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> list[EventView]:
        """The job's events after event id ``after``, oldest first."""
        visible(who, job_id)
        return [EventView.of(e) for e in store.events(job_id, after, limit)]

    @app.get("/v1/events")
    def events(who: Who, after: AfterId = 0, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000
               ) -> list[EventView]:
        """Events of every job you may see, after event id ``after``, oldest first."""
        return [EventView.of(e) for e in store.all_events(who, after, limit)]

    @app.get("/v1/events/stream", response_class=EventSourceResponse)
    async def event_stream(request: Request, who: Who, after: AfterId = 0
                           ) -> AsyncIterator[ServerSentEvent]:
        """The same events as a server-sent event stream that stays open; a client that
        reconnects with ``Last-Event-ID`` continues where it left off."""
        last = last_event_id(request.headers.get("last-event-id"), after)
        while not await request.is_disconnected():
            batch = await asyncio.to_thread(store.all_events, who, last, 1000)
            for e in batch:
                last = e.id
                yield ServerSentEvent(data=EventView.of(e), event=e.kind, id=str(e.id))
            if not batch:
                await asyncio.sleep(FOLLOW_POLL_S)

    @app.get("/v1/cluster")
    def cluster(who: Who) -> Response:
        """Nodes and devices: which jobs run on each (two or more: packed), which wait for
        their turn on each over-subscribed server (time-sliced), and the queue."""
        return Response(service.cluster_json(who), media_type="application/json")

    @app.get("/v1/utilisation")
    def utilisation(who: Who, since: float = 0.0) -> Utilisation:
        """Devices holding a job, and the utilisation jobs report, sampled every second
        (the last day of them; ask for those ``since`` the last you have)."""
        samples = [Sample(at=at, allocated=n, busy=busy)
                   for at, n, busy in list(service.backend.samples) if at >= since]
        return Utilisation(total=len(service.backend.devices), samples=samples)

    @app.get("/v1/users", responses=ADMINS_ONLY)
    def users(who: Admin) -> list[UserInfo]:
        """Every user, with whether their token is revoked (admins)."""
        return [UserInfo(name=u.name, admin=u.admin, created_at=u.created_at,
                         revoked_at=u.revoked_at) for u in store.users()]

    @app.post("/v1/users/{name}/revoke", responses={**NOT_FOUND, **ADMINS_ONLY})
    def revoke(name: str, who: Admin) -> UserInfo:
        """The user's token stops working at once (admins); their jobs go on."""
        try:
            store.revoke(name)
        except StoreError as e:
            raise HTTPException(404, str(e)) from None
        return next(UserInfo(**vars(u)) for u in store.users() if u.name == name)

    @app.post("/v1/users/{name}/rotate", responses={**NOT_FOUND, **ADMINS_ONLY})
    def rotate(name: str, who: Admin) -> NewToken:
        """A new token for the user, shown once; the old one stops working at once."""
        try:
            return NewToken(name=name, token=store.rotate(name))
        except StoreError as e:
            raise HTTPException(404, str(e)) from None

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        """The process answers (liveness)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """The store answers and the scheduler's loop is alive (readiness)."""
        problems = []
        try:
            with store.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as e:
            problems.append(f"store: {type(e).__name__}")
        if not service.backend.alive():
            problems.append("scheduler loop: not running")
        return JSONResponse({"status": "not ready" if problems else "ok",
                             "problems": problems}, status_code=503 if problems else 200)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(service.metrics.scrape(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/")

    app.mount("/ui", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    return app
