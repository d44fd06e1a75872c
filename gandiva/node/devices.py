"""Which GPUs a job's processes see, and by what names.

The agent's devices are ``cuda:<i>``, its i-th GPU, or ``cuda:<id>`` with an id as
``CUDA_VISIBLE_DEVICES`` names a GPU (an index, a ``GPU-<uuid>``, a ``MIG-<uuid>``). An agent
started under ``CUDA_VISIBLE_DEVICES`` (Slurm, a container, a user's ``4,5``) may use only
those GPUs: its ``cuda:i`` is the i-th of that list, so a job it gives ``cuda:0`` must be
given that entry (``4``), not ``0``, which would be another user's GPU.

Decision: every process of a job sees its job's GPUs on its node and nothing else, in the
order of its local ranks, as torchrun's ``LOCAL_RANK`` expects: the rank with local rank r
uses ``cuda:r``. A framework that takes "all visible GPUs" (Lightning's ``devices="auto"``)
then takes the job's, and no process can touch a GPU that is another job's. A one-process
job that moves in place (``Job.steps(in_place=True)``) is the exception: it must see the
GPU it may be moved to, so it sees the node's other GPUs after its own.
"""

from __future__ import annotations

from collections.abc import Sequence

# The share of a GPU's memory no job's profile may count on: CUDA contexts (0.3-0.6 GB each,
# outside the caching allocator that profiles and caps measure), NCCL buffers and
# fragmentation. Packing fits jobs' peaks into the rest, and caps divide the rest (estimate:
# 10% is 1.6 GB of a 16 GB V100, 8 GB of an 80 GB H100; to be checked on a GPU)
HEADROOM = 0.10


def gpu_ids(devices: Sequence[str], inherited: str | None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entry of each of the agent's ``devices``, through the
    list the agent itself was given (``inherited``, unset: every GPU of the machine)."""
    entries = None if inherited is None else [e.strip() for e in inherited.split(",")]
    ids = []
    for device in devices:
        kind, _, ident = device.partition(":")
        if kind != "cuda" or not ident:
            raise ValueError(f"device {device!r}: a GPU is cuda:<index> or cuda:<GPU-/MIG-id>")
        if ident.isdigit() and entries is not None:
            index = int(ident)
            if index >= len(entries) or entries[index] in ("", "-1"):
                raise ValueError(
                    f"device {device!r}: CUDA_VISIBLE_DEVICES={inherited!r} makes only "
                    f"{_usable(entries)} GPU(s) visible to the agent; start it with fewer "
                    "devices or a wider CUDA_VISIBLE_DEVICES")
            ident = entries[index]
        ids.append(ident)
    if len(set(ids)) != len(ids):
        raise ValueError(f"devices {list(devices)} name one GPU twice ({ids})")
    return ids


def _usable(entries: list[str]) -> int:
    """How many GPUs a CUDA_VISIBLE_DEVICES list shows: CUDA stops at the first bad entry."""
    n = 0
    for e in entries:
        if e in ("", "-1"):
            break
        n += 1
    return n


def by_uuid(ids: list[str]) -> list[str]:
    """``ids`` with each index replaced by its GPU's UUID, where NVML names every one: an
    index means a GPU only under a ``CUDA_DEVICE_ORDER``, which each job could set anew
    (CUDA's default orders by speed, NVML and ``nvidia-smi`` by PCI bus); a UUID means one
    GPU under any. Resolved once, when the agent starts."""
    from gandiva.job import nvml

    if not any(i.isdigit() for i in ids):
        return ids
    named = [nvml.uuid_by_index(int(i)) if i.isdigit() else i for i in ids]
    return ids if None in named else [n for n in named if n is not None]


def is_mig(gpu_id: str) -> bool:
    """A MIG instance (``MIG-<uuid>``): CUDA shows a process only the first MIG instance of
    its ``CUDA_VISIBLE_DEVICES``, so a process sees one, and NCCL joins none of them."""
    return gpu_id.startswith("MIG-")


def visible(job_devices: Sequence[int], node_devices: int, in_place: bool) -> list[int]:
    """The devices (indices into the agent's) every process of a job sees, in order: the
    job's own in local-rank order; then, for a one-process job that moves in place, the
    node's others."""
    mine = list(job_devices)
    if in_place and len(mine) == 1:
        return mine + [d for d in range(node_devices) if d not in mine]
    return mine
