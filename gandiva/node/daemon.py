"""The node daemon: this machine's agent in a process of its own, for a server run as root.

A root server starts this (``python -m gandiva.node.daemon``, a fresh interpreter: it
imports nothing of the server, the policies or the simulator), then leaves uid 0 for its
service account; the daemon stays root, to run each job as its user's account. It speaks to
its parent alone, over the socket pair it was started with: one JSON object a line.

- The server sends calls: ``{"id": N, "op": "start", ...}``, each checked against its type
  (``Call``) before anything is done. Job ids are names (no path), an account is never root
  (uid, gid and groups above 0), a base directory is one of the users' directories. The
  daemon answers ``{"id": N, "ok": value}`` or ``{"id": N, "error": "..."}``, each call on a
  thread of its own (a suspend waits for a mini-batch boundary; others go on meanwhile).
- The daemon sends the agent's events: ``{"event": kind, "job_id": ..., "time": ...,
  "data": ...}``, a job's own report (``started``, ``profile``) as its wire line.

If the server goes (its end of the socket closes), the daemon exits at once and leaves the
jobs running: the next daemon's agent ends what the last one left (see ``Agent``), and the
next server takes the jobs up from their checkpoints, as after a crash of a server that ran
its agent itself.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gandiva.backends.nodes import Launch
from gandiva.job import wire
from gandiva.node import accounts
from gandiva.node.accounts import Account

LINE_BYTES = 1 << 22  # a call is a job's spec at most (256 KiB of environment): far below
JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
Id = Annotated[int, Field(ge=1)]  # never 0: root, its group


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AccountIn(_Strict):
    uid: Id
    gid: Id
    groups: list[Id] = []
    name: str | None = None
    home: str = "/"

    def account(self) -> Account:
        return Account(self.uid, self.gid, tuple(self.groups), self.name, self.home)

    @classmethod
    def of(cls, account: Account) -> dict[str, Any]:
        return {**asdict(account), "groups": list(account.groups)}


class LaunchIn(_Strict):
    command: list[str] = Field(min_length=1)
    cwd: str | None = None
    env: dict[str, str] = {}
    account: AccountIn | None = None

    def launch(self) -> Launch:
        return Launch(self.command, Path(self.cwd) if self.cwd else None, dict(self.env),
                      self.account.account() if self.account else None)


class Start(_Strict):
    op: Literal["start"]
    job_id: JobId
    launch: LaunchIn
    devices: list[Annotated[int, Field(ge=0)]]


class Resume(_Strict):
    op: Literal["resume", "restart"]
    job_id: JobId
    devices: list[Annotated[int, Field(ge=0)]]


class OfJob(_Strict):
    op: Literal["suspend", "park", "kill", "has", "newest_checkpoint"]
    job_id: JobId


class Log(_Strict):
    op: Literal["read_log", "log_size"]
    job_id: JobId
    rank: Annotated[int, Field(ge=0)] = 0
    offset: Annotated[int, Field(ge=0)] = 0
    size: Annotated[int, Field(ge=-1)] = -1


class Base(_Strict):
    """A user's base directory, made the account's (``settle``), or whether the account
    can start the interpreter there (``can_run``)."""

    op: Literal["settle", "can_run"]
    name: JobId  # the user's: their base directory is users/<name>
    account: AccountIn


class Plain(_Strict):
    op: Literal["warm_ready", "jobs", "close"]


Call = Annotated[Start | Resume | OfJob | Log | Base | Plain, Field(discriminator="op")]
CALL: TypeAdapter[Any] = TypeAdapter(Call)


class Daemon:
    """Carries out the calls on ``agent``; ``users``: the users' base directories' parent;
    ``probe``: whether an account can start the interpreter in a directory (``can_run``)."""

    def __init__(self, sock: socket.socket, agent: Any, users: Path, probe: Any) -> None:
        self.sock, self.agent, self.users, self.probe = sock, agent, users, probe
        self._send_lock = threading.Lock()

    def serve(self) -> None:
        threading.Thread(target=self._events, name="gandiva-daemon-events", daemon=True).start()
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                os._exit(0)  # the server went: its jobs run on (see the module's note)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._take(line)
            if len(buf) > LINE_BYTES:
                os._exit(2)  # not a server of ours

    def _take(self, line: bytes) -> None:
        try:
            data = json.loads(line)
            number = data.pop("id")
        except (ValueError, AttributeError, KeyError):
            return  # (a server of ours sends no such line)
        threading.Thread(target=self._answer, args=(number, data), daemon=True).start()

    def _answer(self, number: int, data: dict[str, Any]) -> None:
        try:
            call = CALL.validate_python(data)
            out = {"id": number, "ok": self._do(call)}
        except Exception as e:  # noqa: BLE001 - said to the caller, who raises it
            out = {"id": number, "error": f"{type(e).__name__}: {e}"}
        if out.get("ok", None) is not None and isinstance(out["ok"], bytes):
            out["ok"] = out["ok"].decode("latin-1")  # (bytes as code points 0-255)
        self._send(out)
        if isinstance(data, dict) and data.get("op") == "close" and "error" not in out:
            os._exit(0)

    def _do(self, call: Any) -> Any:
        agent = self.agent
        if isinstance(call, Start):
            return agent.start(call.job_id, call.launch.launch(), tuple(call.devices))
        if isinstance(call, Resume):
            return getattr(agent, call.op)(call.job_id, tuple(call.devices))
        if isinstance(call, OfJob):
            if call.op == "has":
                return {"running": call.job_id in agent.jobs, "ended": call.job_id in agent.ended}
            if call.op == "newest_checkpoint":
                newest = agent.newest_checkpoint(call.job_id)
                return None if newest is None else str(newest)
            return getattr(agent, call.op)(call.job_id)
        if isinstance(call, Log):
            if call.op == "log_size":
                return agent.log_size(call.job_id, call.rank)
            return agent.read_log(call.job_id, call.rank, call.offset, call.size)
        if isinstance(call, Base):
            base, account = self.users / call.name, call.account.account()
            if call.op == "settle":
                return accounts.settle(base, account)
            return self.probe(account, base)
        if call.op == "jobs":
            return list(agent.jobs)
        if call.op == "warm_ready":
            return agent.warm_ready()
        agent.close()
        return None

    def _events(self) -> None:
        while True:
            ev = self.agent.events.get()
            data = ev.data
            if isinstance(data, wire.Started | wire.Profile):
                data = {"report": wire.encode(data).decode()}
            elif is_dataclass(data) and not isinstance(data, type):
                data = asdict(data)
            self._send({"event": ev.kind, "job_id": ev.job_id, "time": ev.time, "data": data})

    def _send(self, message: dict[str, Any]) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self.sock.sendall(line)
            except OSError:
                os._exit(0)  # the server went


def main() -> None:
    """``python -m gandiva.node.daemon CONFIG``: CONFIG is the agent's (a JSON object);
    the socket to the server is ``GANDIVA_DAEMON_FD``."""
    from gandiva.node.agent import Agent

    config = json.loads(sys.argv[1])
    users = Path(config.pop("users"))
    sock = socket.socket(fileno=int(os.environ.pop("GANDIVA_DAEMON_FD")))
    agent = Agent(Path(config.pop("workdir")), **config)
    Daemon(sock, agent, users, accounts.can_run).serve()


if __name__ == "__main__":
    main()
