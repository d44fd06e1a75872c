"""A page of jobs read from SQLite beside busy threads: what each row's GIL hand-off costs.

Python's sqlite3 releases the GIL around every ``sqlite3_step``, once per row. A reader then
waits for the GIL to come back from a CPU-bound thread (the server's scheduler loop during a
time-slicing round) at every row, up to the switch interval each time (the server's is 1 ms).
This times ``Store.jobs`` (the API's page of jobs, read on SQLite as one row of
``json_group_array``, timestamps through ``printf('%!.17g')``) against the same page read by
the ORM row by row (as ``Store.jobs`` did before, and still does on PostgreSQL), alone and
beside 1 and 2 threads spinning in pure Python, on a store of 20,000 jobs (issue 15: the
page's p99 in rounds at 1,000 servers).

Usage: python benchmarks/store_gil.py [--jobs 20000] [--page 50] [--reads 60]
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from gandiva.server.store import JobRow, Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import pct  # noqa: E402

SWITCH_INTERVAL_S = 0.001  # as the server's (gandiva/cli.py)
INSERT = text("INSERT INTO jobs (id, user_id, name, spec, state, reason, priority, submitted_at,"
              " started_at, finished_at, submission_id) VALUES (:id, :user_id, :name, :spec,"
              " :state, '', 0, :at, NULL, NULL, NULL)")


def spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def timed(read, reads: int, page: int) -> tuple[float, float]:
    ms = []
    for _ in range(reads):
        t = time.perf_counter()
        got = read()
        ms.append((time.perf_counter() - t) * 1000)
        assert len(got) == page
    return statistics.median(ms), pct(ms, 0.95)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--page", type=int, default=50)
    ap.add_argument("--reads", type=int, default=60)
    args = ap.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    home = Path(tempfile.mkdtemp(prefix="gandiva-store-gil-"))
    store = Store(str(home / "gandiva.db"))
    who = store.principal(store.add_user("reader"))
    spec = json.dumps({"gpus": 1, "command": ["true"]})
    with store.engine.begin() as conn:
        conn.execute(INSERT, [{"id": uuid.uuid4().hex[:12], "user_id": who.id, "name": f"j{i}",
                               "spec": spec, "state": "queued", "at": 1.7e9 + i}
                              for i in range(args.jobs)])
    n = args.page + 1  # as the API reads a page: one more, to know if there is a next

    def rows() -> list:
        with Session(store.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(JobRow).where(JobRow.user_id == who.id).order_by(
                JobRow.submitted_at.desc(), JobRow.id.desc()).limit(n)))

    def one_row() -> list:
        return store.jobs(who, (), n)

    out = []
    for busy in (0, 1, 2):
        stop = threading.Event()
        threads = [threading.Thread(target=spin, args=(stop,)) for _ in range(busy)]
        for t in threads:
            t.start()
        try:
            for how, read in (("row by row (the ORM)", rows), ("one row (Store.jobs)",
                                                                 one_row)):
                p50, p95 = timed(read, args.reads, n)
                out.append({"busy_threads": busy, "read": how, "p50_ms": round(p50, 2),
                            "p95_ms": round(p95, 2)})
        finally:
            stop.set()
            for t in threads:
                t.join()
    table = Table(title=f"a page of {args.page} jobs of {args.jobs:,} from SQLite, "
                        f"switch interval {SWITCH_INTERVAL_S * 1000:g} ms")
    for col in ("busy threads", "read", "p50 ms", "p95 ms"):
        table.add_column(col, justify="left" if col == "read" else "right")
    for r in out:
        table.add_row(str(r["busy_threads"]), r["read"], f"{r['p50_ms']:.2f}",
                      f"{r['p95_ms']:.2f}")
    store.engine.dispose()
    shutil.rmtree(home, ignore_errors=True)
    Console(width=120).print(table)
    print(json.dumps({"benchmark": "store_gil", "jobs": args.jobs, "page": args.page,
                      "reads": args.reads, "rows": out}))


if __name__ == "__main__":
    main()
