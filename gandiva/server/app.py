"""The REST API (version 1): FastAPI over the store and the scheduler's local loop.

Every request carries ``Authorization: Bearer <token>``; a missing or unknown token gets 401.
Users see and act on their own jobs, admins on all; another user's job is a 404, so its id
leaks nothing. A submission is stored (committed) before it reaches the scheduler, and every
transition the scheduler reports is stored as an event: a restarted server finds every job.
"""

from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from gandiva.runtime.agent import Launch
from gandiva.runtime.local import JobRecord, LocalBackend
from gandiva.server.jobspec import JobRequest
from gandiva.server.store import TERMINAL, JobRow, Principal, Store
from gandiva.spec import JobSpec


class JobView(BaseModel):
    id: str
    name: str
    user_id: int
    state: str
    reason: str
    priority: int
    gpus: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None

    @classmethod
    def of(cls, row: JobRow) -> "JobView":
        return cls(id=row.id, name=row.name, user_id=row.user_id, state=row.state,
                   reason=row.reason, priority=row.priority, gpus=row.spec["gpus"],
                   submitted_at=row.submitted_at, started_at=row.started_at,
                   finished_at=row.finished_at)


class EventView(BaseModel):
    id: int
    at: float
    kind: str
    data: dict[str, Any]


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


class Service:
    """The store and the scheduler's loop, joined: what the API calls."""

    def __init__(self, store: Store, backend: LocalBackend, base_dir: Path) -> None:
        self.store = store
        self.backend = backend
        self.base_dir = base_dir
        backend.on_change = self._persist

    def user_dir(self, who: Principal) -> Path:
        return self.base_dir / "users" / who.name

    def submit(self, who: Principal, req: JobRequest) -> str:
        cwd = self.user_dir(who) / req.workdir
        if not cwd.is_dir():
            raise HTTPException(422, detail=[{"loc": ["body", "workdir"], "msg":
                                f"{req.workdir!r} does not exist in your base directory "
                                f"({self.user_dir(who)}); create it first",
                                "type": "value_error"}])
        if req.gpus > len(self.backend.devices):
            raise HTTPException(422, detail=[{"loc": ["body", "gpus"], "msg":
                                f"{req.gpus} GPUs asked; this cluster has "
                                f"{len(self.backend.devices)}", "type": "value_error"}])
        job_id = self.store.submit(who, req)  # committed before the scheduler sees it
        self.backend.submit(*to_scheduler(job_id, req, cwd))
        return job_id

    def resume_unfinished(self) -> int:
        """After a restart: give the scheduler every job not yet finished; those that had
        started restore from their latest checkpoints."""
        n = 0
        for row in self.store.unfinished():
            req = JobRequest.model_validate(row.spec)
            cwd = self.user_dir(self.store.owner(row.id)) / req.workdir
            self.store.record(row.id, "requeued", {"after": "server restart"}, state="queued")
            self.backend.submit(*to_scheduler(row.id, req, cwd))
            n += 1
        return n

    def cancel(self, who: Principal, row: JobRow) -> None:
        if row.state in TERMINAL:
            raise HTTPException(409, f"job {row.id!r} is {row.state} already")
        self.store.record(row.id, "cancel-requested", {"by": who.name})
        self.backend.cancel(row.id)

    def _persist(self, rec: JobRecord, what: str) -> None:
        state = {"running": "running", "suspended": "suspended", "done": "done",
                 "failed": "failed", "cancelled": "cancelled"}.get(what)
        data = {"steps": rec.steps, "restarts": rec.restarts}
        self.store.record(rec.spec.id, what, data, state=state,
                          reason=rec.reason if what in ("failed", "restarted") else None)


def create_app(service: Service) -> FastAPI:
    app = FastAPI(title="gandiva", version="1",
                  description="Submit, watch and steer training jobs on a gandiva cluster.")

    def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        scheme, _, token = (authorization or "").partition(" ")
        who = service.store.principal(token) if scheme.lower() == "bearer" and token else None
        if who is None:
            raise HTTPException(401, "give a valid token: Authorization: Bearer <token>",
                                headers={"WWW-Authenticate": "Bearer"})
        return who

    Who = Annotated[Principal, Depends(principal)]

    def visible(who: Principal, job_id: str) -> JobRow:
        row = service.store.job(who, job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return row

    @app.post("/v1/jobs", status_code=201)
    def submit(req: JobRequest, who: Who) -> JobView:
        job_id = service.submit(who, req)
        return JobView.of(visible(who, job_id))

    @app.get("/v1/jobs")
    def jobs(who: Who, state: str | None = None) -> list[JobView]:
        states = tuple(s for s in (state or "").split(",") if s)
        return [JobView.of(r) for r in service.store.jobs(who, states)]

    @app.get("/v1/jobs/{job_id}")
    def job(job_id: str, who: Who) -> JobView:
        return JobView.of(visible(who, job_id))

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, who: Who) -> JobView:
        """Cancel a queued, running or suspended job (its processes are stopped)."""
        service.cancel(who, visible(who, job_id))
        return JobView.of(visible(who, job_id))

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse)
    def logs(job_id: str, who: Who, tail: Annotated[int, Query(ge=1, le=100_000)] = 200,
             rank: Annotated[int, Query(ge=0)] = 0) -> str:
        """The last ``tail`` lines of the job's output (one rank's), across its restarts."""
        visible(who, job_id)
        path = service.backend.agent.job_dir(job_id) / f"rank{rank}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:]) + "\n"

    @app.get("/v1/jobs/{job_id}/explain")
    def explain(job_id: str, who: Who) -> dict[str, Any]:
        """Why is my job pending? Its state, the reason in words, its place in line."""
        row = visible(who, job_id)
        try:
            return service.backend.explain(job_id)
        except ValueError:  # stored but not (yet) given to the scheduler, or long finished
            return {"state": row.state, "reason": row.reason or f"the job is {row.state}",
                    "queue_position": None, "needs": None}

    @app.get("/v1/jobs/{job_id}/events")
    def events(job_id: str, who: Who, after: int = 0) -> list[EventView]:
        visible(who, job_id)
        return [EventView(id=e.id, at=e.at, kind=e.kind, data=e.data)
                for e in service.store.events(job_id, after)]

    return app
