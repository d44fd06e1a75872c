"""Tiresias CSV (``job_id,num_gpu,submit_time,...,model_name,duration``) and Chronus's variant.

Chronus adds ``user`` and deadline columns and, unlike Tiresias, counts time in minutes.
"""

from __future__ import annotations

from pathlib import Path

from gandiva.spec import JobSpec, Trace
from gandiva.traces import _parse as p

COLUMNS = ("job_id", "num_gpu", "submit_time", "model_name", "duration")
CHRONUS_MARKER = "expect_time_list"
"""A column only Chronus files have: it tells the two formats (and time units) apart."""

REFERENCE_GPU = "P100"
"""Tiresias measured on 60 P100 GPUs (NSDI'19); Chronus's traces are derived from Philly."""

CHRONUS_MINUTE = 60.0
"""Chronus times are minutes. Upstream does not say; the numbers do: its durations (p10/p25/p50/
p75/p90 = 23/33/60/173/654) match Philly's jobs over 20 minutes counted in minutes (25/34/52/
146/758), and 30,940 arrivals over 20,151 units are 14 days of minutes, not 5.6 hours of seconds."""


def load_tiresias(path: Path) -> Trace:
    """Times in seconds; every row is a job (a 0-GPU row is an error here)."""
    jobs, _ = p.collect(path, p.csv_records(path, COLUMNS), _parser(1.0))
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (Tiresias CSV format, times in seconds)",
        reference_gpu=REFERENCE_GPU,
    )


def load_chronus(path: Path) -> Trace:
    """Times in minutes, converted to seconds; 0-GPU rows dropped; deadline columns unused."""
    records = list(p.csv_records(path, (*COLUMNS, "user")))
    parse_job = _parser(CHRONUS_MINUTE)

    def parse(index: int, record: p.Record) -> JobSpec | str:
        # Chronus's README: ~190 rows ask for 0 GPUs; they are not jobs, drop them.
        if p.integer(record["num_gpu"], "num_gpu", minimum=0) == 0:
            return "num_gpu = 0 (the Chronus README says to drop them)"
        return parse_job(index, record)

    jobs, dropped = p.collect(path, records, parse)
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (Chronus CSV format, times in minutes)",
        reference_gpu=REFERENCE_GPU,
        notes=[
            "submit_time and duration read as minutes and converted to seconds",
            "deadline columns (expect_time_list, expect_value_list, best_effort, job_type) unused",
            *p.drop_notes(dropped, len(records)),
        ],
    )


def _parser(unit: float) -> p.Parse:
    def parse(index: int, record: p.Record) -> JobSpec:
        return JobSpec(
            id=p.text(record["job_id"], "job_id"),
            submit_time=p.non_negative(record["submit_time"], "submit_time") * unit,
            num_gpus=p.positive_int(record["num_gpu"], "num_gpu"),
            model=p.text(record["model_name"], "model_name"),
            user=p.optional(record, "user", p.text) or "default",
            duration=p.positive(record["duration"], "duration") * unit,
        )

    return parse
