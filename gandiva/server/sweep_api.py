"""Learning curves and sweeps in the REST API.

- ``GET /v1/jobs/{id}/metrics?names=loss&after=STEP``: a job's curves, from a step on (a
  client follows one live by asking again with the last step it has);
- ``POST /v1/sweeps`` (a sweep spec, ``gandiva.sweep.spec``), ``GET /v1/sweeps``,
  ``GET /v1/sweeps/{id}``: a sweep's trials with their parameters, the rungs each reached,
  the sweep's decision on each, their latest value, and the best finished trial.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel

from gandiva.server.store import STEP_MAX, JobRow, Principal, Store, SweepRow, TrialRow
from gandiva.spec import JobState
from gandiva.sweep.spec import SweepSpec

# a point reported at a step beyond STEP_MAX is left out, and no step after it can be asked for
POINTS_MAX = 100_000  # points in one answer; ask again ``after`` the last step for more


class Curves(BaseModel):
    job_id: str
    series: dict[str, list[list[int | float]]]  # metric -> [[step, value, at], ...], by step


class TrialView(BaseModel):
    trial: int
    job_id: str
    name: str
    state: str
    reason: str
    params: dict[str, Any]
    rungs: dict[str, float]  # rung (mini-batches) -> the trial's value there
    decision: str  # running; past its last rung: promoted, continued (let through for want
    # of others to compare with), paused (held; promoted if later values put it in the top),
    # or stopped
    step: int | None  # of the latest value of the sweep's metric
    value: float | None
    checkpoint: str | None = None  # (the best trial's) its newest checkpoint, on the server


class SweepView(BaseModel):
    id: str
    name: str
    created_at: float
    metric: str
    mode: str
    rule: str
    rungs: list[int]
    trials: list[TrialView]
    best: TrialView | None  # the finished (done) trial with the best latest value


Newest = Callable[[str], Path | None]  # a job's newest checkpoint, if its node has one
SubmitSweep = Callable[[Principal, SweepSpec], tuple[SweepRow, list[JobRow]]]


def sweep_view(store: Store, newest: Newest, row: SweepRow,
               trials: list[tuple[TrialRow, JobRow]]) -> SweepView:
    spec = SweepSpec.model_validate(row.spec)
    last = store.last_points([job.id for _, job in trials], spec.metric)
    views = [TrialView(trial=t.trial, job_id=job.id, name=job.name, state=job.state,
                       reason=job.reason, params=t.params, rungs=t.rungs, decision=t.decision,
                       step=last.get(job.id, (None, None))[0],
                       value=last.get(job.id, (None, None))[1])
             for t, job in trials]
    sign = 1 if spec.mode == "min" else -1
    done = [v for v in views if v.state == JobState.DONE and v.value is not None]
    best = min(done, key=lambda v: (sign * (v.value or 0.0), v.trial), default=None)
    if best is not None and (file := newest(best.job_id)) is not None:
        best = best.model_copy(update={"checkpoint": str(file)})
    return SweepView(id=row.id, name=row.name, created_at=row.created_at, metric=spec.metric,
                     mode=spec.mode, rule=spec.stop.rule, rungs=spec.stop.rungs,
                     trials=views, best=best)


def routes(app: FastAPI, store: Store, submit: SubmitSweep, newest: Newest,
           Who: Any, visible: Callable[..., JobRow], not_found: dict, bad_body: dict) -> None:

    @app.get("/v1/jobs/{job_id}/metrics", responses=not_found)
    def metrics_of(job_id: str, who: Who,
                   names: Annotated[str | None, Query(
                       description="Comma-separated metrics (default: all)")] = None,
                   after: Annotated[int, Query(ge=-1, le=STEP_MAX,
                                               description="Only steps after this")]
                   = -1,
                   limit: Annotated[int, Query(ge=1, le=POINTS_MAX)] = 10_000) -> Curves:
        """The job's learning curves: every value it reported, by step (mini-batches done),
        oldest first; follow one by asking again with ``after`` the last step you have."""
        visible(who, job_id)
        wanted = [n for n in (names or "").split(",") if n]
        return Curves(job_id=job_id, series=store.points(job_id, wanted, after, limit))

    @app.post("/v1/sweeps", status_code=201, responses={
        **bad_body, 429: {"description": "The trials would pass your limit of unfinished "
                                         "jobs"}})
    def submit_sweep(spec: SweepSpec, who: Who) -> SweepView:
        """Start a sweep: every trial is queued at once, as an ordinary job labelled
        ``sweep=<id>`` and ``trial=<n>``; the sweep's rule promotes or stops them as they
        report its metric."""
        row, _ = submit(who, spec)
        return sweep_view(store, newest, row, store.trials([row.id]))

    @app.get("/v1/sweeps")
    def sweeps(who: Who, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               brief: Annotated[bool, Query(
                   description="Without the trials (and so without the best): a list cheap "
                               "enough to poll")] = False) -> list[SweepView]:
        """Your sweeps (an admin: everyone's), newest first."""
        rows = store.sweeps(who, limit=limit)
        trials: dict[str, list] = {row.id: [] for row in rows}
        if not brief:
            for t, job in store.trials(list(trials)):
                trials[t.sweep_id].append((t, job))
        return [sweep_view(store, newest, row, trials[row.id]) for row in rows]

    @app.get("/v1/sweeps/{sweep_id}", responses={404: {"description": "No such sweep, or "
                                                                      "not yours"}})
    def sweep(sweep_id: str, who: Who) -> SweepView:
        rows = store.sweeps(who, sweep_id) if "\x00" not in sweep_id else []
        if not rows:
            raise HTTPException(404, f"no sweep {sweep_id!r}")
        return sweep_view(store, newest, rows[0], store.trials([sweep_id]))
