"""Submission throughput of the REST API: jobs/s and per-request latency for a flood of
submissions from concurrent clients, on SQLite and on PostgreSQL, and not one job lost or
stored twice.

For each database a real ``gandiva server`` process starts (SQLite: a file in a fresh home;
PostgreSQL: a throw-away cluster, fsync on, as ``tests/pgcluster.py`` starts one), a user is
added, and a load generator in a process of its own submits ``--jobs`` jobs over
``--clients`` keep-alive connections (one thread and one ``httpx2.Client`` each). Wall time
from the first request to the last answer gives jobs/s; each request's time gives p50, p99
and max. Then the database is read directly: every acknowledged id must be stored exactly
once, under the name it was submitted with, with one "submitted" event; a stored job that
was never acknowledged (its request failed) is counted apart, as "unacked".

Decision: each job runs ``true``, so the scheduler really takes up and starts the flood on
the server's slots while the submissions arrive, as it would in production; the numbers are
for the submission path under that competition, not for an idle scheduler.

The load generator's CPU and the server's are measured over the load phase: on a small
machine the client competes with the server for the same cores, and the table says how
much. The server's CPU milliseconds per job are the figure least moved by whatever else the
machine runs (jobs/s follows the share of a core the server gets; its Python runs on one).

Goal: 500 jobs/s, what Slurm documents for high-throughput setups.

Memory: the server's resident set (VmRSS) before the flood, its peak (VmHWM) after it, and
its peak after ``--big-bodies`` (20) concurrent requests offering ``--big-mb`` (200) MB each
as chunked bodies: the server must answer each 413 after its --max-body-bytes (1 MiB), so the
peak may grow by at most about 20 x 1 MiB plus buffers, not by 20 x 200 MB.

Usage: python benchmarks/api_load.py [--db sqlite,postgresql] [--jobs 10000] [--clients 16]
       [--slots 2] [--policy gandiva] [--profile DIR]
--profile needs py-spy (``pip install py-spy``): collapsed stacks of the server's thread that
holds the GIL during the load, one file per database.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' server and PostgreSQL helpers
from serving import running, stop  # noqa: E402

GOAL_JOBS_PER_S = 500  # Slurm's documented figure for high-throughput configurations
REQUEST_TIMEOUT_S = 120  # a request slower than this counts as an error, not a hang
TICKS = os.sysconf("SC_CLK_TCK")
console = Console(width=160)


# ---- the load generator (runs in its own process) ---------------------------------------
@dataclass
class Load:
    wall_s: float
    cpu_s: float  # the generator's own CPU over the load phase, every thread
    latencies_ms: list[float]
    acked: dict[str, str]  # name -> id, for every 201
    errors: list[str]


def generate(url: str, token: str, names: list[str], clients: int) -> Load:
    """Submit one job per name over ``clients`` keep-alive connections; time each request."""
    import httpx2

    headers = {"Authorization": f"Bearer {token}"}
    shares = [names[i::clients] for i in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    acked: list[dict[str, str]] = [{} for _ in range(clients)]
    errors: list[str] = []
    ready = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        with httpx2.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S) as http:
            try:  # the connection is open before the clock starts
                http.get("/v1/whoami").raise_for_status()
            except httpx2.HTTPError:
                ready.abort()  # the others, and the caller, stop waiting
                raise
            ready.wait()
            for name in shares[i]:
                body = {"name": name, "command": ["true"], "workdir": "."}
                t = time.perf_counter()
                try:
                    r = http.post("/v1/jobs", json=body)
                except httpx2.HTTPError as e:
                    errors.append(f"{name}: {type(e).__name__}: {e}")
                    continue
                latencies[i].append((time.perf_counter() - t) * 1000)
                if r.status_code == 201:
                    acked[i][name] = r.json()["id"]
                else:
                    errors.append(f"{name}: HTTP {r.status_code}: {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return Load(wall, cpu, [x for lat in latencies for x in lat],
                {k: v for a in acked for k, v in a.items()}, errors)


# ---- the server and its database ---------------------------------------------------------
def cpu_s(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, its reaped children's), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = int(fields[11]) + int(fields[12])  # utime, stime
    children = int(fields[13]) + int(fields[14])  # cutime, cstime
    return own / TICKS, children / TICKS


@contextmanager
def postgresql() -> Iterator[str]:
    """A throw-away cluster (tests/pgcluster.py), removed at the end; yields its URL."""
    from pgcluster import Cluster, unavailable

    why = unavailable()
    if why:
        raise RuntimeError(why)
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster.create_database()
    finally:
        cluster.stop()


def settle(pid: int, idle_share: float = 0.05, window_s: float = 0.5,
           limit_s: float = 30.0) -> None:
    """Wait until the server has done starting up (its own CPU goes quiet)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_s(pid)[0]
        time.sleep(window_s)
        if (cpu_s(pid)[0] - before) / window_s < idle_share:
            return


@contextmanager
def profiling(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy sampling the server while the body runs: the thread holding the GIL, so the
    samples show where the server's one core of Python goes (without stopping it to sample,
    which would slow it down several times)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".log").open("w") as log:
        proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--rate",
                                 "100", "--gil", "--nonblocking", "--threads", "--output",
                                 str(out)], stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        stop(proc, signal.SIGINT, timeout=60)


# ---- the check -------------------------------------------------------------------------
@dataclass
class Check:
    stored: int  # jobs of this run in the database
    lost: int  # acknowledged, but not stored under the name it was submitted with
    duplicated: int  # stored more than once (by name), or one id acknowledged twice
    unacked: int  # stored, though its request failed (not a loss: a client retries)
    bad_events: int  # acknowledged jobs without exactly one "submitted" event
    finished: int  # done by the time of the check (the scheduler's progress)


def check(db_url: str, prefix: str, acked: dict[str, str]) -> Check:
    """Read the database directly: every acknowledged job stored exactly once."""
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    from gandiva.server.store import EventRow, JobRow, database_url

    engine = create_engine(database_url(db_url))
    try:
        with Session(engine) as s:
            rows = s.execute(select(JobRow.id, JobRow.name, JobRow.state)
                             .where(JobRow.name.like(f"{prefix}%"))).all()
            submitted = dict(s.execute(
                select(EventRow.job_id, func.count()).where(EventRow.kind == "submitted")
                .group_by(EventRow.job_id)).all())
    finally:
        engine.dispose()
    by_name = Counter(name for _, name, _ in rows)
    ids = {job_id: name for job_id, name, _ in rows}
    lost = sum(1 for name, job_id in acked.items() if ids.get(job_id) != name)
    duplicated = (sum(n - 1 for n in by_name.values())
                  + len(acked) - len(set(acked.values())))
    unacked = sum(1 for name in by_name if name not in acked)
    bad_events = sum(1 for job_id in acked.values() if submitted.get(job_id) != 1)
    finished = sum(1 for _, _, state in rows if state in ("done", "failed", "cancelled"))
    return Check(len(rows), lost, duplicated, unacked, bad_events, finished)


# ---- one database --------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def memory_mb(pid: int) -> dict[str, float]:
    """The process's resident set now and at its peak, MB (from /proc)."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {k: round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}


def big_bodies(url: str, token: str, count: int, mb: int) -> list[int]:
    """``count`` concurrent POSTs each offering ``mb`` MB as a chunked body; their statuses
    (or 0 where the server closed the connection before the client saw an answer)."""
    import httpx2

    def offer() -> Iterator[bytes]:
        chunk = b" " * (1024 * 1024)
        for _ in range(mb):
            yield chunk

    statuses = [0] * count

    def one(i: int) -> None:
        try:
            with httpx2.Client(base_url=url, timeout=120) as http:
                statuses[i] = http.post("/v1/jobs", content=offer(), headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/json"}).status_code
        except httpx2.HTTPError:
            statuses[i] = 0

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def run_one(kind: str, args: argparse.Namespace, pool: Pool) -> dict[str, Any]:
    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix=f"gandiva-load-{kind}-"))
        stack.callback(shutil.rmtree, home, ignore_errors=True)
        db = (stack.enter_context(postgresql()) if kind == "postgresql"
              else str(home / "gandiva.db"))
        srv = stack.enter_context(running(home, users=("load",), policy=args.policy,
                                          slots=args.slots, db=db))
        settle(srv.proc.pid)
        prefix = f"load-{uuid.uuid4().hex[:6]}-"
        names = [f"{prefix}{i:06d}" for i in range(args.jobs)]
        before = memory_mb(srv.proc.pid)
        load0, own0 = os.getloadavg()[0], cpu_s(srv.proc.pid)
        profile = args.profile / f"{kind}.txt" if args.profile else None
        with profiling(srv.proc.pid, profile):
            load = pool.apply(generate, (srv.url, srv.tokens["load"], names, args.clients))
        own1 = cpu_s(srv.proc.pid)
        load1 = os.getloadavg()[0]
        after_flood = memory_mb(srv.proc.pid)
        statuses = big_bodies(srv.url, srv.tokens["load"], args.big_bodies, args.big_mb)
        after_big = memory_mb(srv.proc.pid)
        result = check(db, prefix, load.acked)
        lat = load.latencies_ms
        # a server whose scheduler thread died still answers 201s: such a run is not valid
        log = (home / "server.log").read_text(errors="replace")
        crashes = [line for line in log.splitlines() if line.startswith("Exception in thread")]
        last_error = next((line for line in reversed(log.splitlines())
                           if line and not line.startswith(" ")), "") if crashes else ""
        return {
            "database": kind, "clients": args.clients, "jobs": args.jobs,
            "acked": len(load.acked), "errors": len(load.errors),
            "first_errors": load.errors[:5], "wall_s": round(load.wall_s, 3),
            "jobs_per_s": round(len(load.acked) / load.wall_s, 1),
            "p50_ms": round(pct(lat, 0.50), 2), "p99_ms": round(pct(lat, 0.99), 2),
            "max_ms": round(max(lat, default=float("nan")), 2),
            "mean_ms": round(statistics.fmean(lat), 2) if lat else None,
            "server_cpu_cores": round((own1[0] - own0[0]) / load.wall_s, 2),
            "server_cpu_ms_per_job": round((own1[0] - own0[0]) / max(1, len(load.acked)) * 1000,
                                           2),
            "jobs_cpu_cores": round((own1[1] - own0[1]) / load.wall_s, 2),
            "client_cpu_cores": round(load.cpu_s / load.wall_s, 2),
            "loadavg_1m": [round(load0, 2), round(load1, 2)],
            "rss_before_mb": before["VmRSS"], "peak_after_flood_mb": after_flood["VmHWM"],
            "peak_after_big_bodies_mb": after_big["VmHWM"],
            "big_bodies": {"count": args.big_bodies, "mb_each": args.big_mb,
                           "statuses": dict(Counter(statuses))},
            **asdict(result),
            "server_crashes": crashes, "server_error": last_error,
            **({"profile": str(profile)} if profile else {}),
        }


def interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="sqlite,postgresql",
                    help="comma-separated: sqlite, postgresql")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--slots", type=int, default=2, help="the server's CPU slots")
    ap.add_argument("--policy", default="gandiva", help="the server's policy")
    ap.add_argument("--big-bodies", type=int, default=20,
                    help="concurrent oversized requests after the flood")
    ap.add_argument("--big-mb", type=int, default=200, help="MB each of them offers")
    ap.add_argument("--profile", type=Path, default=None,
                    help="directory for a py-spy record (raw, collapsed stacks of the thread "
                         "holding the GIL) of the server during the load, one file per "
                         "database (needs py-spy)")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.db.split(",") if k.strip()]
    for k in kinds:
        if k not in ("sqlite", "postgresql"):
            ap.error(f"--db: {k!r} is neither sqlite nor postgresql")
    if args.jobs < 1 or args.clients < 1:
        ap.error("--jobs and --clients must be at least 1")
    # SIGTERM unwinds like Ctrl-C, so the server and the cluster are cleaned up either way
    signal.signal(signal.SIGTERM, interrupted)

    rows = []
    try:
        # the load generator in a process of its own, so that its CPU is its own; the pool
        # is terminated on the way out, even mid-load
        with get_context("spawn").Pool(1) as pool:
            for kind in kinds:
                console.print(f"[bold]{kind}[/]: {args.jobs:,} jobs from {args.clients} "
                              f"clients ...")
                rows.append(run_one(kind, args, pool))
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]: the servers and clusters started are stopped")
        sys.exit(130)
    table = Table(title=f"API submissions: {args.jobs:,} jobs, {args.clients} clients, "
                        f"{args.slots} slots, {args.policy}; {os.cpu_count()} cores; "
                        f"goal {GOAL_JOBS_PER_S} jobs/s")
    columns = ("database", "clients", "jobs", "errors", "jobs/s", "p50 ms", "p99 ms", "max ms",
               "lost", "dup", "unacked", "server cores", "server ms/job", "client cores",
               "load avg", "RSS MB", "peak flood", "peak big")
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["database"], str(r["clients"]), f"{r['acked']:,}", str(r["errors"]),
                      f"{r['jobs_per_s']:,.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      f"{r['max_ms']:.0f}", str(r["lost"]), str(r["duplicated"]),
                      str(r["unacked"]), f"{r['server_cpu_cores']:.2f}",
                      f"{r['server_cpu_ms_per_job']:.2f}", f"{r['client_cpu_cores']:.2f}",
                      f"{r['loadavg_1m'][0]:.1f}->{r['loadavg_1m'][1]:.1f}",
                      f"{r['rss_before_mb']:.0f}", f"{r['peak_after_flood_mb']:.0f}",
                      f"{r['peak_after_big_bodies_mb']:.0f}")
    console.print(table)
    for r in rows:
        for e in r["first_errors"]:
            console.print(f"[red]{r['database']}: {e}[/]")
        for crash in r["server_crashes"]:
            console.print(f"[red]{r['database']}: the server's log: {crash.rstrip(':')}: "
                          f"{r['server_error']}[/]")
    print(json.dumps({"benchmark": "api_load", "cores": os.cpu_count(), "slots": args.slots,
                      "policy": args.policy, "goal_jobs_per_s": GOAL_JOBS_PER_S,
                      "results": rows}))
    if any(r["lost"] or r["duplicated"] or r["bad_events"] or r["server_crashes"]
           for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
