"""The REST API (version 1): FastAPI over the store and the scheduler's loop (``Service``).

Every request carries ``Authorization: Bearer <token>``; a missing or unknown token gets 401.
Users see and act on their own jobs, admins on all; another user's job is a 404, so its id
leaks nothing (in the cluster view it is "(another user)"). A submission is stored
(committed) before it reaches the scheduler, and every transition the scheduler reports is
stored as an event, in order, by the service's writer: a restarted server finds every job.

The shapes follow what users know from Ray Jobs and Kueue: a job resource with a state and
a reason, sub-resources for its logs and events, verbs as POSTs (cancel, suspend, resume),
and a PATCH for what may change (its priority). Where a job may run and what it may name:
``confinement``.
"""

import asyncio
import json
import math
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
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
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gandiva.backends.nodes import newest_checkpoint
from gandiva.server import sweep_api, usage_api
from gandiva.server.confinement import unprocessable
from gandiva.server.jobspec import (
    MAX_LABELS,
    NAME_PATTERN,
    JobRequest,
    JsonInt,
    check_name,
)
from gandiva.server.persistence import transient
from gandiva.server.service import Service
from gandiva.server.store import (
    TICKETS_MAX,
    EventRow,
    JobRow,
    Principal,
    StoreBusy,
    StoreError,
    UnknownTeam,
)
from gandiva.server.views import JobView
from gandiva.spec import TERMINAL

__all__ = ["Service", "create_app"]

DASHBOARD = Path(__file__).parent / "dashboard"
FOLLOW_POLL_S = 0.25  # how often a followed log or event stream looks for more
EVENT_ID_MAX = 2**31 - 1  # events.id is a 32-bit INTEGER (on PostgreSQL)
# a database restart or failover takes seconds; a client told to come back sooner only adds
# load while it is away
STORE_RETRY_AFTER_S = 5
PROBE_S = 2.0  # /readyz waits this long for the database's answer
DISK_WARN_S = 300.0  # /readyz warns of checkpoints a disk refused this recently
# Limits a platform team can change (``gandiva server --max-body-bytes`` ...); each refusal
# names its limit. A body is refused by its Content-Length before it is read, or as soon as
# a chunked one passes the limit: the server never holds more than this of one request.
MAX_BODY_BYTES = 1024 * 1024
PAGE_DEFAULT, PAGE_MAX = 100, 1000  # jobs per page of GET /v1/jobs
TAIL_BYTES = 4 * 1024 * 1024  # ``logs?tail=`` reads at most this much of a log's end
FOLLOW_CHUNK_BYTES = 1024 * 1024  # a followed log is read and sent in pieces of at most this
STREAMS_PER_USER = 8  # open log follows and event streams of one user, together


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


class Guarded:
    """ASGI middleware: every response says that its page may load only the server's own
    scripts, styles and images, may not be framed, and is of the type it says."""

    HEADERS = [(b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'"),
               (b"x-content-type-options", b"nosniff")]

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        async def guarded(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, guarded if scope["type"] == "http" else send)


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


class Explanation(BaseModel):
    state: str
    reason: str
    queue_position: int | None
    needs: str | None
    # decided, and not yet confirmed by its node: starting, suspending, resuming, moving...
    transition: str | None = None
    # where the job's team stands against its quota (none: no team has a quota)
    share: str | None = None


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


class UserInfo(BaseModel):
    name: str
    admin: bool
    created_at: float
    revoked_at: float | None
    os_user: str | None = Field(None, description="The OS account the user's jobs run as "
                                "(on a server run as root); none: their dynamic uid")
    uid: int | None = Field(None, description="The user's dynamic uid")
    team: str | None = Field(None, description="The user's team (none: no team)")
    tickets: int = Field(1, description="The user's weight inside their team's share")


TICKETS = "Weight in the fair shares: twice the tickets, twice the share"
QUOTA = "GPUs the team is guaranteed (none: no guarantee, its tickets alone)"
# (pydantic writes a bound on an optional JsonInt as "ge", which JSON Schema does not know)
MaybeTickets = Annotated[JsonInt | None, WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 1, "maximum": TICKETS_MAX}, {"type": "null"}]})]
MaybeGpus = Annotated[JsonInt | None, WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0}, {"type": "null"}]})]


class TeamSpec(BaseModel):
    """A new team (admins)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(json_schema_extra={"pattern": NAME_PATTERN})
    tickets: JsonInt = Field(1, ge=1, le=TICKETS_MAX, description=TICKETS)
    quota_gpus: MaybeGpus = Field(None, ge=0, description=QUOTA)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        check_name(value)
        return value


class TeamChange(BaseModel):
    """What an admin may change of a team; what is left out stays."""

    model_config = ConfigDict(extra="forbid")
    tickets: MaybeTickets = Field(None, ge=1, le=TICKETS_MAX, description=TICKETS)
    quota_gpus: MaybeGpus = Field(None, ge=0, description=QUOTA)


class UserChange(BaseModel):
    """An admin moves a user to a team (null: to none) or sets their tickets in it."""

    model_config = ConfigDict(extra="forbid")
    team: str | None = None
    tickets: MaybeTickets = Field(None, ge=1, le=TICKETS_MAX, description=TICKETS)


class TeamInfo(BaseModel):
    name: str
    tickets: int
    quota_gpus: int | None
    members: list[str]


class NewToken(BaseModel):
    name: str
    token: str


class Streams:
    """Counts each user's open streams (followed logs, event streams): each holds a
    connection and polls, so one user may not open them without end."""

    def __init__(self, limit: int = STREAMS_PER_USER) -> None:
        self.limit = limit
        self.open: Counter[int] = Counter()
        self._lock = threading.Lock()

    def take(self, who: Principal) -> Iterator[None]:
        """A dependency (with ``yield``): the slot is given back once the response ends."""
        with self._lock:
            if self.open[who.id] >= self.limit:
                raise HTTPException(429, f"{who.name} has {self.limit} log or event streams "
                                         "open already, the most one user may: close one")
            self.open[who.id] += 1
        try:
            yield
        finally:
            with self._lock:
                self.open[who.id] -= 1


def create_app(service: Service, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    # no /docs: FastAPI's pages load scripts from a CDN, which the policy above refuses;
    # the schema is at /openapi.json for any OpenAPI viewer (decision 0030)
    app = FastAPI(title="gandiva", version="1", responses=UNAUTHORIZED,
                  docs_url=None, redoc_url=None,
                  description="Submit, watch and steer training jobs on a gandiva cluster.")
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(Guarded)  # the outermost: a 413 carries its headers too
    store = service.store

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, but an input of NaN or Infinity (Python's JSON reads them) is
        echoed as text: JSON cannot carry it, and the answer would be a 500."""
        return JSONResponse({"detail": finite(jsonable_encoder(exc.errors()))}, 422)

    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(StoreBusy)
    async def store_away(request: Request, exc: Exception) -> JSONResponse:
        """The database is down, restarting, locked or hung: 503 with Retry-After, so a
        client retries. A write is acknowledged only once committed; one cut off while it
        committed may still land, and a retry with its submission_id finds that job."""
        if isinstance(exc, SQLAlchemyError) and not transient(exc):
            raise exc
        service.metrics.store_unavailable.inc()
        return JSONResponse(
            {"detail": "the database did not answer, so this request is not done: retry in "
                       f"{STORE_RETRY_AFTER_S} s, a submission with the same submission_id "
                       "(GET /readyz says when the store is back)"},
            503, headers={"Retry-After": str(STORE_RETRY_AFTER_S)})

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
    streams = Streams()

    def stream_slot(who: Who) -> Iterator[None]:
        """A stream's slot, held until its response ends."""
        yield from streams.take(who)

    def log_slot(who: Who, follow: bool = False) -> Iterator[None]:
        """A log takes a slot only when followed."""
        yield from streams.take(who) if follow else iter([None])

    def bearer(authorization: Annotated[str | None, Header()] = None) -> str:
        """The caller's token, which a stream checks again at each poll: a revoked or
        rotated one ends the stream."""
        return (authorization or "").partition(" ")[2]

    Token = Annotated[str, Depends(bearer)]

    def admin(who: Who) -> Principal:
        if not who.admin:
            raise HTTPException(403, "only an admin may manage users and teams")
        return who

    Admin = Annotated[Principal, Depends(admin)]

    def visible(who: Principal, job_id: str) -> JobRow:
        row = store.job(who, job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return row

    # (looked up at each request: the routes are built without a service for the schema)
    sweep_api.routes(app, store, lambda who, spec: service.submit_sweep(who, spec),
                     lambda job_id: newest_checkpoint(service.backend.agent, job_id), Who,
                     visible, NOT_FOUND, BAD_BODY)
    usage_api.routes(app, store, lambda: len(service.backend.devices), Who, BAD_BODY)

    @app.get("/v1/whoami")
    def whoami(who: Who) -> WhoAmI:
        return WhoAmI(name=who.name, admin=who.admin)

    @app.post("/v1/jobs", status_code=201, response_model=JobView, responses={
        **BAD_BODY, 200: {"description": "A submission_id used before: the job it made",
                          "model": JobView},
        403: problem("A priority above the ceiling a member may set"),
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
                 max_length=MAX_LABELS,  # (each is a clause of the query: a job has no more)
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

    @app.patch("/v1/jobs/{job_id}", responses={
        **BAD_BODY, **NOT_FOUND, **CONFLICT,
        403: problem("A priority above the ceiling a member may set")})
    def change(job_id: str, change: Change, who: Who) -> JobView:
        """Change a job's priority; the policy takes it into account at once."""
        service.change(who, visible(who, job_id), change.priority)
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

    too_many = {429: problem(f"{STREAMS_PER_USER} streams of yours open already")}

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse,
             dependencies=[Depends(log_slot)], responses={**NOT_FOUND, **too_many})
    def logs(job_id: str, who: Who, token: Token,
             tail: Annotated[int, Query(ge=1, le=100_000)] = 200,
             rank: Annotated[int, Query(ge=0, le=1023)] = 0,
             follow: Annotated[bool, Query(description="Keep sending new lines until the "
                                                       "job ends")] = False) -> Response:
        """The last ``tail`` lines of the job's output (one rank's, among its last
        ``TAIL_BYTES``), across its restarts."""
        visible(who, job_id)
        backend = service.backend
        end = backend.log_size(job_id, rank)
        start = max(0, end - TAIL_BYTES)
        text = backend.read_log(job_id, rank, start, end - start)
        offset = start + len(text)  # where a follow goes on: after what was read
        if start > 0:  # the first line read is cut
            text = text[text.find(b"\n") + 1:] if b"\n" in text else b""
        cut = len(text)  # split only the last ``tail`` lines, not 4 MiB of short ones
        for _ in range(tail + 1):
            if (cut := text.rfind(b"\n", 0, cut)) < 0:
                break
        first = b"".join(line + b"\n" for line in text[cut + 1:].splitlines()[-tail:])
        if not follow:
            return PlainTextResponse(first)
        return StreamingResponse(follow_log(who, token, job_id, rank, first, offset),
                                 media_type="text/plain")

    def poll_log(who: Principal, token: str, job_id: str, rank: int, offset: int
                 ) -> tuple[bool, bytes] | None:
        """Whether the job has ended (then one last read) and the log's next piece; None
        once the token no longer works. In a worker thread: it asks the store."""
        if store.principal(token) is None:
            return None
        ended = store.job(who, job_id).state in TERMINAL
        return ended, service.backend.read_log(job_id, rank, offset, FOLLOW_CHUNK_BYTES)

    async def follow_log(who: Principal, token: str, job_id: str, rank: int, first: bytes,
                         offset: int) -> AsyncIterator[bytes]:
        yield first
        while (polled := await asyncio.to_thread(poll_log, who, token, job_id, rank,
                                                 offset)) is not None:
            ended, chunk = polled
            if chunk:
                offset += len(chunk)
                yield chunk
            elif ended:
                return
            if len(chunk) < FOLLOW_CHUNK_BYTES:
                await asyncio.sleep(FOLLOW_POLL_S)

    @app.get("/v1/jobs/{job_id}/explain", responses=NOT_FOUND)
    def explain(job_id: str, who: Who) -> Explanation:
        """Why is my job pending? Its state, the reason in words, its place in line."""
        row = visible(who, job_id)
        try:
            return Explanation(**service.views.explain(row))
        except ValueError:  # stored but not (yet) given to the scheduler, or long finished
            return Explanation(state=row.state, reason=service.views.why(row) or row.state,
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

    def poll_events(who: Principal, token: str, after: int) -> list[EventRow] | None:
        """Events after ``after``; None once the token no longer works (in a thread)."""
        return None if store.principal(token) is None else store.all_events(who, after, 1000)

    @app.get("/v1/events/stream", response_class=EventSourceResponse,
             dependencies=[Depends(stream_slot)], responses=too_many)
    async def event_stream(request: Request, who: Who, token: Token, after: AfterId = 0
                           ) -> AsyncIterator[ServerSentEvent]:
        """The same events as a server-sent event stream that stays open (until the token
        is revoked); a client that reconnects with ``Last-Event-ID`` continues where it
        left off."""
        last = last_event_id(request.headers.get("last-event-id"), after)
        while not await request.is_disconnected():
            batch = await asyncio.to_thread(poll_events, who, token, last)
            if batch is None:
                return
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
        return [UserInfo(**vars(u)) for u in store.users()]

    @app.patch("/v1/users/{name}", responses={**NOT_FOUND, **ADMINS_ONLY, **BAD_BODY})
    def change_user(name: str, change: UserChange, who: Admin) -> UserInfo:
        """Move a user to a team (``"team": null``: to none) or set their tickets in it
        (admins)."""
        given = change.model_dump(exclude_unset=True)
        try:
            user = UserInfo(**vars(store.set_user(name, **given)))
            service.refresh_shares()
            return user
        except UnknownTeam as e:
            raise unprocessable("team", f"{e}: create it first (gandiva team add)") from None
        except StoreError as e:
            raise HTTPException(404, str(e)) from None

    @app.get("/v1/teams", responses=ADMINS_ONLY)
    def teams(who: Admin) -> list[TeamInfo]:
        """Every team: its tickets, its quota and its members (admins)."""
        return [TeamInfo(**vars(t)) for t in store.teams()]

    @app.post("/v1/teams", status_code=201,
              responses={**ADMINS_ONLY, **BAD_BODY,
                         409: problem("A team of that name exists")})
    def add_team(spec: TeamSpec, who: Admin) -> TeamInfo:
        """Create a team (admins)."""
        try:
            team = TeamInfo(**vars(store.add_team(spec.name, spec.tickets, spec.quota_gpus)))
            service.refresh_shares()
            return team
        except StoreError as e:
            raise HTTPException(409, str(e)) from None

    @app.patch("/v1/teams/{name}",
               responses={**ADMINS_ONLY, **BAD_BODY, 404: problem("No such team")})
    def change_team(name: str, change: TeamChange, who: Admin) -> TeamInfo:
        """Set a team's tickets or its quota (``"quota_gpus": null``: none) (admins)."""
        try:
            team = TeamInfo(**vars(store.set_team(name, **change.model_dump(exclude_unset=True))))
            service.refresh_shares()
            return team
        except StoreError as e:
            raise HTTPException(404, str(e)) from None

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

    # healthz and readyz are async: they answer while every worker thread waits on a database
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        """The process answers (liveness)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """The store answers (within ``PROBE_S``), the scheduler's loop is alive and what it
        reports is being stored (readiness)."""
        problems = []
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(store.probe())), PROBE_S)
        except TimeoutError:
            problems.append(f"store: no answer in {PROBE_S:g} s")
        except SQLAlchemyError as e:
            problems.append(f"store: {type(e).__name__}")
        if not service.backend.alive():
            problems.append("scheduler loop: not running")
        if not service.writer.healthy():
            problems.append(f"store writes: {service.writer.queued()} queued, the oldest "
                            f"{service.writer.behind_s():.0f} s ago")
        # a disk refusing checkpoints is said, not made a failure: the server still takes
        # and schedules work, and a load balancer must not take it out of service for it
        warnings = []
        if refused := service.metrics.refused_within(DISK_WARN_S):
            warnings.append(f"checkpoints: {refused} refused by a disk (full?) in the last "
                            f"{DISK_WARN_S:g} s; their jobs train on from older checkpoints")
        return JSONResponse({"status": "not ready" if problems else "ok",
                             "problems": problems, "warnings": warnings,
                             "tenancy": service.tenancy.detail},
                            status_code=503 if problems else 200)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(service.metrics.scrape(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/")

    app.mount("/ui", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    return app
