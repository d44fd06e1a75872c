"""Our own trace format, CSV or JSON; the fields are documented in FORMAT.md."""

from __future__ import annotations

import json
from pathlib import Path

from gandiva.spec import JobSpec, Trace
from gandiva.traces import _parse as p
from gandiva.traces.errors import FieldError, TraceError

FIELDS = (
    "job_id",
    "submit_time",
    "num_gpus",
    "duration",
    "mini_batches",
    "model",
    "user",
    "priority",
    "min_gpus",
    "max_gpus",
)
REQUIRED = ("job_id", "submit_time", "num_gpus")
REFERENCE_GPU = "V100"
"""Our format names no GPU type: durations are read as measured on the default Trace GPU."""

_SHAPE = 'expected a list of jobs or {"jobs": [...]}'


def load_csv(path: Path) -> Trace:
    jobs, _ = p.collect(path, p.csv_records(path, REQUIRED, FIELDS), parse_job)
    return _trace(path, "CSV", jobs)


def load_json(path: Path) -> Trace:
    """A list of job objects, or {"jobs": [...]}; the error "line" is the 1-based job index."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as error:
        raise TraceError(path, None, None, f"invalid JSON: {error}") from None
    if isinstance(data, dict):
        if set(data) != {"jobs"}:
            raise TraceError(path, None, None, f"{_SHAPE}, got keys {sorted(data)}")
        data = data["jobs"]
    if not isinstance(data, list):
        raise TraceError(path, None, None, f"{_SHAPE}, got {type(data).__name__}")
    for number, job in enumerate(data, start=1):
        if not isinstance(job, dict):
            raise TraceError(path, number, None, f"expected a JSON object, got {job!r}")
        p.check_columns(path, number, job, (), FIELDS)
    jobs, _ = p.collect(path, enumerate(data, start=1), parse_job)
    return _trace(path, "JSON", jobs)


def _trace(path: Path, kind: str, jobs: list[JobSpec]) -> Trace:
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (gandiva {kind} trace format)",
        reference_gpu=REFERENCE_GPU,
    )


def parse_job(index: int, record: p.Record) -> JobSpec:
    num_gpus = p.positive_int(record.get("num_gpus"), "num_gpus")
    duration, mini_batches = _work(record)
    min_gpus, max_gpus = _elastic_range(record, num_gpus)
    return JobSpec(
        id=p.text(record.get("job_id"), "job_id"),
        submit_time=p.non_negative(record.get("submit_time"), "submit_time"),
        num_gpus=num_gpus,
        model=p.optional(record, "model", p.text) or "",
        user=p.optional(record, "user", p.text) or "default",
        duration=duration,
        mini_batches=mini_batches,
        priority=p.optional(record, "priority", p.integer) or 0,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
    )


def _work(record: p.Record) -> tuple[float | None, int | None]:
    """Exactly one of duration (seconds) and mini_batches says how much work the job is."""
    has_duration = not p.is_empty(record.get("duration"))
    has_batches = not p.is_empty(record.get("mini_batches"))
    if has_duration == has_batches:
        got = "both" if has_duration else "neither"
        raise FieldError(
            "duration", f"expected exactly one of duration and mini_batches, got {got}"
        )
    if has_duration:
        return p.positive(record["duration"], "duration"), None
    return None, p.positive_int(record["mini_batches"], "mini_batches")


def _elastic_range(record: p.Record, num_gpus: int) -> tuple[int | None, int | None]:
    """An elastic job runs on min_gpus..max_gpus GPUs and asks for num_gpus of them."""
    min_gpus = p.optional(record, "min_gpus", p.positive_int)
    max_gpus = p.optional(record, "max_gpus", p.positive_int)
    if min_gpus is not None and min_gpus > num_gpus:
        raise FieldError("min_gpus", f"expected min_gpus <= num_gpus ({num_gpus}), got {min_gpus}")
    if max_gpus is not None and max_gpus < num_gpus:
        raise FieldError("max_gpus", f"expected max_gpus >= num_gpus ({num_gpus}), got {max_gpus}")
    return min_gpus, max_gpus
