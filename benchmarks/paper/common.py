"""Shared by the paper experiments: run policies, print paper vs ours, flag big differences."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gandiva.metrics import summarize
from gandiva.sim.engine import SimConfig
from gandiva.sim.run import simulate
from gandiva.spec import Trace

# The paper's policy: round-robin time slices, each server its own order. (Our default orders
# slices by attained-service level across the servers that rotate: issue 17, README.)
PAPER = "gandiva-paper"
DIFF_FLAG = 0.20  # differences from the paper beyond this are flagged and explained

console = Console(width=160, record=True)  # wide tables: notes explain differences in full
RESULTS = Path(__file__).parents[1] / "results"


def run_policies(trace: Trace, policies: dict[str, str], cluster: str,
                 config: SimConfig | None = None,
                 keep: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Summaries per policy label; the full results too, into ``keep``, if given."""
    out = {}
    for label, spec in policies.items():
        t0 = time.perf_counter()
        result = simulate(trace, spec, cluster=cluster, config=config)
        if keep is not None:
            keep[label] = result
        out[label] = summarize(result) | {"wall_s": round(time.perf_counter() - t0, 1),
                                          "counts": result.counts}
    return out


def compare(title: str, rows: list[tuple[str, float | None, float, str]],
            why: dict[str, str]) -> list[dict[str, Any]]:
    """Print (metric, paper, ours, unit) rows; a row off by more than DIFF_FLAG gets its why."""
    table = Table(title=title)
    for col in ("metric", "paper", "ours", "ours/paper", "note"):
        table.add_column(col, justify="right" if col in ("paper", "ours", "ours/paper") else "left")
    record = []
    for metric, paper, ours, unit in rows:
        ratio = ours / paper if paper else None
        off = ratio is not None and abs(ratio - 1) > DIFF_FLAG
        note = why.get(metric, "differs by more than 20%: unexplained") if off else ""
        table.add_row(metric, "-" if paper is None else f"{paper:,.1f} {unit}",
                      f"{ours:,.1f} {unit}", "-" if ratio is None else f"{ratio:.2f}",
                      note)
        record.append({"metric": metric, "paper": paper, "ours": round(ours, 2), "unit": unit,
                       "flagged": off})
    console.print(table)
    return record


def kept_stem(name: str) -> Path:
    """Where a run is kept: benchmarks/results/<name>-<date>, or -2, -3... after it if a run
    of the same day is kept there already (a second run overwrote the first, which a commit
    had quoted)."""
    RESULTS.mkdir(exist_ok=True)
    base = f"{name}-{datetime.date.today().isoformat()}"
    stem, n = RESULTS / base, 2
    while stem.with_suffix(".txt").exists() or stem.with_suffix(".json").exists():
        stem, n = RESULTS / f"{base}-{n}", n + 1
    return stem


def emit(name: str, data: dict[str, Any]) -> None:
    """Print the JSON line, and keep this run: benchmarks/results/<name>-<date>.{txt,json} (the
    tables as printed, and the JSON), so the README's claims point at a file."""
    line = json.dumps({"benchmark": name, **data}, default=str)
    print(line)
    stem = kept_stem(name)
    stem.with_suffix(".txt").write_text(console.export_text(), encoding="utf-8")
    stem.with_suffix(".json").write_text(line + "\n", encoding="utf-8")
