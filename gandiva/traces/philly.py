"""The Philly job list (Pollux's ``philly.csv``): wall-clock submissions, seconds, GPUs, VC."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from gandiva.spec import JobSpec, Trace
from gandiva.traces import _parse as p
from gandiva.traces.errors import TraceError

COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
REFERENCE_GPU = "P100"
"""Philly ran P100 and P40 GPUs (Jeon et al., ATC'19), two cards of one speed class: P100."""

_EPOCH = datetime(1970, 1, 1)


def load(path: Path) -> Trace:
    """Submit times become seconds since the earliest submission; the user is the VC.

    Timestamps are naive local wall-clock times; a daylight-saving change shifts a few at most
    by an hour, which a scheduler study does not notice. Job id = 0-based row in the file.
    """
    records = list(p.csv_records(path, COLUMNS))
    stamps = [_timestamp(path, line, record["timestamp"]) for line, record in records]
    start = min(stamps, default=0.0)

    def parse(index: int, record: p.Record) -> JobSpec:
        return JobSpec(
            id=str(index),
            submit_time=stamps[index] - start,
            num_gpus=p.positive_int(record["num_gpus"], "num_gpus"),
            model="",
            user="vc_" + p.text(record["cluster"], "cluster"),
            duration=p.positive(record["duration"], "duration"),
        )

    jobs, _ = p.collect(path, records, parse)
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (Philly job list format)",
        reference_gpu=REFERENCE_GPU,
        notes=[f"submit_time 0 = {_EPOCH + timedelta(seconds=start)} (local wall-clock time)"],
    )


def _timestamp(path: Path, line: int, value: str) -> float:
    """Seconds since 1970 of a naive 'YYYY-MM-DD HH:MM:SS'."""
    try:
        return (datetime.fromisoformat(value) - _EPOCH).total_seconds()
    except (ValueError, TypeError):  # TypeError: a time-zone offset, which Philly never has
        raise TraceError(
            path, line, "timestamp", f"expected a time 'YYYY-MM-DD HH:MM:SS', got {value!r}"
        ) from None
