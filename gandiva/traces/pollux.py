"""Pollux workloads (``name,time,application,num_replicas,batch_size``).

Pollux jobs train to a convergence target, so the files list no duration; we give each
application a fixed solo run time (ASSUMED_DURATION), stated in every loaded trace's notes.
"""

from __future__ import annotations

from pathlib import Path

from gandiva.spec import JobSpec, Trace
from gandiva.traces import _parse as p
from gandiva.traces.errors import FieldError

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
REFERENCE_GPU = "T4"
"""Pollux profiled its six applications on AWS g4dn.12xlarge nodes (4 x T4 each)."""

_HOUR = 3600.0
ASSUMED_DURATION = {
    "cifar10": 0.5 * _HOUR,
    "ncf": 0.5 * _HOUR,
    "deepspeech2": 2 * _HOUR,
    "bert": 2 * _HOUR,
    "yolov3": 6 * _HOUR,
    "imagenet": 12 * _HOUR,
}
"""An assumption, not data: round numbers in the spirit of the Pollux paper's typical run times
(and of its workload generator, which maps < 1 GPU-h to cifar10/ncf, < 10 to deepspeech2/bert,
< 100 to yolov3, else imagenet), taken as the run time on the requested GPUs."""


def load(path: Path) -> Trace:
    """application is the model; num_replicas the GPUs; batch_size is not used."""
    jobs, _ = p.collect(path, p.csv_records(path, COLUMNS), _parse_job, id_field="name")
    durations = ", ".join(f"{app} {time / _HOUR:g} h" for app, time in ASSUMED_DURATION.items())
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (Pollux workload format)",
        reference_gpu=REFERENCE_GPU,
        notes=[
            f"ASSUMPTION: Pollux lists no durations; fixed per application: {durations}",
            "batch_size (the user's initial global batch) is not used",
        ],
    )


def _parse_job(index: int, record: p.Record) -> JobSpec:
    application = p.text(record["application"], "application")
    if application not in ASSUMED_DURATION:
        known = ", ".join(ASSUMED_DURATION)
        raise FieldError("application", f"expected one of {known}, got {application!r}")
    return JobSpec(
        id=p.text(record["name"], "name"),
        submit_time=p.non_negative(record["time"], "time"),
        num_gpus=p.positive_int(record["num_replicas"], "num_replicas"),
        model=application,
        duration=ASSUMED_DURATION[application],
    )
