"""Gavel's tab-separated traces: 10-field ``physical_cluster`` and legacy 7-field ``msr_philly``.

Work is given in steps (mini-batches), so durations and the reference GPU do not matter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gandiva.spec import JobSpec, Trace
from gandiva.traces import _parse as p
from gandiva.traces.errors import TraceError

FIELDS_10 = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
FIELDS_7 = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time",
    "scale_factor",
)
REFERENCE_GPU = "V100"
"""Gavel's reference type; unused, since every job gives its work as mini-batches."""


def load(path: Path) -> Trace:
    """job_type (e.g. 'ResNet-50 (batch size 64)') is the model, kept verbatim.

    scale_factor is the GPU count and is kept even where Gavel's throughput tables have no
    entry (7, 12, 16, ... occur in the Philly-derived files). Job id = 0-based row in the file.
    """
    jobs, _ = p.collect(path, _records(path), _parse_job)
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (Gavel trace format)",
        reference_gpu=REFERENCE_GPU,
    )


def _records(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """Tab-separated rows, no header; the first row's width (10 or 7) fixes the layout."""
    fields: tuple[str, ...] | None = None
    with path.open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            values = line.rstrip("\r\n").split("\t")
            if fields is None:
                fields = {10: FIELDS_10, 7: FIELDS_7}.get(len(values))
                if fields is None:
                    message = f"expected 10 or 7 tab-separated fields, got {len(values)}"
                    raise TraceError(path, line_number, None, message)
            if len(values) != len(fields):
                message = f"expected {len(fields)} fields like the first row, got {len(values)}"
                raise TraceError(path, line_number, None, message)
            yield line_number, dict(zip(fields, values, strict=True))


def _parse_job(index: int, record: p.Record) -> JobSpec:
    priority = p.optional(record, "priority_weight", p.number)
    return JobSpec(
        id=str(index),
        submit_time=p.non_negative(record["arrival_time"], "arrival_time"),
        num_gpus=p.positive_int(record["scale_factor"], "scale_factor"),
        model=p.text(record["job_type"], "job_type"),
        mini_batches=p.positive_int(record["total_steps"], "total_steps"),
        priority=round(priority) if priority is not None else 0,
    )
