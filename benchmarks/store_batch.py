"""What storing one time-slicing round costs: ``Store.record_many`` of N job changes (one
transaction, as the loop's flush writes them) on SQLite and on a throw-away PostgreSQL; and
what storing reported metric points costs: ``Store.add_points`` of as many points (a flush's
worth from many jobs: each job sends at most 64 points a metric a second).

Usage: python benchmarks/store_batch.py [--changes 3000] [--db sqlite,postgresql]
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import postgresql  # noqa: E402


def measure(url: str, n: int) -> dict:
    from gandiva.server.jobspec import JobRequest
    from gandiva.server.store import JobChange, Store

    store = Store(url)
    try:
        who = store.principal(store.add_user("bench"))
        ids = [store.add_job(who, JobRequest(name=f"j{i}", command=["true"])).id
               for i in range(n)]
        times = []
        for state in ("suspended", "running"):  # a round: every job one way, then back
            changes = [JobChange(j, state, {"steps": 1}, state) for j in ids]
            t = time.perf_counter()
            store.record_many(changes)
            times.append(time.perf_counter() - t)
        best = min(times)
        point_times = []
        for rep in range(2):
            points = [{"job_id": ids[i % len(ids)], "name": "loss", "step": rep * n + i,
                       "value": 1.0 / (i + 1), "at": time.time()} for i in range(n)]
            t = time.perf_counter()
            store.add_points(points)
            point_times.append(time.perf_counter() - t)
        per_point = min(point_times) / n
        return {"changes": n, "seconds": round(best, 3), "ms_per_change": round(best / n * 1e3, 3),
                "points_seconds": round(min(point_times), 3),
                "us_per_point": round(per_point * 1e6, 1)}
    finally:
        store.engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=3000)
    ap.add_argument("--db", default="sqlite,postgresql")
    args = ap.parse_args()
    rows = {}
    for kind in args.db.split(","):
        with ExitStack() as stack:
            if kind == "postgresql":
                url = stack.enter_context(postgresql())
            else:
                url = str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "g.db")
            rows[kind] = measure(url, args.changes)
    table = Table(title=f"Store.record_many of {args.changes} changes, one transaction; "
                        f"Store.add_points of {args.changes} points")
    for col in ("database", "changes s", "ms per change", "points s", "µs per point"):
        table.add_column(col, justify="right")
    for kind, r in rows.items():
        table.add_row(kind, f"{r['seconds']:g}", f"{r['ms_per_change']:g}",
                      f"{r['points_seconds']:g}", f"{r['us_per_point']:g}")
    Console().print(table)
    print(json.dumps({"benchmark": "store_batch", **rows}))


if __name__ == "__main__":
    main()
