"""What storing one time-slicing round costs: ``Store.record_many`` of N job changes (one
transaction, as the loop's flush writes them) on SQLite and on a throw-away PostgreSQL.

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
        return {"changes": n, "seconds": round(best, 3), "ms_per_change": round(best / n * 1e3, 3)}
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
    table = Table(title=f"Store.record_many of {args.changes} changes, one transaction")
    for col in ("database", "seconds", "ms per change"):
        table.add_column(col, justify="right")
    for kind, r in rows.items():
        table.add_row(kind, f"{r['seconds']:g}", f"{r['ms_per_change']:g}")
    Console().print(table)
    print(json.dumps({"benchmark": "store_batch", **rows}))


if __name__ == "__main__":
    main()
