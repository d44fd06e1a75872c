"""A throw-away PostgreSQL cluster for the tests: ``initdb`` into a temporary directory, one
server on 127.0.0.1, a fresh database per test, and all of it removed at the end.

PostgreSQL refuses to run as root, so under root every server command runs as the
``postgres`` user (``runuser -u postgres --``) in a directory handed to that user.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 30
START_TRIES = 3  # a free port can be taken by another process before the server binds it
# Durability as in production (these are PostgreSQL's defaults; said here because the tests
# rely on them): a commit is on disk before the client hears of it.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}


def bindir() -> Path | None:
    """Where ``initdb``, ``pg_ctl`` and ``postgres`` are: on PATH, else in Debian's
    versioned directory (the packages leave those off PATH), the newest version's."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    dirs = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    dirs.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    return dirs[-1] if dirs else None


def unavailable() -> str | None:
    """Why no cluster can be started here, or None."""
    if bindir() is None:
        return "PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run PostgreSQL as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One PostgreSQL server over a fresh data directory; ``start`` then ``stop``."""

    def __init__(self) -> None:
        found = bindir()
        assert found is not None, unavailable()
        self.bin = found
        self.dir = Path(tempfile.mkdtemp(prefix="gandiva-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0
        self._names = itertools.count()
        self._as_owner: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as_owner = ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str) -> None:
        out = self.dir / f"{tool}.out"
        with out.open("wb") as f:  # not a pipe: the server pg_ctl starts would hold it open
            done = subprocess.run([*self._as_owner, str(self.bin / tool), *args],
                                  stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=START_TIMEOUT_S + 10)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed:\n"
                               f"{out.read_text(errors='replace')}\n{log}")

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--no-locale")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("".join(f"{k} = {v}\n" for k, v in SETTINGS.items()))
            conf.write(f"unix_socket_directories = '{self.dir}'\n")
        for attempt in range(START_TRIES):
            self.port = free_port()
            try:
                self._start_server()
                return
            except RuntimeError as e:
                if attempt == START_TRIES - 1 or "already in use" not in str(e):
                    raise

    def _start_server(self) -> None:
        self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(START_TIMEOUT_S), "-o", f"-p {self.port}")

    def crash_and_restart(self) -> None:
        """Stop the server as a crash would (no shutdown checkpoint, so starting again
        recovers from the write-ahead log), then start it again on the same port."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        self._start_server()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server and every process of it stopped (SIGSTOP), as a hung host or a paused
        VM: connections stay open and TCP is acknowledged, but nothing answers."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                  text=True).stdout.split()
        pids = [postmaster, *map(int, children)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server and remove everything. Immediately: a clean shutdown would first
        write and fsync a checkpoint of a cluster about to be deleted."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; returns its URL."""
        import psycopg

        name = f"gandiva_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)
