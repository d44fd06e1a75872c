"""What load_trace does after reading a file: order, name models, then cut and rescale time."""

from __future__ import annotations

import math
from operator import attrgetter

from gandiva.spec import JobSpec, Trace
from gandiva.traces._parse import evolve
from gandiva.traces.mix import assign_models


def check_options(
    jobs: int | None, window: tuple[float, float] | None, arrival_scale: float
) -> None:
    """Reject bad selection arguments before any file is read."""
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ValueError(f"jobs must be a positive integer or None, got {jobs!r}")
    if not _is_real(arrival_scale) or not arrival_scale > 0 or math.isinf(arrival_scale):
        raise ValueError(f"arrival_scale must be a finite number > 0, got {arrival_scale!r}")
    if window is not None:
        if (
            not isinstance(window, tuple | list)
            or len(window) != 2
            or not all(_is_real(t) and math.isfinite(t) for t in window)
        ):
            raise ValueError(f"window must be (start, end) in seconds, got {window!r}")
        if not window[0] < window[1]:
            raise ValueError(f"window start must be before its end, got {window!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def prepare(
    trace: Trace,
    *,
    jobs: int | None,
    window: tuple[float, float] | None,
    arrival_scale: float,
    mix: str,
    seed: int,
) -> Trace:
    """Sort by submit time (stable), fill missing models, then window, first N, time scale.

    Models are drawn over the whole sorted trace before any cut, so a job keeps its model
    whatever window or job count is asked for.
    """
    ordered = sorted(trace.jobs, key=attrgetter("submit_time"))
    missing = sum(1 for job in ordered if not job.model)
    selected = assign_models(ordered, mix, seed) if missing else ordered
    notes = list(trace.notes)
    if missing:
        notes.append(f"models of {missing} jobs drawn from mix {mix!r} (seed {seed})")
    shift = 0.0
    if window is not None:
        start, end = window
        kept = [job for job in selected if start <= job.submit_time < end]
        if not kept:
            raise ValueError(
                f"window {window!r} keeps no job of trace {trace.name!r} "
                f"(submit times {_span(selected)})"
            )
        notes.append(
            f"window [{start:g}, {end:g}) s kept {len(kept)} of {len(selected)} jobs; "
            f"submit times shifted so {start:g} s is 0"
        )
        selected, shift = kept, start
    if jobs is not None and jobs < len(selected):
        notes.append(f"kept the first {jobs} of {len(selected)} jobs")
        selected = selected[:jobs]
    if arrival_scale != 1:
        notes.append(f"submit times divided by arrival_scale {arrival_scale:g}")
    if shift or arrival_scale != 1:
        selected = [_retime(job, shift, arrival_scale) for job in selected]
    return Trace(
        name=trace.name,
        jobs=selected,
        source=trace.source,
        reference_gpu=trace.reference_gpu,
        notes=notes,
    )


def _retime(job: JobSpec, shift: float, scale: float) -> JobSpec:
    return evolve(job, "submit_time", (job.submit_time - shift) / scale)


def _span(jobs: list[JobSpec]) -> str:
    if not jobs:
        return "none"
    return f"{jobs[0].submit_time:g}..{jobs[-1].submit_time:g} s"
