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
from collections.abc import Callable, Iterable
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


def use(lib: Any) -> None:
    """Ask ``lib`` (a module with pynvml's functions) from now on: a machine's own NVML, or
    one that says what a container, MIG or Windows' driver model would (tests)."""
    global _nvml
    _nvml = lib


def uuid_by_index(index: int) -> str | None:
    """The UUID (``GPU-...``) of the GPU NVML numbers ``index`` (PCI bus order, as
    ``nvidia-smi``), if known."""
    nv = _lib()
    if nv is None:
        return None
    try:
        uuid = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(index))
    except Exception:
        return None
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def held_gb(pid: int | None = None) -> float | None:
    """Device memory the process holds on all GPUs, in GB; None if unknown, never 0 for it:
    the driver accounts none to it (``usedGpuMemory`` None: WDDM, MIG without privileges),
    it lists processes by numbers this process cannot see (a PID namespace of its own, as
    in a container without ``--pid=host``), or it lists no process at all."""
    pid = os.getpid() if pid is None else pid
    return held_gb_of([pid])[pid]


def held_gb_of(pids: Iterable[int]) -> dict[int, float | None]:
    """``held_gb`` of each of ``pids``, from one listing of the driver's processes."""
    nv = _lib()
    listed = None
    if nv is not None:
        try:
            listed = [p for h in _handles(nv) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
        except Exception:
            pass
    return {pid: None if listed is None else _held(listed, pid) for pid in pids}


def _held(listed: list[Any], pid: int) -> float | None:
    used = [p.usedGpuMemory for p in listed if p.pid == pid]
    if any(u is None for u in used):
        return None
    if used:
        return sum(used) / 2**30
    # not listed: it holds nothing if the driver's numbers are this process's own (each one
    # listed is a process here), else nothing is known
    if listed and all(os.path.exists(f"/proc/{p.pid}") for p in listed):
        return 0.0
    return None


def own_utilization(samples: Iterable[Any], pid: int, since_us: int) -> float | None:
    """The mean SM utilisation (0..1) of ``pid`` in NVML's per-process ``samples`` (each
    with ``pid``, ``timeStamp`` in microseconds, ``smUtil`` in percent) taken after
    ``since_us``; None if it has none."""
    mine = [s.smUtil for s in samples if s.pid == pid and s.timeStamp > since_us]
    return sum(mine) / len(mine) / 100.0 if mine else None


# The driver samples each process's use of a GPU once a period (1/6 s to 1 s, by product)
# and keeps a sample only for a process that used it: a span at least this long without
# one of this process's samples is one in which it did not compute. (Shorter spans are
# extended by the caller, never read.)
SAMPLE_PERIOD_S = 1.0


def utilization(uuid: str, since_us: int, pid: int | None = None) -> float | None:
    """This process's own share of the GPU ``uuid``'s time since ``since_us`` (NVML's clock,
    microseconds since the epoch, at least ``SAMPLE_PERIOD_S`` ago): 0.0 where the driver
    kept no sample of it (NOT_FOUND: none of anyone's); None if unknown (no NVML, a MIG
    instance, which has no per-process samples, any other error)."""
    nv = _lib()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        samples = nv.nvmlDeviceGetProcessUtilization(handle, since_us)
    except Exception as err:
        if getattr(err, "value", None) == getattr(nv, "NVML_ERROR_NOT_FOUND", 6):
            return 0.0
        return None
    own = own_utilization(samples, os.getpid() if pid is None else pid, since_us)
    return 0.0 if own is None else own


class Span:
    """A job's utilisation read over spans of at least ``SAMPLE_PERIOD_S`` from ``since``
    (wall-clock seconds): a profile window shorter than that says the last span's value
    (None before the first: unknown), never a reading the driver could not have made."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.value: float | None = None

    def read(self, now: float, ask: Callable[[int], float | None]) -> float | None:
        """``ask(since_us)`` (``utilization``'s) once the span is long enough."""
        if now - self.since >= SAMPLE_PERIOD_S:
            self.value, self.since = ask(int(self.since * 1e6)), now
        return self.value
