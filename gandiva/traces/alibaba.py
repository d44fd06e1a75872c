"""Alibaba GPU cluster trace v2023 pods (``openb_pod_list_*.csv``, Weng et al., ATC'23)."""

from __future__ import annotations

from pathlib import Path

from gandiva.spec import JobSpec, Trace
from gandiva.traces import _parse as p
from gandiva.traces.errors import FieldError

COLUMNS = (
    "name",
    "num_gpu",
    "gpu_milli",
    "qos",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
REFERENCE_GPU = "P100"
"""A choice: the cluster mixes T4, P100, V100 and undisclosed types, and pods name none; P100 is
the middle of that range and the type the Philly-derived traces use."""

FULL_GPU_MILLI = 1000

DROP_NO_GPU = "num_gpu = 0 (CPU-only pods are not GPU jobs)"
DROP_NEVER_RAN = "empty scheduled_time or deletion_time (never scheduled: no run time to replay)"


def load(path: Path) -> Trace:
    """submit = creation_time, duration = deletion_time - scheduled_time, user = qos.

    A 1-GPU pod asking for a fraction of its GPU (gpu_milli < 1000) is kept as a 1-GPU job and
    counted in the notes: whether to pack it with others is the scheduler's decision.
    """
    records = list(p.csv_records(path, COLUMNS))
    fractional = 0

    def parse(index: int, record: p.Record) -> JobSpec | str:
        nonlocal fractional
        pod = _parse_pod(record)
        if isinstance(pod, JobSpec) and _gpu_milli(record, pod.num_gpus) < FULL_GPU_MILLI:
            fractional += 1
        return pod

    jobs, dropped = p.collect(path, records, parse, id_field="name")
    return Trace(
        name=path.stem,
        jobs=jobs,
        source=f"{path} (Alibaba GPU trace v2023 pod list format)",
        reference_gpu=REFERENCE_GPU,
        notes=[
            *p.drop_notes(dropped, len(records)),
            f"{fractional} pods request a fraction of one GPU (gpu_milli < 1000); "
            "kept as num_gpus = 1",
            "please cite Weng et al., 'Beware of Fragmentation', USENIX ATC'23",
        ],
    )


def _parse_pod(record: p.Record) -> JobSpec | str:
    # Drop rules from the trace README: CPU-only pods, and pods that never ran.
    num_gpus = p.integer(record["num_gpu"], "num_gpu", minimum=0)
    if num_gpus == 0:
        return DROP_NO_GPU
    if p.is_empty(record["scheduled_time"]) or p.is_empty(record["deletion_time"]):
        return DROP_NEVER_RAN
    submit = p.non_negative(record["creation_time"], "creation_time")
    scheduled = p.non_negative(record["scheduled_time"], "scheduled_time")
    if scheduled < submit:
        raise FieldError(
            "scheduled_time", f"expected >= creation_time {submit:g}, got {scheduled:g}"
        )
    deleted = p.non_negative(record["deletion_time"], "deletion_time")
    if deleted <= scheduled:
        raise FieldError(
            "deletion_time", f"expected > scheduled_time {scheduled:g}, got {deleted:g}"
        )
    return JobSpec(
        id=p.text(record["name"], "name"),
        submit_time=submit,
        num_gpus=num_gpus,
        model="",
        user=p.text(record["qos"], "qos"),
        duration=deleted - scheduled,
    )


def _gpu_milli(record: p.Record, num_gpus: int) -> int:
    """The share of each GPU in 1/1000; a fraction only makes sense on a 1-GPU pod."""
    gpu_milli = p.integer(record["gpu_milli"], "gpu_milli", minimum=1)
    if gpu_milli > FULL_GPU_MILLI or (gpu_milli < FULL_GPU_MILLI and num_gpus > 1):
        message = f"expected 1..1000 (below 1000 only on 1-GPU pods), got {gpu_milli}"
        raise FieldError("gpu_milli", message)
    return gpu_milli
