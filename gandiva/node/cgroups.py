"""Each run of a job in a cgroup (v2) of its own, where the machine has a hierarchy this
process may write: what the run started, however it forked (a daemon into a new session, a
double fork), is found there and killed with it.

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

KILL_WAIT_S = 5.0


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
        if self.root is not None:
            for left in self.root.iterdir():  # an earlier agent's runs, if it crashed
                if left.is_dir():
                    kill(left)

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
        return path


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
