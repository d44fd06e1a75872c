"""Faults a platform team meets, one at a time, on a real server under a steady load: what is
acknowledged and lost, how long the scheduler's loop paused, how long recovery took, what a
user saw.

For each database (SQLite: a file; PostgreSQL: a throw-away cluster, fsync on, as
``tests/pgcluster.py`` starts one) and each fault, a fresh ``gandiva server`` process runs on
two CPU slots with two long jobs of the job library (checkpointing every 2 s, 200 bytes
of log every 10 steps) and a client that submits a short job (``true``) every ``SUBMIT_EVERY_S``,
each with its own ``submission_id``, retrying a 503 or a failed connection after 1 s with
the same id, as the CLI's client does. Another client reads ``/readyz`` every second. After
a warm-up the fault is injected for its length, the load goes on ``AFTER_S`` more, then every
job is waited for.

Faults: the database stopped (PostgreSQL: ``pg_ctl stop``, then started again; SQLite:
another process holds its write lock) for 10 s and 120 s; PostgreSQL frozen (every process
SIGSTOPped: connections open, nothing answers) for 60 s; the server SIGSTOPped for 60 s; a
long job's rank hung (it stops reporting; ``--hang-after 10``); the checkpoint volume full
(a 64 MiB tmpfs mounted under the server's job directory and filled, 20 s); a running job's
checkpoint directory removed; the wall clock stepped a day ahead for 20 s and back (an NTP
step, for the server's process tree only: see ``STEPPED_CLOCK``; the long jobs have a time
limit of 10 min); at scale, the database stopped 10 s under a server of 1,000 hollow
8-GPU nodes (no processes) with a steady stream of hollow jobs; and hostile jobs: one job
for each kind of bad report ``tests/test_hostile_job.py`` sends, all at once (they fail,
by their own fault: not counted as failed).

Each row: submissions acknowledged (2xx), lost (acknowledged, not stored at the end: must be
0), jobs failed (must be 0: no fault here is a job's own fault), 503s and failed connections
the client met, the longest pause of the scheduling loop (``gandiva_loop_longest_pause_
seconds``), recovery (from the fault's end to the first acknowledged submission and
``/readyz`` 200, whichever is later), and what the user saw.

Usage: python benchmarks/faults.py [--db sqlite,postgresql] [--only NAME,...] [--short]
``--short``: every fault lasts 10 s (a quick check; the committed run is without it).
Needs root for the tmpfs (the disk-full row is skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' server and PostgreSQL helpers
import pgcluster  # noqa: E402
from serving import metric, running  # noqa: E402
from test_hostile_job import CASES, HOSTILE  # noqa: E402
from waiting import until  # noqa: E402

SUBMIT_EVERY_S = 0.5
WARM_S = 5.0
AFTER_S = 10.0
DRAIN_S = 180.0  # every acknowledged job ends within this after the load stops
REQUEST_TIMEOUT_S = 30.0  # a request unanswered this long counts as a failed connection
ASK_EVERY_S = 0.5  # how often the benchmark asks the server whether what it waits for came
console = Console(width=200)
VERBOSE = False

LONG_JOB = """\
import os, time
from pathlib import Path
import torch
import gandiva.job as gj

job = gj.init()
model = torch.nn.Linear(256, 256)
job.register(model=model)
for step in job.steps(int(os.environ.get("STEPS", "600"))):
    model(torch.randn(8, 256)).sum().backward()
    time.sleep(0.05)
    if step % 10 == 0:
        print(f"step {step} " + "=" * 200, flush=True)  # a progress bar's worth of log
    if step == 100 and os.environ.get("HANG") and not Path("hung-once").exists():
        Path("hung-once").touch()
        time.sleep(10**6)  # a rank stuck (in a collective, say): it reports nothing
"""

# The server's process tree (its jobs too) reads a wall clock stepped by the seconds that the
# file named by GANDIVA_FAULTS_CLOCK holds; the machine's own clock is left alone. Python
# imports a ``sitecustomize`` module from its path at start. ``time.time`` is the one wall
# clock gandiva reads (stamps only: its limits and quanta are on the monotonic clock); log
# lines and the database's own clock are not stepped. (libfaketime, which would step every
# reader, breaks Python's ``time.sleep`` with EINVAL when it leaves the monotonic clock
# alone, in Debian's 0.9.10.)
STEPPED_CLOCK = """\
import os, threading, time

_file, _real, _offset = os.environ["GANDIVA_FAULTS_CLOCK"], time.time, [0.0]


def _follow():
    while True:
        try:
            _offset[0] = float(open(_file).read() or 0)
        except (OSError, ValueError):
            pass
        time.sleep(0.1)


def _start():
    threading.Thread(target=_follow, daemon=True).start()


_start()
os.register_at_fork(after_in_child=_start)  # (a warm start's job is a fork of the zygote)
time.time = lambda: _real() + _offset[0]
"""
STEP_S = 86400.0


@dataclass
class Row:
    db: str
    fault: str
    acked: int = 0
    lost: int = 0
    failed: int = 0
    answered_503: int = 0
    no_connection: int = 0
    slowest_answer_s: float = 0.0
    loop_pause_s: float = 0.0
    recovery_s: float | None = None
    detected_s: float | None = None  # a hung rank or a silent agent: from its start to the event
    saw: list[str] = field(default_factory=list)


class Load:
    """A client submitting a short job every SUBMIT_EVERY_S (retrying with the same id), and
    one reading /readyz every second."""

    def __init__(self, url: str, token: str, command: list[str]) -> None:
        import httpx2

        self.http = httpx2.Client(base_url=url, timeout=REQUEST_TIMEOUT_S,
                                  headers={"Authorization": f"Bearer {token}"})
        self.command = command
        self.acked: dict[str, tuple[str, float]] = {}  # submission id -> job id, when
        self.codes: Counter[str] = Counter()
        self.slowest_s = 0.0  # the longest a submission request waited for its answer
        self.ready: list[tuple[float, int, str]] = []  # when, status, problems
        self.explained: list[tuple[float, int]] = []  # when, status of "why is it pending?"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._submit, daemon=True),
                         threading.Thread(target=self._readiness, daemon=True)]
        for t in self._threads:
            t.start()

    def _submit(self) -> None:
        import httpx2

        n = 0
        while not self._stop.is_set():
            n += 1
            sid = f"load-{n}-{uuid.uuid4().hex[:6]}"
            body = {"name": f"load-{n}", "command": self.command, "submission_id": sid}
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    r = self.http.post("/v1/jobs", json=body)
                except httpx2.HTTPError:
                    self.codes["no connection"] += 1
                    time.sleep(1.0)
                    continue
                finally:
                    self.slowest_s = max(self.slowest_s, time.monotonic() - t)
                self.codes[str(r.status_code)] += 1
                if r.status_code in (200, 201):
                    self.acked[sid] = (r.json()["id"], time.monotonic())
                    break
                time.sleep(1.0)  # 503: Retry-After says 5; a demanding client tries sooner
            self._stop.wait(SUBMIT_EVERY_S)

    def _readiness(self) -> None:
        import httpx2

        while not self._stop.wait(1.0):
            try:
                r = self.http.get("/readyz", timeout=5)
                self.ready.append((time.monotonic(), r.status_code,
                                   "; ".join(r.json().get("problems", []))))
            except httpx2.HTTPError:
                self.ready.append((time.monotonic(), 0, "no answer"))
            if self.acked:  # a user asking after their latest job (`gandiva explain`)
                job_id = next(reversed(self.acked.values()))[0]
                try:
                    code = self.http.get(f"/v1/jobs/{job_id}/explain", timeout=5).status_code
                except httpx2.HTTPError:
                    code = 0
                self.explained.append((time.monotonic(), code))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=REQUEST_TIMEOUT_S + 5)


# ---- the faults -------------------------------------------------------------------------
@contextmanager
def db_away(db: str, url: str, cluster: pgcluster.Cluster | None) -> Iterator[str]:
    """PostgreSQL stopped (fast shutdown) and started again; SQLite's write lock held."""
    if db == "sqlite":
        import sqlite3

        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield "write lock held by another process"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    assert cluster is not None
    cluster._run("pg_ctl", "stop", "-D", str(cluster.data), "-m", "fast", "-w")
    try:
        yield "pg_ctl stop"
    finally:
        cluster._start_server()


@contextmanager
def paused(pid: int) -> Iterator[str]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield "SIGSTOP"
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # ended meanwhile (a silent agent is killed)


@contextmanager
def volume_full(volume: Path) -> Iterator[str]:
    ballast = volume / "ballast"
    subprocess.run(["dd", "if=/dev/zero", f"of={ballast}", "bs=1M", "count=128"],
                   capture_output=True)  # stops at the volume's end: ENOSPC
    try:
        yield "tmpfs full"
    finally:
        ballast.unlink()


@dataclass
class Fault:
    name: str
    length_s: float
    dbs: tuple[str, ...] = ("sqlite", "postgresql")
    hollow: bool = False
    hang: bool = False
    tmpfs: bool = False
    ray: bool = False
    clock: bool = False


FAULTS = [
    Fault("db-away-10s", 10), Fault("db-away-120s", 120),
    Fault("db-frozen-60s", 60, dbs=("postgresql",)),
    Fault("server-paused-60s", 60),
    Fault("rank-hung", 0, hang=True),
    Fault("disk-full-20s", 20, tmpfs=True),
    Fault("checkpoints-removed", 0),
    Fault("clock-stepped-20s", 20, clock=True),
    Fault("db-away-10s-1000-nodes", 10, hollow=True),
    Fault("agent-silent", 0, dbs=("sqlite",), ray=True),
    Fault("hostile-jobs", 0),
]


@contextmanager
def ray_cluster() -> Iterator[str]:
    """A head and two worker nodes of one GPU each (CPU slots), on this machine."""
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0"})
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=2, num_gpus=1)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def agent_of(home: Path, job_id: str) -> int:
    """The process of the Ray node agent that runs ``job_id``: its rank's nearest ancestor
    that is a Ray worker (``ray::...``)."""
    (pids,) = home.glob(f"run/node-*/jobs/{job_id}/pids")
    pid = int(pids.read_text().split()[0])
    while pid > 1:
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"):
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise LookupError(f"no Ray worker above job {job_id}'s rank")


def run_row(fault: Fault, db: str, cluster: pgcluster.Cluster | None) -> Row:
    import httpx2

    row = Row(db, fault.name)
    with tempfile.TemporaryDirectory(prefix="gandiva-faults-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        url = (f"sqlite:///{home / 'gandiva.db'}" if db == "sqlite"
               else cluster.create_database())
        volume = home / "run" / "jobs"
        if fault.tmpfs:
            volume.mkdir(parents=True)
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(volume)],
                              capture_output=True).returncode != 0:
                row.saw.append("not run: cannot mount a tmpfs (needs root)")
                return row
            stack.callback(subprocess.run, ["umount", "-l", str(volume)])
        args = ["--checkpoint-every", "2", "--hang-after", "10"]
        if fault.hollow:
            args += ["--backend", "hollow", "--hollow-cluster", "1000x8"]
        if fault.ray:
            args += ["--backend", "ray", "--ray-address", stack.enter_context(ray_cluster())]
        server_env = {}
        if fault.clock:
            (home / "clock").mkdir()
            (home / "clock" / "sitecustomize.py").write_text(STEPPED_CLOCK)
            server_env = {"PYTHONPATH": os.pathsep.join(filter(None, [
                       str(home / "clock"), os.environ.get("PYTHONPATH")])),
                   "GANDIVA_FAULTS_CLOCK": str(home / "clock" / "offset")}
        srv = stack.enter_context(running(home, users=("ops",), db=url, args=tuple(args),
                                          policy="gandiva", env=server_env))
        if VERBOSE:  # the server's log of a row that broke
            stack.push(lambda kind, *_: kind is not None and console.print(
                (home / "server.log").read_text()[-6000:], markup=False) and False)
        token = srv.tokens["ops"]
        http = httpx2.Client(base_url=srv.url, timeout=REQUEST_TIMEOUT_S,
                             headers={"Authorization": f"Bearer {token}"})
        user_dir = srv.user_dir("ops")
        user_dir.mkdir(parents=True, exist_ok=True)
        (user_dir / "long.py").write_text(LONG_JOB)
        longs = []
        if not fault.hollow:
            for i in range(2):
                env = {"STEPS": "600"}
                if fault.hang and i == 0:
                    env["HANG"] = "1"
                if fault.clock:  # (a job gets none of the server's environment: named here)
                    env.update(server_env)
                r = http.post("/v1/jobs", json={"name": f"long-{i}", "command":
                                                ["python", "long.py"], "env": env,
                                                "time_limit": 600 if fault.clock else None})
                r.raise_for_status()
                longs.append(r.json()["id"])
        command = ["gandiva-hollow", "resnet50", "500"] if fault.hollow else ["true"]
        load = Load(srv.url, token, command)
        time.sleep(WARM_S)
        if longs:  # each long job has written a checkpoint before the fault
            until(lambda: all(checkpoints(srv.home, j) for j in longs), 60,
                  "a checkpoint of each long job", every=ASK_EVERY_S)
        started = time.monotonic()
        later: list[str] = []  # what the fault's own branch saw, said after how it was made
        if fault.name.startswith("db-away"):
            with db_away(db, url, cluster) as how:
                time.sleep(fault.length_s)
        elif fault.name.startswith("db-frozen"):
            with cluster.frozen():
                how = "every PostgreSQL process SIGSTOPped"
                time.sleep(fault.length_s)
        elif fault.name.startswith("server-paused"):
            with paused(srv.proc.pid) as how:
                time.sleep(fault.length_s)
        elif fault.name == "rank-hung":
            how = "a rank sleeps at step 100 without reporting"
            until(lambda: any(e["kind"] == "restarted" for e in events(http, longs[0])),
                  120, "the hung job restarted", every=ASK_EVERY_S)
            hung_at = (srv.user_dir("ops") / "hung-once").stat().st_mtime
            row.detected_s = first_at(http, longs[0], "restarted") - hung_at
        elif fault.name.startswith("disk-full"):
            with volume_full(volume) as how:
                time.sleep(fault.length_s)
        elif fault.name == "agent-silent":
            how = "the Ray node agent of a long job SIGSTOPped until its node is lost"
            stopped_at = time.time()
            with paused(agent_of(srv.home, longs[0])):
                until(lambda: any(e["kind"] == "node-lost"
                                  for e in events(http, longs[0])), 180,
                      "the silent node's job restarted", every=ASK_EVERY_S)
            row.detected_s = first_at(http, longs[0], "node-lost") - stopped_at
        elif fault.clock:
            how = f"the wall clock stepped {STEP_S:g} s ahead, {fault.length_s:g} s later back"
            offset = home / "clock" / "offset"
            offset.write_text(str(STEP_S))
            time.sleep(fault.length_s)
            offset.write_text("0")
        elif fault.name == "hostile-jobs":
            how = f"{len(CASES)} jobs at once each send one kind of bad report"
            (user_dir / "hostile.py").write_text(HOSTILE)
            rss = rss_mib(srv.proc.pid)
            hostile = [http.post("/v1/jobs", json={"name": f"hostile-{i}", "command":
                                                   ["python", "hostile.py", what]}
                                 ).raise_for_status().json()["id"]
                       for i, what in enumerate(CASES)]
            until(lambda: all(http.get(f"/v1/jobs/{j}").json()["state"] == "failed"
                              for j in hostile), 180, "every hostile job failed",
                  every=ASK_EVERY_S)
            said = sum(http.get(f"/v1/jobs/{j}").json()["reason"].startswith("bad report")
                       for j in hostile)
            later.append(f"{said} of {len(hostile)} failed with 'bad report: ...'; the "
                         f"server's RSS {rss:.0f} -> {rss_mib(srv.proc.pid):.0f} MiB")
        elif fault.name == "checkpoints-removed":
            how = "rm -rf the job's checkpoint directory"
            subprocess.run(["rm", "-rf", str(srv.home / "run" / "jobs" / longs[0] / "checkpoints")])
        ended = time.monotonic()
        time.sleep(AFTER_S)
        load.stop()
        until(lambda: all_ended(http), DRAIN_S, "every job ended", every=ASK_EVERY_S)
        jobs = {j["id"]: j for j in http.get("/v1/jobs", params={"limit": 1000}).json()}
        row.acked = len(load.acked)
        row.lost = sum(1 for job_id, _ in load.acked.values() if job_id not in jobs)
        row.failed = sum(1 for j in jobs.values() if j["state"] == "failed"
                         and not j["name"].startswith("hostile-"))  # (their own fault)
        row.answered_503 = load.codes["503"]
        row.no_connection = load.codes["no connection"]
        row.slowest_answer_s = load.slowest_s
        row.loop_pause_s = metric(http, "gandiva_loop_longest_pause_seconds")
        first_ack = min((at for _, at in load.acked.values() if at >= ended), default=None)
        first_ready = min((at for at, code, _ in load.ready if at >= ended and code == 200),
                          default=None)
        if first_ack is not None and first_ready is not None:
            row.recovery_s = max(first_ack, first_ready) - ended
        problems = Counter(re.sub(r"\d+", "N", p) for at, code, p in load.ready
                           if started <= at <= ended + 5 and code != 200)
        row.saw += [how, *later]
        if fault.clock:
            ahead = sum(1 for j in jobs.values() if j["submitted_at"] > time.time() + STEP_S / 2)
            row.saw.append(f"{ahead} jobs stamped as submitted a day ahead")
        row.saw.append("HTTP " + ", ".join(f"{k} x{v}" for k, v in sorted(load.codes.items())))
        row.saw += [f"/readyz 503: {p} (x{n})" for p, n in problems.most_common(2)]
        asked = Counter("no answer" if code == 0 else str(code) for at, code in load.explained
                        if started <= at <= ended)
        if asked:
            row.saw.append("explain during the fault: "
                           + ", ".join(f"{k} x{v}" for k, v in sorted(asked.items())))
        for job_id in longs:
            kinds = Counter(e["kind"] for e in events(http, job_id))
            notable = {k: n for k, n in kinds.items()
                       if k in ("restarted", "node-lost", "checkpoint-refused", "failed")}
            row.saw.append(f"{jobs[job_id]['name']}: {jobs[job_id]['state']}"
                           + (f" {notable}" if notable else ""))
            if fault.tmpfs:  # what the full disk cost the job's log (gandiva.job.output)
                lost = re.findall(r"\[gandiva: (\d+) bytes of output lost",
                                  http.get(f"/v1/jobs/{job_id}/logs").text)
                row.saw.append(f"  log: {sum(map(int, lost))} bytes lost, said {len(lost)}x")
            if kinds.get("restarted"):
                why = [e["data"] for e in events(http, job_id) if e["kind"] == "restarted"]
                row.saw.append(f"  restarted: {str(why[0])[:90]}")
    return row


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` (MiB)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024


def checkpoints(home: Path, job_id: str) -> bool:
    """Has ``job_id`` a checkpoint? The local backend keeps them in run/jobs/, Ray's node
    agents in run/node-*/jobs/."""
    return any(home.glob(f"run/jobs/{job_id}/checkpoints/ckpt-*.pt")) or any(
        home.glob(f"run/node-*/jobs/{job_id}/checkpoints/ckpt-*.pt"))


def events(http, job_id: str) -> list[dict]:
    return http.get(f"/v1/jobs/{job_id}/events").json()


def first_at(http, job_id: str, kind: str) -> float:
    """When the job's first event of ``kind`` was stored (the server's wall clock)."""
    return min(e["at"] for e in events(http, job_id) if e["kind"] == kind)


def all_ended(http) -> bool:
    jobs = http.get("/v1/jobs", params={"limit": 1000}).json()
    return all(j["state"] in ("done", "failed", "cancelled") for j in jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgresql")
    parser.add_argument("--only", default="", help="fault names, comma-separated")
    parser.add_argument("--short", action="store_true", help="every fault lasts 10 s")
    parser.add_argument("--verbose", action="store_true", help="a broken row's traceback "
                        "and its server's log")
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    dbs = args.db.split(",")
    only = set(filter(None, args.only.split(",")))
    rows: list[Row] = []
    cluster = None
    if "postgresql" in dbs:
        cluster = pgcluster.Cluster()
        cluster.start()
    try:
        for db in dbs:
            for fault in FAULTS:
                if db not in fault.dbs or (only and fault.name not in only):
                    continue
                if args.short and fault.length_s:
                    fault = Fault(**{**asdict(fault), "length_s": 10})
                console.print(f"[bold]{db} / {fault.name}[/]")
                try:
                    rows.append(run_row(fault, db, cluster))
                except Exception as e:  # noqa: BLE001 - a row that broke is a row to read
                    rows.append(Row(db, fault.name, saw=[f"broke: {type(e).__name__}: {e}"]))
                    if args.verbose:
                        console.print_exception()
                console.print(rows[-1])
    finally:
        if cluster is not None:
            cluster.stop()
    table = Table(title="Faults under load (a server on 2 CPU slots, a submission every "
                        f"{SUBMIT_EVERY_S:g} s)")
    for col in ("db", "fault", "acked", "lost", "failed", "503s", "no conn.",
                "slowest answer s", "loop pause s", "recovery s", "detected s",
                "what the user saw"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.db, r.fault, str(r.acked), str(r.lost), str(r.failed),
                      str(r.answered_503), str(r.no_connection), f"{r.slowest_answer_s:.1f}",
                      f"{r.loop_pause_s:.1f}",
                      "-" if r.recovery_s is None else f"{r.recovery_s:.1f}",
                      "-" if r.detected_s is None else f"{r.detected_s:.1f}",
                      "\n".join(r.saw))
    console.print(table)
    print(json.dumps({"faults": [asdict(r) for r in rows]}))


if __name__ == "__main__":
    main()
