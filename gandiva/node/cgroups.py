"""Each run of a job in a cgroup (v2) of its own, where the machine has a hierarchy this
process may write: what the run started, however it forked (a daemon into a new session, a
double fork), is found there and killed with it.

Where the agent's cgroup delegates the pids and memory controllers (its parent enables them
for it), each run is also bounded: ``pids.max`` as an account's processes are
(``accounts.processes_allowed``), ``memory.max`` to all of the machine's memory but
``MEMORY_KEPT_BYTES``, so that no one run takes the memory the node's own processes need.

The agent's runs live under one cgroup named after its work directory, beside the agent's
own: an agent started again after a crash finds its predecessor's runs there and ends them.
A process joins its run's cgroup before any of the job's code runs where it can (a warm
fork, as root: ``join``); a cold start is moved in by the agent as soon as it has started.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

from gandiva.node.accounts import processes_allowed

KILL_WAIT_S = 5.0
LIMITED = {"pids", "memory"}
# where the memory controller is delegated, a run may take all the machine's memory but this
# (or half, on a small machine): what the agent, the server and the system keep
MEMORY_KEPT_BYTES = 2 << 30


def hierarchy() -> Path | None:
    """The cgroup v2 directory this process is in, if it may make cgroups beneath it."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        mine = next((line.split(":", 2)[2] for line in
                     Path("/proc/self/cgroup").read_text().splitlines()
                     if line.startswith("0::")), None)
    except OSError:
        return None
    mount = next((fields[1] for line in mounts if (fields := line.split())[2:3] == ["cgroup2"]),
                 None)
    if mount is None or mine is None:
        return None
    here = Path(mount) / mine.lstrip("/")
    return here if os.access(here, os.W_OK) else None


class Runs:
    """The cgroups of the runs of one agent's jobs (``workdir`` names it); none where the
    machine has no writable v2 hierarchy (``available`` False: every call does nothing)."""

    def __init__(self, workdir: Path) -> None:
        base = hierarchy()
        name = "gandiva-" + hashlib.sha256(str(workdir).encode()).hexdigest()[:12]
        self.root = base / name if base is not None else None
        if self.root is not None:
            try:
                self.root.mkdir(exist_ok=True)
            except OSError:
                self.root = None
        self.limits: set[str] = set()  # of "pids", "memory": what each run is bounded by
        if self.root is not None:
            for left in self.root.iterdir():  # an earlier agent's runs, if it crashed
                if left.is_dir():
                    kill(left)
            self.limits = _delegate(self.root)

    @property
    def available(self) -> bool:
        return self.root is not None

    def close(self) -> None:
        """(The agent closes, its runs ended.) Its cgroup goes too."""
        if self.root is not None:
            for left in self.root.iterdir():
                if left.is_dir():
                    kill(left)
            try:
                self.root.rmdir()
            except OSError:
                pass

    def make(self, job_id: str, run: int) -> Path | None:
        """A fresh cgroup for this run of the job."""
        if self.root is None:
            return None
        path = self.root / f"{job_id}.{run}"
        if path.exists():
            kill(path)
        try:
            path.mkdir()
        except OSError:
            return None
        if "pids" in self.limits:
            _write(path / "pids.max", processes_allowed())
        if "memory" in self.limits and (total := memory_bytes()) is not None:
            _write(path / "memory.max", max(total - MEMORY_KEPT_BYTES, total // 2))
        return path


def _delegate(root: Path) -> set[str]:
    """Give the runs under ``root`` the pids and memory controllers where its parent lets
    it have them (``cgroup.controllers``); what it got."""
    try:
        available = set((root / "cgroup.controllers").read_text().split()) & LIMITED
        if available:
            (root / "cgroup.subtree_control").write_text(
                " ".join(f"+{name}" for name in sorted(available)))
        return set((root / "cgroup.subtree_control").read_text().split()) & LIMITED
    except OSError:
        return set()


def _write(path: Path, value: int) -> None:
    try:
        path.write_text(str(value))
    except OSError:
        pass


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def join(group: Path | None, pid: int = 0) -> None:
    """Move ``pid`` (0: this process) into ``group``."""
    if group is not None:
        try:
            (group / "cgroup.procs").write_text(str(pid or os.getpid()))
        except OSError:
            pass


def kill(group: Path | None) -> None:
    """Kill everything in ``group`` and remove it: ``cgroup.kill`` where the kernel has it
    (5.14), else each process it lists, until it is empty."""
    if group is None or not group.exists():
        return
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            break
        if not pids:
            break
        try:
            (group / "cgroup.kill").write_text("1")
        except OSError:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.01)
    try:
        group.rmdir()
    except OSError:
        pass
