"""What NVML says of one process: the device memory it holds and the share of its GPU's time
it computes, its own and not the GPU's (a packed partner's work is the partner's).

``nvidia-ml-py`` (the ``pynvml`` module, in the ``runtime`` extra) reads the driver's
library; without it, or without a driver, every answer is None and callers say "unknown".
Decision: the held memory is what the driver accounts to the process on every GPU, the CUDA
context and the caching allocator's reserve included, since that is what another job packed
beside it cannot have. Where the process runs in a PID namespace of its own (a container
without ``--pid=host``), NVML lists host PIDs and the process is not found: unknown too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

_nvml: Any = None  # the module once initialised; False once it failed


def _lib() -> Any:
    global _nvml
    if _nvml is None:
        try:
            import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no types

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # not installed, no driver, no GPU: nothing to ask
            _nvml = False
    return _nvml or None


def _handles(nv: Any) -> list[Any]:
    return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]


def held_gb(pid: int | None = None) -> float | None:
    """Device memory the process holds on all GPUs, in GB; None if unknown."""
    nv = _lib()
    if nv is None:
        return None
    pid = os.getpid() if pid is None else pid
    try:
        used = [p.usedGpuMemory for h in _handles(nv)
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == pid]
    except Exception:
        return None
    if not used:
        return 0.0 if _listed_anyone(nv) else None
    return sum(u or 0 for u in used) / 2**30


def _listed_anyone(nv: Any) -> bool:
    """Whether NVML lists processes at all here (else a PID namespace hides them)."""
    try:
        return any(nv.nvmlDeviceGetComputeRunningProcesses(h) for h in _handles(nv))
    except Exception:
        return False


def own_utilization(samples: Iterable[Any], pid: int, since_us: int) -> float | None:
    """The mean SM utilisation (0..1) of ``pid`` in NVML's per-process ``samples`` (each
    with ``pid``, ``timeStamp`` in microseconds, ``smUtil`` in percent) taken after
    ``since_us``; None if it has none."""
    mine = [s.smUtil for s in samples if s.pid == pid and s.timeStamp > since_us]
    return sum(mine) / len(mine) / 100.0 if mine else None


def utilization(uuid: str, since_us: int, pid: int | None = None) -> float | None:
    """This process's own share of the GPU ``uuid``'s time since ``since_us`` (NVML's clock,
    microseconds since the epoch); None if unknown."""
    nv = _lib()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        samples = nv.nvmlDeviceGetProcessUtilization(handle, since_us)
    except Exception:  # NVML_ERROR_NOT_FOUND: no sample since then
        return None
    return own_utilization(samples, os.getpid() if pid is None else pid, since_us)
