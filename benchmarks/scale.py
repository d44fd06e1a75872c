"""The control plane at a thousand servers: a real `gandiva server` on hollow nodes.

For each cluster size (``--servers``, 8 GPUs each) and database (``--db``), a real server
starts with ``--backend hollow`` (``gandiva/backends/hollow.py``: no processes; every action
answers after the latency our measurements give it, jobs run at the performance model's
speed) and the gandiva policy with the paper's 60 s quantum. Load generators in a process of
their own submit ``--jobs`` jobs drawn (seeded) from the Philly trace (its widths, durations and
model mix; a job's steps are its duration at its model's throughput on its GPU count) at
``--rate`` per second over keep-alive connections, from four users (the per-user limit of
unfinished jobs is 10,000). Meanwhile and after the flood, a prober reads the API as a
dashboard open on the cluster does, once a second (a job, the newest page of jobs, the
cluster view, explain), and times each answer. Then the run waits for ``--rounds``
time-slicing rounds to settle.

Printed per run:
- submissions per second achieved (offered: ``--rate``) and their p99;
- decision latency p50/p99 (``gandiva_decision_seconds``: deciding only; actions are carried
  out off the loop) and the slowest decision's bucket;
- a time-slicing round's duration: from the Tick's decision until its nodes have carried out
  its last suspend and resume (``gandiva_settle_seconds{event="tick"}``), mean and worst,
  and its share of the quantum (goal: within 10%);
- API p99 while rounds run (goal: < 100 ms), and per endpoint;
- the garbage collector's pauses (every thread stops): seconds in all, full collections;
- the server's memory (resident now, peak) and the database's size.
Quantiles of the server's histograms are interpolated within their Prometheus buckets.

Usage: python benchmarks/scale.py [--servers 100,300,1000] [--db sqlite,postgresql]
       [--jobs 20000] [--rate 500] [--rounds 2] [--quantum 60] [--profile DIR]
Prints a table and one JSON line per run, then one JSON line with every run.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from multiprocessing import get_context
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import memory_mb, pct, postgresql, profiling, settle  # noqa: E402
from serving import running  # noqa: E402  (api_load put tests/ on the path)

USERS = ("vc1", "vc2", "vc3", "vc4")  # Philly's virtual clusters stand behind its users
GPUS_PER_SERVER = 8
GPU_TYPE = "V100"
API_GOAL_MS = 100.0
ROUND_GOAL = 0.10  # of the quantum
REFRESH_S = 1.0  # decision: a dashboard open on the cluster, refreshed every second
console = Console(width=160)


# ---- the workload -------------------------------------------------------------------------
def philly_jobs(count: int, seed: int, widest: int) -> list[dict[str, Any]]:
    """``count`` job bodies drawn from the Philly trace (its widths up to ``widest``, its
    durations and its model mix), as hollow commands: steps = duration x throughput."""
    from gandiva.sim.perf import default_perf_model
    from gandiva.traces import load_trace

    perf = default_perf_model()
    pool = [j for j in load_trace("philly").jobs if j.duration and j.num_gpus <= widest]
    rng = random.Random(seed)
    bodies = []
    for i, job in enumerate(rng.choices(pool, k=count)):
        steps = max(1, int(job.duration * perf.throughput(job.model, GPU_TYPE, job.num_gpus)))
        bodies.append({"name": f"p{i:05d}", "gpus": job.num_gpus, "model": job.model,
                       "command": ["gandiva-hollow", job.model, str(steps)]})
    return bodies


def submit(url: str, tokens: dict[str, str], bodies: list[dict], rate: float,
           clients: int) -> dict[str, Any]:
    """(In the generator's process.) POST every body, paced to ``rate`` per second in all
    over ``clients`` connections; each client is one user's. Returns times and ids."""
    import httpx2

    users = list(tokens)
    shares = [bodies[i::clients] for i in range(clients)]
    latencies: list[float] = []
    acked: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    t0 = time.perf_counter() + 0.5

    def client(i: int) -> None:
        token = tokens[users[i % len(users)]]
        with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                           timeout=120) as http:
            for k, body in enumerate(shares[i]):
                due = t0 + (k * clients + i) / rate  # the body's place in the paced flood
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                t = time.perf_counter()
                try:
                    r = http.post("/v1/jobs", json=body)
                except httpx2.HTTPError as e:
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                ms = (time.perf_counter() - t) * 1000
                with lock:
                    latencies.append(ms)
                    if r.status_code == 201:
                        acked.append(r.json()["id"])
                    else:
                        errors.append(f"HTTP {r.status_code}: {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall_s": time.perf_counter() - t0, "latencies_ms": latencies, "acked": acked,
            "errors": errors}


# ---- reading the server ---------------------------------------------------------------------
def histogram(text: str, name: str, label: tuple[str, str] | None = None
              ) -> tuple[list[tuple[float, float]], float, float]:
    """A histogram from a /metrics scrape, summed over its other labels:
    ([(upper bound, cumulative count)], count, sum)."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if label is not None and s.labels.get(label[0]) != label[1]:
                continue
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_count"):
                count += s.value
            elif s.name.endswith("_sum"):
                total += s.value
    return sorted(buckets.items()), count, total


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Linear interpolation within the bucket that holds the q-th observation."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    want, lower, below = q * buckets[-1][1], 0.0, 0.0
    for upper, cum in buckets:
        if cum >= want:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((want - below) / max(cum - below, 1e-12))
        lower, below = upper, cum
    return lower


def worst(buckets: list[tuple[float, float]]) -> float:
    """The upper bound of the highest non-empty bucket."""
    total = buckets[-1][1] if buckets else 0.0
    return next((le for le, cum in buckets if cum >= total), 0.0)


def diff(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    before = dict(a)
    return [(le, cum - before.get(le, 0.0)) for le, cum in b]


class Prober:
    """Reads the API as an open dashboard does (a page of jobs, a job, its explain, the
    cluster view, every REFRESH_S), timing each answer, until stopped."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.samples: list[tuple[float, str, float]] = []  # (when, endpoint, ms)
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        import httpx2

        rng = random.Random(0)
        with httpx2.Client(base_url=self.url, timeout=60,
                           headers={"Authorization": f"Bearer {self.token}"}) as http:
            while not self._stop.is_set():
                page = self._time(http, "list", "/v1/jobs?limit=50")
                if page is not None and page.status_code == 200 and page.json():
                    self.ids = [j["id"] for j in page.json()]
                if self.ids:
                    one = rng.choice(self.ids)
                    self._time(http, "job", f"/v1/jobs/{one}")
                    self._time(http, "explain", f"/v1/jobs/{one}/explain")
                self._time(http, "cluster", "/v1/cluster")
                self._stop.wait(REFRESH_S)

    def _time(self, http, endpoint: str, path: str):
        import httpx2

        t = time.perf_counter()
        try:
            r = http.get(path)
        except httpx2.HTTPError:
            r = None
        self.samples.append((time.monotonic(), endpoint, (time.perf_counter() - t) * 1000))
        return r


def scrape(url: str) -> str:
    import httpx2

    return httpx2.get(f"{url}/metrics", timeout=60).text


def db_size_mb(kind: str, db: str, home: Path) -> float:
    if kind == "sqlite":
        return sum(p.stat().st_size for p in home.glob("gandiva.db*")) / 2**20
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT pg_database_size(current_database())")).scalar() / 2**20
    finally:
        engine.dispose()


# ---- one run ---------------------------------------------------------------------------------
def run_one(servers: int, kind: str, args: argparse.Namespace, pool: Pool) -> dict[str, Any]:
    bodies = philly_jobs(args.jobs, args.seed, servers * GPUS_PER_SERVER)
    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix=f"gandiva-scale-{servers}-{kind}-"))
        stack.callback(shutil.rmtree, home, ignore_errors=True)
        db = (stack.enter_context(postgresql()) if kind == "postgresql"
              else str(home / "gandiva.db"))
        cluster = f"{servers}x{GPUS_PER_SERVER}:{GPU_TYPE}"
        srv = stack.enter_context(running(
            home, users=USERS, policy=f"gandiva:quantum={args.quantum:g}", db=db,
            args=("--backend", "hollow", "--hollow-cluster", cluster), up_s=300))
        settle(srv.proc.pid)
        pid = srv.proc.pid
        start_metrics = scrape(srv.url)
        profile = args.profile / f"{servers}-{kind}.txt" if args.profile else None
        with profiling(pid, profile), Prober(srv.url, srv.tokens[USERS[0]]) as prober:
            load = pool.apply(submit, (srv.url, srv.tokens, bodies, args.rate, args.clients))
            flood_end = time.monotonic()
            after_flood = scrape(srv.url)
            ticks0 = histogram(after_flood, "gandiva_settle_seconds", ("event", "tick"))[1]
            deadline = flood_end + (args.rounds + 1.5) * args.quantum + 120
            while True:  # rounds after the flood, each until its last action is carried out
                text = scrape(srv.url)
                ticks = histogram(text, "gandiva_settle_seconds", ("event", "tick"))[1]
                if ticks - ticks0 >= args.rounds or time.monotonic() > deadline:
                    break
                time.sleep(2.0)
        end_metrics = text
        mem = memory_mb(pid)
        size = db_size_mb(kind, db, home)
        log = (home / "server.log").read_text(errors="replace")
        crashes = [line for line in log.splitlines() if line.startswith("Exception in thread")]

    dec_b, dec_n, _ = histogram(end_metrics, "gandiva_decision_seconds")
    dec_b = diff(histogram(start_metrics, "gandiva_decision_seconds")[0], dec_b)
    rb_all, _, _ = histogram(end_metrics, "gandiva_settle_seconds", ("event", "tick"))
    rb0, rn0, rs0 = histogram(after_flood, "gandiva_settle_seconds", ("event", "tick"))
    _, rn, rs = histogram(end_metrics, "gandiva_settle_seconds", ("event", "tick"))
    rounds_b = diff(rb0, rb_all)
    rounds = rn - rn0
    during = [(e, ms) for t, e, ms in prober.samples if t >= flood_end]
    flood = [ms for t, _, ms in prober.samples if t < flood_end]
    acts_b, acts_n, acts_s = histogram(end_metrics, "gandiva_action_seconds")
    gc_b, _, gc_s = histogram(end_metrics, "gandiva_gc_pause_seconds")
    _, gc_full, _ = histogram(end_metrics, "gandiva_gc_pause_seconds", ("generation", "2"))
    lat = load["latencies_ms"]
    return {
        "servers": servers, "gpus": servers * GPUS_PER_SERVER, "database": kind,
        "jobs": args.jobs, "acked": len(load["acked"]), "errors": len(load["errors"]),
        "first_errors": load["errors"][:3],
        "offered_per_s": args.rate,
        "submissions_per_s": round(len(load["acked"]) / load["wall_s"], 1),
        "submit_p99_ms": round(pct(lat, 0.99), 1),
        "decisions": int(dec_n),
        "decision_p50_ms": round(quantile(dec_b, 0.50) * 1000, 2),
        "decision_p99_ms": round(quantile(dec_b, 0.99) * 1000, 2),
        "decision_worst_bucket_s": worst(dec_b),
        "actions": int(acts_n), "action_mean_s": round(acts_s / acts_n, 3) if acts_n else None,
        "rounds": int(rounds),
        "round_mean_s": round((rs - rs0) / rounds, 2) if rounds else None,
        "round_worst_bucket_s": worst(rounds_b) if rounds else None,
        "round_share_of_quantum": (round((rs - rs0) / rounds / args.quantum, 3)
                                   if rounds else None),
        "api_p99_ms_during_rounds": round(pct([ms for _, ms in during], 0.99), 1),
        "api_p99_ms_during_flood": round(pct(flood, 0.99), 1),
        "api_p99_ms_by_endpoint": {e: round(pct([ms for x, ms in during if x == e], 0.99), 1)
                                   for e in sorted({e for e, _ in during})},
        "api_requests_during_rounds": len(during),
        "gc_paused_s": round(gc_s, 2), "gc_full_collections": int(gc_full),
        "gc_worst_bucket_s": worst(gc_b),
        "server_rss_mb": mem["VmRSS"], "server_peak_mb": mem["VmHWM"],
        "db_mb": round(size, 1), "server_crashes": crashes[:3],
    }


def show(rows: list[dict[str, Any]], quantum: float) -> None:
    t = Table(title=f"gandiva server on hollow nodes (8 GPUs a server, quantum {quantum:g} s)")
    for col in ("servers", "db", "subm/s", "subm p99", "decision p50/p99", "rounds",
                "round mean (share)", "API p99 rounds", "API p99 flood", "GC paused (full)",
                "RSS/peak MB",
                "DB MB"):
        t.add_column(col, justify="right")
    for r in rows:
        share = r["round_share_of_quantum"]
        t.add_row(str(r["servers"]), r["database"],
                  f"{r['submissions_per_s']:g}/{r['offered_per_s']:g}",
                  f"{r['submit_p99_ms']:g} ms",
                  f"{r['decision_p50_ms']:g}/{r['decision_p99_ms']:g} ms",
                  str(r["rounds"]),
                  f"{r['round_mean_s']} s ({share:.0%})" if share is not None else "-",
                  f"{r['api_p99_ms_during_rounds']:g} ms", f"{r['api_p99_ms_during_flood']:g} ms",
                  f"{r['gc_paused_s']:g} s ({r['gc_full_collections']})",
                  f"{r['server_rss_mb']:g}/{r['server_peak_mb']:g}", f"{r['db_mb']:g}")
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="100,300,1000", help="comma-separated sizes")
    ap.add_argument("--db", default="sqlite,postgresql", help="comma-separated: sqlite, "
                    "postgresql")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=500.0, help="submissions offered per second")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="rounds to wait for after the flood")
    ap.add_argument("--quantum", type=float, default=60.0, help="the paper's: 60 s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the JSON lines here")
    ap.add_argument("--profile", type=Path, help="a directory: py-spy's samples of the "
                    "server's GIL holder, one file per run (needs py-spy)")
    args = ap.parse_args()
    rows = []
    t0 = time.monotonic()
    with get_context("spawn").Pool(1) as pool:
        for servers in (int(s) for s in args.servers.split(",")):
            for kind in args.db.split(","):
                row = run_one(servers, kind, args, pool)
                rows.append(row)
                print(json.dumps(row), flush=True)
    show(rows, args.quantum)
    summary = {"benchmark": "scale", "wall_s": round(time.monotonic() - t0, 1), "runs": rows}
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
