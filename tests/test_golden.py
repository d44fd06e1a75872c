"""Today's decisions, frozen: the --quick cells of benchmarks/policy_matrix.py (six traces,
300 jobs, both loads) under fifo, las, gandiva and the paper's gandiva must give exactly the
outputs kept in benchmarks/golden/quick.json (benchmarks/golden.py has the whole set)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import golden  # noqa: E402


def test_quick_matrix_cells_decide_as_the_golden_file() -> None:
    now = golden.compute(["quick"], workers=2)["quick"]["cases"]
    diffs = golden.differences(golden.load_golden("quick"), now)
    moved = sorted({case for case, *_ in diffs})
    lines = [f"  {case} {field}: {old!r} -> {new!r}" for case, field, old, new in diffs[:40]]
    assert not diffs, (
        f"{len(moved)} of {len(now)} runs decide differently from benchmarks/golden/quick.json "
        f"({len(diffs)} fields; case = trace/load/policy):\n" + "\n".join(lines)
        + ("\n  ..." if len(diffs) > 40 else "")
        + "\nIf no decision was meant to change, this is a regression. If the change is meant "
        "to change decisions, regenerate every golden file deliberately: python "
        "benchmarks/golden.py --write (python benchmarks/golden.py shows all that moved), and "
        "give the reason in the commit.")
