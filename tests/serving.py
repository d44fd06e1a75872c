"""A real `gandiva server` for tests, started the way a user starts one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from waiting import until

GANDIVA = [sys.executable, "-m", "gandiva.cli"]
CPU_ONLY = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # CPU slots, whatever GPUs there are
# A job that trains for as long as a test needs it running (until it is stopped) on next to
# no CPU, where what the test watches is the scheduling, not the learning: a state to
# checkpoint and restore, and mini-batches that wait rather than compute
PACED = """\
import sys, time
import torch
import gandiva.job as gj

job = gj.init()
job.register(model=torch.nn.Linear(2, 2))
for step in job.steps(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000):
    time.sleep(0.01)
"""  # a job that needs a job's life, not its work: 10 ms a step, until stopped or argv[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    home: Path
    tokens: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def user_dir(self, user: str) -> Path:
        return self.home / "users" / user


def add_user(home: Path, name: str, admin: bool = False, db: str | None = None,
             os_user: str | None = None) -> str:
    """`gandiva user add NAME`: the token it prints."""
    return subprocess.run([*GANDIVA, "user", "add", name, "--home", str(home),
                           *(["--admin"] if admin else []), *(["--db", db] if db else []),
                           *(["--os-user", os_user] if os_user else [])],
                          check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def running(home: Path, users: tuple[str, ...] = ("alice",), policy: str | None = None,
            slots: int = 2, db: str | None = None, args: tuple[str, ...] = (),
            up_s: float = 60, env: dict[str, str] | None = None,
            os_users: dict[str, str] | None = None) -> Iterator[Server]:
    """Users added, then `gandiva server` up (its /v1/whoami answers) and warm (``warm``);
    SIGTERM at the end, SIGKILL if it does not stop. ``policy``: a policy spec (default:
    the server's default policy); ``db``: a database URL (default: SQLite in ``home``);
    ``args``: more of the server's options; ``env``: more of its environment;
    ``os_users``: the OS account of a user, by name (``--os-user``)."""
    import httpx2

    passable(home)
    tokens = {u: add_user(home, u, db=db, os_user=(os_users or {}).get(u)) for u in users}
    log = home / "server.log"
    with log.open("w") as out:  # port 0: the server binds a free one itself (no race)
        proc = subprocess.Popen([*GANDIVA, "server", "--home", str(home), "--port", "0",
                                 "--slots", str(slots),
                                 *(["--policy", policy] if policy else []),
                                 *(["--db", db] if db else []), *args],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**CPU_ONLY, **(env or {})})

    def up() -> bool:
        try:
            return httpx2.get(f"{srv.url}/v1/whoami", timeout=2, headers={
                "Authorization": f"Bearer {tokens[users[0]]}"}).status_code == 200
        except httpx2.TransportError:
            return False

    try:
        try:
            srv = Server(listening(log, proc, up_s), home, tokens, proc)
            until(up, up_s, "the server to answer", alive=lambda: proc.poll() is None,
                  every=0.1)
            warm(srv.url, up_s, proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text()}") from None
        yield srv
    finally:
        stop(proc)


@dataclass
class InProcess:
    """A server's parts in the test's process behind a real uvicorn: ``client`` (FastAPI's
    TestClient, for the API) and ``url`` (for the CLI, run in-process with typer's runner)."""

    url: str
    home: Path
    tokens: dict[str, str]
    client: object
    service: object


@contextmanager
def in_process(home: Path, zygote, users: tuple[str, ...] = ("ada", "bob"),
               policy: str = "fifo", slots: int = 1) -> Iterator[InProcess]:
    """Store (SQLite in ``home``), loop, API and uvicorn on a free port in this process, with
    ``users`` and an admin ``root``: what `gandiva server --home HOME` runs, without a
    process of its own to start (seconds a test)."""
    import threading

    import uvicorn
    from fastapi.testclient import TestClient

    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.server.app import Service, create_app
    from gandiva.server.store import Store

    home.mkdir(parents=True, exist_ok=True)
    store = Store(str(home / "gandiva.db"))
    backend = Driver(make_policy(policy), home / "work", slots=slots, zygote=zygote)
    service = Service(store, backend, home)
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    tokens = {n: store.add_user(n, admin=(n == "root")) for n in (*users, "root")}
    for user in users:
        service.user_dir(store.principal(tokens[user])).mkdir(parents=True, exist_ok=True)
    app = create_app(service)
    web = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    try:
        until(lambda: web.started, 60, "uvicorn to start")
        url = f"http://127.0.0.1:{web.servers[0].sockets[0].getsockname()[1]}"
        yield InProcess(url, home, tokens, TestClient(app), service)
    finally:
        web.should_exit = True
        thread.join(timeout=10)
        backend.stop()
        loop.join(timeout=30)


def passable(path: Path) -> None:
    """As root, give the directories above ``path`` search permission for others (o+x:
    pass, never list) where they lack it: a root server's jobs, run as their users'
    accounts, must reach their directories under it (pytest's own are 0700)."""
    import stat

    if os.geteuid() != 0:
        return
    path = path.resolve()
    for directory in path.parents:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def listening(log: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    """The URL a server started with ``--port 0`` serves, from uvicorn's line in its log
    (a port chosen by the test and bound later by the server can be taken meanwhile)."""
    def said() -> str | None:
        for line in log.read_text(errors="replace").splitlines():
            if "Uvicorn running on " in line:
                return line.split("Uvicorn running on ")[1].split()[0]
        return None
    return until(said, timeout, "the server to listen", alive=lambda: proc.poll() is None,
                 every=0.05)


def warm(url: str, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    """Until the server at ``url`` starts jobs warm (``gandiva_warm_starts_ready``): a job
    submitted before its zygote has imported torch waits for that, and a test's timings
    would count it."""
    import httpx2

    with httpx2.Client(base_url=url, timeout=10) as http:
        until(lambda: metric(http, "gandiva_warm_starts_ready") == 1, timeout,
              "the server's zygote to be ready", every=0.1,
              alive=None if proc is None else lambda: proc.poll() is None)


def metric(http, name: str) -> float:
    """A metric's value from the server's /metrics (NaN if it has none of that name)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Ask ``proc`` to end with ``sig``; SIGKILL if it has not within ``timeout`` s."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
