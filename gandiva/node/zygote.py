"""The agent's side of warm starts (see ``gandiva.job.warm``): one zygote per agent, and a
handle for each process it forks that the agent uses as it uses a ``subprocess.Popen``.

The zygote is the parent of what it forks, so an exit status reaches the agent as the
zygote's ``Exited`` report. If the zygote itself dies, its children live on (they are jobs);
their exit status is then unknown, and a handle reports ``LOST`` once its process is gone.

A fork inherits what the zygote's start-up made of its environment (``warm_compatible``),
so a job whose environment would have made a different start-up starts cold.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from gandiva.job import wire

FORK_TIMEOUT_S = 10.0  # the zygote answers a fork in ~10 ms; beyond this it is stuck
LOST = 255  # the exit status of a forked process whose zygote died before it ended

# Variables read when Python starts, when torch is imported or when a native library loads
# (OpenMP, BLAS, the dynamic linker): all of that happened in the zygote.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_",
                    "GOTO_", "TORCH", "PYTORCH_")
# ...except those that torch reads only when the job uses what they set (a process group,
# the CUDA allocator), which a fork does after it has the job's environment. CUDA_* is
# absent above for the same reason: the zygote never initialises CUDA.
LATE_PREFIXES = ("TORCH_NCCL_", "TORCHELASTIC_", "TORCH_DISTRIBUTED_",
                 "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")


def warm_compatible(zygote_env: Mapping[str, str], job_env: Mapping[str, str]) -> str | None:
    """None if a fork of a zygote started with ``zygote_env`` runs as a fresh interpreter
    started with ``job_env`` would; else the first variable (by name) that differs and acts
    at start-up, for the log: such a job must start cold."""
    for name in sorted(set(zygote_env) | set(job_env)):
        if (name.startswith(STARTUP_PREFIXES) and not name.startswith(LATE_PREFIXES)
                and zygote_env.get(name) != job_env.get(name)):
            return name
    return None


class Forked:
    """A process the zygote forked: ``pid``, ``poll``, ``wait`` and ``kill`` as on Popen."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self._lock = threading.Lock()  # the status is handed over once: to the first poll

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self.returncode = self._zygote.exit_code(self.pid)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Zygote:
    """Starts ``python -m gandiva.job.warm`` at once; ``fork`` gives a warm process once its
    imports are done (``ready``), None before that or when it cannot. ``env``: the zygote's
    whole environment, what every job gets (so that ``warm_compatible(zygote.env, job_env)``
    holds for ordinary jobs; none of this process's own reaches it or its forks)."""

    def __init__(self, python: str, workdir: Path, env: Mapping[str, str]) -> None:
        self._lock = threading.Lock()  # one fork at a time: a request, then its answer
        self._exits: dict[int, int] = {}
        self._forked: list[int] = []
        self._answer = threading.Condition()
        self._ready = threading.Event()
        self._gone = False  # its channel closed: it will never be ready
        self.env = dict(env)
        ours, theirs = socket.socketpair()
        with open(workdir / "warm.log", "ab") as log:
            self.proc = subprocess.Popen(
                [python, "-u", "-m", "gandiva.job.warm"],
                env={**self.env, "GANDIVA_CONTROL_FD": str(theirs.fileno())}, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),), start_new_session=True,
                cwd=workdir)
        theirs.close()
        self._sock = ours
        self._reader = threading.Thread(target=self._read, name="gandiva-zygote", daemon=True)
        self._reader.start()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.alive

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        """Wait until its imports are done (``ready``), it died, or ``timeout`` passed."""
        with self._answer:
            self._answer.wait_for(lambda: self._ready.is_set() or self._gone, timeout)
        return self.ready

    def fork(self) -> tuple[Forked, socket.socket] | None:
        """A warm process and the agent's end of its control channel."""
        if not self.ready:
            return None
        ours, theirs = socket.socketpair()
        with self._lock:
            try:
                socket.send_fds(self._sock, [wire.encode(wire.Fork())], [theirs.fileno()])
            except OSError:
                ours.close()
                return None
            finally:
                theirs.close()
            with self._answer:
                if not self._answer.wait_for(lambda: self._forked or not self.alive,
                                             FORK_TIMEOUT_S) or not self._forked:
                    ours.close()
                    return None
                pid = self._forked.pop(0)
        return Forked(pid, self), ours

    def exit_code(self, pid: int) -> int | None:
        with self._answer:
            code = self._exits.pop(pid, None)
        if code is not None or self.alive or self._reader.is_alive():
            return code
        # the zygote is gone, and with it the exit status: only whether the process is
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone, or the pid is another's now
            return LOST
        return None

    def close(self) -> None:
        """Close the channel: the zygote exits (what it forked runs on); one still importing
        is killed."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        self._sock.close()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            if len(buf) > wire.LINE_BYTES and b"\n" not in buf:
                buf = b""  # not ours (ours are a line of a few bytes): dropped, never held
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = wire.report(line)
                except (ValueError, TypeError):
                    continue  # not ours (nothing else writes here): skipped
                with self._answer:
                    if isinstance(msg, wire.Ready):
                        self._ready.set()
                    elif isinstance(msg, wire.Forked):
                        self._forked.append(msg.pid)
                    elif isinstance(msg, wire.Exited):
                        self._exits[msg.pid] = msg.code
                    self._answer.notify_all()
        with self._answer:
            self._gone = True
            self._answer.notify_all()
