"""Job traces: bundled public traces and their loaders, one module per file format.

``load_trace`` reads a bundled trace by name or any trace file by path, fills in models from a
mix where the trace has none, and optionally cuts a window, keeps the first N jobs, or rescales
arrivals. A bad row raises TraceError naming file, line and field; rows are dropped only where
a format's own documentation says so, and the count is kept in ``Trace.notes``.
"""

from __future__ import annotations

import csv
import difflib
from collections.abc import Callable
from importlib.resources import as_file, files
from pathlib import Path

from gandiva.spec import Trace
from gandiva.traces import alibaba, gavel, native, philly, pollux, tiresias
from gandiva.traces.bundled import BUNDLED
from gandiva.traces.errors import TraceError
from gandiva.traces.mix import MIXES, assign_models, check_mix
from gandiva.traces.selection import check_options, prepare

__all__ = [
    "FORMATS",
    "MIXES",
    "TraceError",
    "assign_models",
    "bundled_traces",
    "detect_format",
    "load_trace",
]

FORMATS: dict[str, Callable[[Path], Trace]] = {
    "csv": native.load_csv,
    "json": native.load_json,
    "philly": philly.load,
    "tiresias": tiresias.load_tiresias,
    "chronus": tiresias.load_chronus,
    "gavel": gavel.load,
    "pollux": pollux.load,
    "alibaba": alibaba.load,
}
"""Format name -> loader. ``csv`` and ``json`` are our own format (FORMAT.md)."""

_HEADERS: list[tuple[set[str], str]] = [
    ({"timestamp", "duration", "num_gpus", "cluster"}, "philly"),
    ({"name", "time", "application", "num_replicas"}, "pollux"),
    ({"name", "num_gpu", "gpu_milli", "creation_time"}, "alibaba"),
    ({"job_id", "num_gpu", "model_name", tiresias.CHRONUS_MARKER}, "chronus"),
    ({"job_id", "num_gpu", "model_name"}, "tiresias"),
    ({"job_id"}, "csv"),
]
"""Columns that identify a CSV format, most specific first; our own format comes last."""


def bundled_traces() -> dict[str, str]:
    """Name -> one-line description of every trace shipped with gandiva."""
    return {name: entry.description for name, entry in BUNDLED.items()}


def load_trace(
    name_or_path: str | Path,
    *,
    jobs: int | None = None,
    window: tuple[float, float] | None = None,
    arrival_scale: float = 1.0,
    mix: str = "paper",
    seed: int = 0,
    format: str | None = None,
) -> Trace:
    """Load a bundled trace by name, or a trace file (format from extension/header or ``format``).

    After loading: sort by submit time (stable), draw missing models from ``mix`` with ``seed``,
    keep jobs with ``start <= submit < end`` of ``window`` and shift ``start`` to 0, keep the
    first ``jobs``, and divide submit times by ``arrival_scale`` (2 = arrivals twice as dense).
    """
    check_options(jobs, window, arrival_scale)
    check_mix(mix)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; known formats: {', '.join(FORMATS)}")
    trace = _read(str(name_or_path), format)
    return prepare(trace, jobs=jobs, window=window, arrival_scale=arrival_scale, mix=mix, seed=seed)


def _read(name_or_path: str, format: str | None) -> Trace:
    entry = BUNDLED.get(name_or_path)
    if entry is None:
        path = Path(name_or_path)
        if not path.is_file():
            message = "neither a bundled trace (see bundled_traces()) nor a readable file"
            close = difflib.get_close_matches(name_or_path, BUNDLED, n=3)
            if close:
                message += f"; did you mean {', '.join(close)}?"
            raise TraceError(path, None, None, message)
        return FORMATS[format or detect_format(path)](path)
    if format is not None and format != entry.format:
        raise ValueError(
            f"bundled trace {name_or_path!r} is in format {entry.format!r}, not {format!r}"
        )
    with as_file(files(__name__).joinpath("data", *entry.file.split("/"))) as path:
        trace = FORMATS[entry.format](path)
    trace.name = name_or_path
    trace.source = entry.source
    return trace


def detect_format(path: Path) -> str:
    """The format of a trace file, from its extension and, for CSV, its header."""
    if path.suffix.lower() == ".json":
        return "json"
    if path.suffix.lower() == ".trace":
        return "gavel"
    with path.open(newline="", encoding="utf-8-sig") as file:
        first = file.readline()
    if "\t" in first and path.suffix.lower() != ".csv":
        return "gavel"
    columns = {name.strip() for name in next(csv.reader([first]), [])}
    for marker, name in _HEADERS:
        if marker <= columns:
            return name
    known = ", ".join(FORMATS)
    message = f"cannot tell the trace format from this header; pass format= one of {known}"
    raise TraceError(path, 1, None, message)
