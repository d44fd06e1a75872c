"""`gandiva server` as users run it: a real process, killed with SIGKILL and restarted, over
a SQLite file and over a PostgreSQL server."""

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch")
from serving import GANDIVA, PACED, free_port, passable, stop, warm  # noqa: E402
from waiting import until  # noqa: E402


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def client(port: int, token: str):
    import httpx2

    return httpx2.Client(base_url=f"http://127.0.0.1:{port}",
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)


def launch(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A server whose output goes to ``log`` (appended), never to a pipe: its access log
    would fill a pipe nobody reads and block the server mid-request."""
    log.parent.mkdir(parents=True, exist_ok=True)
    passable(Path(args[args.index("--home") + 1]))
    with log.open("ab") as out:
        proc = subprocess.Popen([*GANDIVA, "server", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def output(proc: subprocess.Popen) -> str:
    return proc.log.read_text(errors="replace")[-5000:]


def start(home: Path, db: str, port: int) -> subprocess.Popen:
    return launch(["--home", str(home), "--db", db, "--port", str(port),
                   "--policy", "gandiva:quantum=1", "--slots", "2", "--checkpoint-every", "0.5"],
                  home.parent / "server.log")


def follow(http, until: Callable[[list[dict]], bool], timeout: float = 240.0) -> list[dict]:
    """The server's events from the first on, read from its event stream as they are stored,
    until ``until`` holds of those read so far."""
    import httpx2

    got: list[dict] = []
    deadline = time.monotonic() + timeout
    with http.stream("GET", "/v1/events/stream",
                     timeout=httpx2.Timeout(10, read=timeout)) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                got.append(json.loads(line.removeprefix("data: ")))
                if until(got):
                    return got
            assert time.monotonic() < deadline, got[-5:]
    raise AssertionError(f"the event stream ended: {got[-5:]}")


def of(job_id: str, events: list[dict]) -> list[dict]:
    return [e for e in events if e["job_id"] == job_id]


def wait_up(http, proc, timeout=60.0) -> None:
    """(A process starting: nothing to wait on but its port answering.)"""
    import httpx2

    def answers() -> bool:
        try:
            return http.get("/v1/jobs").status_code == 200
        except httpx2.TransportError:
            return False
    try:
        until(answers, timeout, "the server to come up", alive=lambda: proc.poll() is None,
              every=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{output(proc)}") from None


def wait_warm(http, proc) -> None:
    """Up, and its jobs start warm: what is submitted now does not start cold."""
    wait_up(http, proc)
    warm(str(http.base_url), proc=proc)


# (on PostgreSQL in CI's second run, with the slow tests: the same code path as SQLite's)
@pytest.mark.parametrize("db_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)],
                         indirect=True)
def test_server_killed_with_sigkill_loses_no_job_and_resumes_from_checkpoints(tmp_path, db_url):
    home, port = tmp_path / "home", free_port()
    if db_url.startswith("sqlite"):  # (in the server's home: its service account's, as root)
        db_url = f"sqlite:///{home / 'g.db'}"
    token = subprocess.run([*GANDIVA, "user", "add", "ada", "--home", str(home), "--db", db_url],
                           check=True, capture_output=True, text=True).stdout.strip()
    (home / "users" / "ada" / "paced.py").write_text(PACED)  # jobs use files of their user's
    proc = start(home, db_url, port)
    http = client(port, token)
    try:
        wait_warm(http, proc)
        # (300 steps: 3 s each, three jobs on two slots; the kill comes at the first
        # checkpoint, 0.5 s in)
        ids = [http.post("/v1/jobs", json={"name": f"paced{i}", "command":
                                           ["python", "paced.py", "300"]}).json()["id"]
               for i in range(3)]
        ckpts = home / "run" / "jobs" / ids[0] / "checkpoints"
        until(lambda: ckpts.is_dir() and any(ckpts.iterdir()), 120,  # (no event says a
              f"a checkpoint of {ids[0]}")  # checkpoint was written: the file is looked for)
        proc.send_signal(signal.SIGKILL)  # mid-run: jobs running, queued or suspended
        proc.wait()
        orphans = [int(line.split()[0]) for i in ids
                   for p in [home / "run" / "jobs" / i / "pids"] if p.exists()
                   for line in p.read_text().splitlines()]
        tmpdirs = [Path(p.read_text()) for i in ids
                   for p in [home / "run" / "jobs" / i / "tmp"] if p.exists()]
        assert tmpdirs and all(t.is_dir() for t in tmpdirs)
        proc = start(home, db_url, port)
        wait_up(http, proc)
        follow(http, lambda events: all(
            any(e["kind"] in ("done", "failed") for e in of(i, events)) for i in ids))
        jobs = {j["id"]: j for j in http.get("/v1/jobs").json()}
        assert [jobs[i]["state"] for i in ids] == ["done"] * 3 and len(jobs) == 3
        for pid in orphans:  # nothing of the killed server's jobs runs on (none runs twice)
            assert not Path(f"/proc/{pid}").exists() or "Z" in stat_state(pid)
        for tmp in tmpdirs:  # ...and their TMPDIRs went with them
            assert not tmp.exists(), tmp
        events = http.get(f"/v1/jobs/{ids[0]}/events").json()
        kinds = [e["kind"] for e in events]
        assert "requeued" in kinds and kinds[-1] == "done"
        assert [e["at"] for e in events] == sorted(e["at"] for e in events)
        assert not (home / "gandiva.db").exists()  # all of it was in the database asked for
        log = (home / "run" / "jobs" / ids[0] / "rank0.log").read_text()
        assert "restored from checkpoint at step" in log  # ...not from the beginning
    finally:
        if proc.poll() is None:
            stop(proc)


def test_sigterm_checkpoints_running_jobs_at_their_next_mini_batch_and_a_restart_resumes_there(
        tmp_path):
    """An upgrade: the server is stopped with SIGTERM and started again, during a flood of
    submissions. With no periodic checkpoint due (every 300 s), a job still resumes from the
    step where it was stopped; every acknowledged submission is stored once (the client
    retries with its submission_id until it is acknowledged)."""
    import httpx2

    from gandiva.job import checkpoint

    home, port = tmp_path / "home", free_port()
    db = str(home / "g.db")
    token = subprocess.run([*GANDIVA, "user", "add", "ada", "--home", str(home), "--db", db],
                           check=True, capture_output=True, text=True).stdout.strip()
    (home / "users" / "ada" / "paced.py").write_text(PACED)

    def serve() -> subprocess.Popen:
        return launch(["--home", str(home), "--port", str(port), "--policy", "fifo",
                       "--slots", "1", "--drain", "60"], tmp_path / "server.log",
                      env={**os.environ, "GANDIVA_DB": db, "GANDIVA_CHECKPOINT_EVERY": "300"})

    proc = serve()
    http = client(port, token)
    flooding = threading.Event()
    try:
        wait_warm(http, proc)
        job_id = http.post("/v1/jobs", json={"name": "long", "command": [
            "python", "paced.py"]}).json()["id"]
        log = home / "run" / "jobs" / job_id / "rank0.log"
        follow(http, lambda events: any(e["data"].get("steps", 0) > 0  # it has trained
                                        for e in of(job_id, events)), timeout=120)
        acked: dict[str, str] = {}  # submission id -> job id
        refused: list[str] = []  # what the flood got other than an acknowledgement
        more = threading.Condition()  # notified at each acknowledgement
        flooding.set()

        def flood() -> None:  # queued behind the long job (fifo, one slot): none runs
            with client(port, token) as mine:
                i = 0
                while flooding.is_set():
                    try:
                        r = mine.post("/v1/jobs", json={
                            "name": "flood", "command": ["true"], "labels": {"flood": "1"},
                            "submission_id": f"f{i}"})
                        if r.status_code in (200, 201):
                            with more:
                                acked[f"f{i}"] = r.json()["id"]
                                more.notify_all()
                            i += 1
                        else:
                            refused.append(f"f{i}: {r.status_code} {r.text[:300]}")
                    except httpx2.HTTPError as e:
                        refused.append(f"f{i}: {e!r}")
                        time.sleep(0.05)  # the server is stopping or starting: retry

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        with more:
            assert more.wait_for(lambda: len(acked) >= 20, timeout=60), refused[-5:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        assert proc.returncode == 0, output(proc)
        ckpts = home / "run" / "jobs" / job_id / "checkpoints"
        stopped_at = checkpoint.steps(ckpts)[0]  # the only checkpoint: the drain's
        assert stopped_at > 0
        proc = serve()
        wait_up(http, proc)

        def resumed(events: list[dict]) -> bool:  # its first report after the restart
            kinds = [e["kind"] for e in of(job_id, events)]
            return "requeued" in kinds and "profile" in kinds[kinds.index("requeued"):]

        follow(http, resumed, timeout=120)
        assert f"restored from checkpoint at step {stopped_at}" in log.read_text()
        kinds = [e["kind"] for e in http.get(f"/v1/jobs/{job_id}/events").json()]
        assert "stopped-for-shutdown" in kinds and "requeued" in kinds
        before_restart = len(acked)
        with more:  # and the flood goes on after the restart
            assert more.wait_for(lambda: len(acked) >= before_restart + 20, timeout=60), \
                refused[-5:]
        flooding.clear()
        flooder.join(timeout=30)
        stored, url = [], "/v1/jobs?label=flood%3D1&limit=1000"
        while url:
            r = http.get(url)
            stored += r.json()
            url = r.links.get("next", {}).get("url")
        assert sorted(j["id"] for j in stored) == sorted(acked.values())  # none lost, none twice
        assert {j["submission_id"] for j in stored} == set(acked)
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    finally:
        flooding.clear()
        if proc.poll() is None:
            stop(proc, timeout=90)


# The server with its loop's step made to raise once ``sys.argv[1]`` exists, as a bug would.
BROKEN_LOOP = """\
import sys
from pathlib import Path
from gandiva.backends.driver import Driver
from gandiva.cli import app

flag, step = Path(sys.argv.pop(1)), Driver._step

def broken(self):
    if flag.exists():
        raise RuntimeError("a bug in the loop")
    step(self)

Driver._step = broken
app(prog_name="gandiva")
"""


def test_a_server_whose_loop_died_exits_and_a_restart_runs_its_jobs(tmp_path):
    """Crash-only: a server that can no longer schedule exits non-zero at once, rather than
    take jobs it would never run; started again, it runs them."""
    import sys

    home = tmp_path / "home"
    db = str(home / "g.db")
    passable(home)
    token = subprocess.run([*GANDIVA, "user", "add", "ada", "--home", str(home), "--db", db],
                           check=True, capture_output=True, text=True).stdout.strip()
    (home / "users" / "ada" / "paced.py").write_text(PACED)
    (tmp_path / "broken.py").write_text(BROKEN_LOOP)
    flag, port = tmp_path / "break", free_port()
    args = ["server", "--home", str(home), "--db", db, "--port", str(port), "--slots", "1"]
    log = tmp_path / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "broken.py"), str(flag), *args],
                                stdout=out, stderr=subprocess.STDOUT)
    proc.log = log
    http = client(port, token)
    try:
        wait_warm(http, proc)
        job = http.post("/v1/jobs", json={"name": "p", "command": ["python", "paced.py", "100"]}
                        ).json()["id"]
        follow(http, lambda events: any(e["data"].get("steps", 0) > 0 for e in of(job, events)))
        flag.touch()
        assert proc.wait(timeout=60) == 70, output(proc)
        assert "the scheduler loop died" in output(proc)
        proc = launch(args[1:], log)
        wait_up(http, proc)
        follow(http, lambda events: any(e["kind"] == "done" for e in of(job, events)))
        assert http.get(f"/v1/jobs/{job}").json()["state"] == "done"
    finally:
        if proc.poll() is None:
            stop(proc)
