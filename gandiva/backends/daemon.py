"""This machine's agent in the node daemon (``gandiva.node.daemon``): the ``Nodes`` of a server
that left root. Each call goes over the daemon's socket and waits for its answer; calls of
several threads travel at once. The daemon's events arrive on ``events`` as the agent's.

Crash-only: if the daemon dies, this process cannot run or stop a job any more, so it exits
(``DAEMON_DIED``) for its supervisor to start it again, as when its loop dies.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Collection, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gandiva.backends.nodes import AgentEvent, Launch
from gandiva.job import wire
from gandiva.node import environment
from gandiva.node.accounts import Account
from gandiva.node.daemon import AccountIn

if TYPE_CHECKING:
    from gandiva.state import Cluster

DAEMON_DIED = 71  # the server's exit status when its node daemon is gone
log = logging.getLogger("gandiva.server")


class DaemonError(RuntimeError):
    """What the daemon said went wrong with a call."""


class _Members(Collection[str]):
    """The daemon's jobs that are running (or ended), asked as ``job_id in nodes.jobs``."""

    def __init__(self, nodes: DaemonNodes, which: str) -> None:
        self._nodes, self._which = nodes, which

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and bool(
            self._nodes.call("has", job_id=job_id)[self._which])

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes.call("jobs") if self._which == "running" else [])

    def __len__(self) -> int:
        return len(list(iter(self)))


class DaemonNodes:
    """Starts the daemon (as this process, root, before it leaves uid 0) with the agent's
    settings; ``devices``, ``kind``, ``memory_gb``: this machine's (``detect_devices``)."""

    def __init__(self, workdir: Path, users: Path, devices: list[str], kind: str,
                 memory_gb: float, **agent: Any) -> None:
        self.workdir = Path(workdir).resolve()
        self.devices, self._kind, self._memory = devices, kind, memory_gb
        self.events: queue.Queue[AgentEvent] = queue.Queue()
        self.jobs = _Members(self, "running")
        self.ended = _Members(self, "ended")  # type: ignore[assignment]
        self._numbers = itertools.count(1)
        self._waiting: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._closing = False
        ours, theirs = socket.socketpair()
        config = {"workdir": str(self.workdir), "users": str(Path(users).resolve()),
                  "devices": devices, "memory_gb": memory_gb, **agent}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gandiva.node.daemon", json.dumps(config)],
            # what its jobs may have of the environment, no more (not GANDIVA_DB)
            env={**environment.for_jobs(), "GANDIVA_DAEMON_FD": str(theirs.fileno())},
            pass_fds=(theirs.fileno(),))
        theirs.close()
        self._sock = ours
        threading.Thread(target=self._read, name="gandiva-daemon", daemon=True).start()

    # ---- Nodes ----------------------------------------------------------------------------
    def cluster(self) -> Cluster:
        from gandiva.backends.driver import one_node

        return one_node(self.devices, self._kind, self._memory)

    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...]) -> None:
        self.call("start", job_id=job_id, devices=list(devices), launch={
            "command": launch.command, "cwd": str(launch.cwd) if launch.cwd else None,
            "env": launch.env,
            "account": AccountIn.of(launch.account) if launch.account else None})

    def suspend(self, job_id: str) -> None:
        self.call("suspend", job_id=job_id)

    def resume(self, job_id: str, devices: tuple[int, ...]) -> None:
        self.call("resume", job_id=job_id, devices=list(devices))

    def restart(self, job_id: str, devices: tuple[int, ...]) -> None:
        self.call("restart", job_id=job_id, devices=list(devices))

    def park(self, job_id: str) -> None:
        self.call("park", job_id=job_id)

    def kill(self, job_id: str) -> None:
        self.call("kill", job_id=job_id)

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0, size: int = -1) -> bytes:
        return self.call("read_log", job_id=job_id, rank=rank, offset=offset,
                         size=size).encode("latin-1")

    def log_size(self, job_id: str, rank: int = 0) -> int:
        return int(self.call("log_size", job_id=job_id, rank=rank))

    def checkpoint_dir(self, job_id: str) -> Path:
        return self.workdir / "jobs" / job_id / "checkpoints"

    def newest_checkpoint(self, job_id: str) -> Path | None:
        newest = self.call("newest_checkpoint", job_id=job_id)
        return None if newest is None else Path(newest)

    def warm_ready(self) -> bool:
        return bool(self.call("warm_ready"))

    def close(self) -> None:
        self._closing = True
        try:
            self.call("close")
        except DaemonError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    # ---- the tenancy's root work ------------------------------------------------------------
    def settle(self, name: str, base: Path, account: Account) -> None:
        self.call("settle", name=name, account=AccountIn.of(account))

    def can_run(self, name: str, base: Path, account: Account) -> str | None:
        return self.call("can_run", name=name, account=AccountIn.of(account))

    # ---- the socket -------------------------------------------------------------------------
    def call(self, op: str, **args: Any) -> Any:
        """Send a call, wait for its answer; ``DaemonError`` with what the daemon said."""
        number = next(self._numbers)
        answer: Future = Future()
        line = (json.dumps({"id": number, "op": op, **args}) + "\n").encode()
        with self._lock:
            self._waiting[number] = answer
            try:
                self._sock.sendall(line)
            except OSError:
                self._waiting.pop(number, None)
                raise DaemonError("the node daemon is gone") from None
        return answer.result()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._take(json.loads(line))
        with self._lock:
            for answer in self._waiting.values():
                answer.set_exception(DaemonError("the node daemon is gone"))
            self._waiting.clear()
        if not self._closing:
            log.critical("the node daemon (pid %d) is gone: the server exits (status %d) for "
                         "its supervisor to start both again", self.proc.pid, DAEMON_DIED)
            logging.shutdown()
            os._exit(DAEMON_DIED)

    def _take(self, message: dict[str, Any]) -> None:
        if "event" in message:
            data = message["data"]
            if isinstance(data, dict) and "report" in data:
                data = wire.report(data["report"])
            self.events.put(AgentEvent(message["event"], message["job_id"], data,
                                       message["time"]))
            return
        with self._lock:
            answer = self._waiting.pop(message["id"], None)
        if answer is None:
            return
        if "error" in message:
            answer.set_exception(DaemonError(message["error"]))
        else:
            answer.set_result(message["ok"])
