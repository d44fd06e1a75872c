"""Golden outputs: today's decisions, frozen, so that a restructuring can show it changes none.

Reruns with the current code, and records per cell the numbers any change of a decision would
move, exactly (floats as their repr, which JSON keeps):
- matrix: every cell of policy_matrix.py (every bundled trace, its first 2,000 jobs, both
  loads) for its policies: fifo, las and gandiva (the default). Not the paper's gandiva: with
  it the group had done 34 of its 88 trace-loads in 12 minutes on 2 cores, stuck on the
  2,000-job gavel-philly cells (it is in the three groups below);
- quick: policy_matrix.py's --quick cells (six traces, 300 jobs, both loads) for fifo, las,
  gandiva and gandiva-paper (paper/common.PAPER): the slice tests/test_golden.py checks;
- fidelity: fidelity.py's workloads (the Gavel physical-cluster traces, the §6.2 Philly
  replay) for fifo, las, gandiva and gandiva-paper;
- paper: the paper experiments (paper/cluster180.py with its load sweep, trace_replay.py with
  its ablations and the last job's story, automl.py with 3 seeds, beyond_las.py) with each
  script's own specs (built on PAPER) and the default gandiva beside them.
Per run: jobs finished and failed, mean/p50/p95/p99 JCT, makespan, mean queueing, mean and
max first feedback, the three utilisations, finish-time fairness, allocated GPU-seconds, the
span, every action count (places, suspends, resumes, packs, unpacks, migrations, grows,
shrinks, kills, failures), the number of events, and a SHA-256 over every job's (id, start,
first feedback, finish, status, restarts): a moved job moves it.

``events`` counts the engine's events, so it moves when the engine skips a different set of
quiet rounds without any decision changing: `--ignore events` leaves it out of a check.

Usage:
  python benchmarks/golden.py --write [--only matrix,quick,fidelity,paper] [--workers 2]
  python benchmarks/golden.py [--only ...] [--workers 2] [--ignore events]
Check mode prints a table of every difference and exits 1 if there is one, 0 if none.
Write mode overwrites benchmarks/golden/<group>.json: do it only after a change that is meant
to change decisions, and say why in the commit.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE / "paper"):  # the benchmark scripts import each other by these paths
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import automl  # noqa: E402
import beyond_las  # noqa: E402
import cluster180  # noqa: E402
import fidelity  # noqa: E402
import policy_matrix  # noqa: E402
import trace_replay  # noqa: E402
from common import PAPER  # noqa: E402

from gandiva.metrics import summarize  # noqa: E402
from gandiva.sim.engine import SimConfig, SimResult, Simulator  # noqa: E402
from gandiva.sim.run import simulate  # noqa: E402
from gandiva.spec import Trace  # noqa: E402
from gandiva.traces import BUNDLED, load_trace  # noqa: E402

GOLDEN = HERE / "golden"
GROUPS = ("quick", "matrix", "fidelity", "paper")
MATRIX_JOBS, QUICK_JOBS = 2000, 300
# the policies the quick and fidelity groups freeze: policy_matrix.py's three and the paper's
POLICIES = {"fifo": "fifo", "las": "las", "gandiva": "gandiva", "gandiva-paper": PAPER}
SUMMARY = ("jobs", "finished", "failed", "mean_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s",
           "makespan_s", "mean_queue_s", "mean_first_feedback_s", "max_first_feedback_s",
           "utilization", "useful_utilization", "sm_utilization", "mean_ftf_rho",
           "max_ftf_rho")


def record(result: SimResult) -> dict[str, Any]:
    """The decision-level outputs of one simulated run (see the module's docstring)."""
    s = summarize(result)
    jobs = hashlib.sha256()
    for r in sorted(result.jobs, key=lambda r: r.spec.id):
        jobs.update(f"{r.spec.id}|{r.start!r}|{r.first_feedback!r}|{r.finish!r}|"
                    f"{r.status.name}|{r.restarts}\n".encode())
    return {**{k: s[k] for k in SUMMARY},
            "allocated_gpu_seconds": result.allocated_gpu_seconds,
            "span": list(result.span),
            "counts": dict(sorted(result.counts.items())),
            "events": result.events,
            "jobs_sha256": jobs.hexdigest()}


# ---- the workloads, built once per process ----

@functools.lru_cache(maxsize=4)
def trace_of(ref: tuple) -> Trace:
    kind, *args = ref
    if kind == "bundled":  # (name, jobs): policy_matrix.py's first jobs of a bundled trace
        return policy_matrix.first_jobs(*args)
    if kind == "file":
        return load_trace(args[0])
    if kind == "replay":  # (jobs,): trace_replay.py's Philly workload
        return trace_replay.workload(args[0], "vc_6214e9")[0]
    if kind == "cluster180":  # (jobs, seed)
        return cluster180.workload(*args)
    if kind == "chronus":  # (jobs,): beyond_las.py's third workload
        return load_trace("chronus-mix1", jobs=args[0])
    raise ValueError(kind)


def config_of(kind: str | None) -> SimConfig | None:
    # None: simulate()'s own default (the timeline only for runs of <= 300 jobs)
    return SimConfig(timeline=True) if kind == "timeline" else None


# ---- tasks: each returns {case key: (record, wall seconds)}; a task is a picklable tuple ----

Task = tuple[str, str, tuple]  # (group, function name, arguments)


def t_sim(ref: tuple, cluster: str, specs: dict[str, str], config: str | None,
          prefix: str, extra: bool = False) -> dict[str, tuple[dict, float]]:
    """One workload on one cluster under each spec (label -> spec), as simulate() runs it."""
    trace = trace_of(ref)
    out = {}
    for label, spec in specs.items():
        t0 = time.perf_counter()
        result = simulate(trace, spec, cluster=cluster, config=config_of(config))
        rec = {"spec": spec, "cluster": cluster, **record(result)}
        if extra and ref[0] == "replay":  # trace_replay.py's story of the last job
            rec["last_job"] = trace_replay.held_back(result, 100)
        out[f"{prefix}/{label}"] = (rec, time.perf_counter() - t0)
    return out


def t_matrix(name: str, jobs: int, load: str,
             policies: tuple[str, ...]) -> dict[str, tuple[dict, float]]:
    """One trace at one load, as policy_matrix.row() sizes its cluster."""
    trace = trace_of(("bundled", name, jobs))
    cluster = policy_matrix.cluster_for(trace, policy_matrix.LOADS[load])
    return t_sim(("bundled", name, jobs), cluster, {p: POLICIES[p] for p in policies}, None,
                 f"{name}/{load}")


class _Kept(Simulator):
    """automl.run() as it is, keeping the result it drops."""

    last: SimResult | None = None

    def run(self, *args: Any, **kwargs: Any) -> SimResult:
        _Kept.last = super().run(*args, **kwargs)
        return _Kept.last


def t_automl(label: str, spec: str, gpus: int, position: float,
             seed: int) -> dict[str, tuple[dict, float]]:
    automl.Simulator = _Kept
    t0 = time.perf_counter()
    reached = automl.run(spec, gpus, position, seed)
    rec = {"spec": spec, "reached_s": reached, **record(_Kept.last)}
    return {f"automl/{gpus}gpus/{position}/seed{seed}/{label}": (rec, time.perf_counter() - t0)}


TASKS: dict[str, Callable[..., dict[str, tuple[dict, float]]]] = {
    "sim": t_sim, "matrix": t_matrix, "automl": t_automl}


def tasks(groups: list[str]) -> Iterator[Task]:
    """Every task of these groups, the longest first (so that two workers end together)."""
    if "paper" in groups:
        replay = ("replay", 8800)
        # trace_replay.py: fifo and the paper's policy with the timeline on, as it runs them
        for label, spec in trace_replay.POLICIES.items():
            yield "paper", "sim", (replay, trace_replay.CLUSTER, {label: spec}, "timeline",
                                   "trace_replay", True)
        for label, spec in trace_replay.ABLATIONS.items():
            yield "paper", "sim", (replay, trace_replay.CLUSTER, {label: spec}, None,
                                   "trace_replay")
        # beyond_las.py (its replay under fifo, las, the default and the paper's policy are
        # in the fidelity group: the same runs)
        chronus = ("chronus", 3000)
        for label, spec in beyond_las.POLICIES.items():
            yield "paper", "sim", (chronus, "16x4", {label: spec}, None,
                                   "beyond_las/chronus-mix1-3000")
            if spec not in ("fifo", "las", "gandiva", PAPER):
                yield "paper", "sim", (replay, trace_replay.CLUSTER, {label: spec}, None,
                                       "beyond_las/philly-replay-8800")
        yield "paper", "sim", (("cluster180", 1000, 0), cluster180.CLUSTER,
                               dict(beyond_las.POLICIES), None, "beyond_las/paper-180")
        # cluster180.py: its policies (gandiva is the paper's without migration), the paper's
        # policy as it is, and the default; at 1,000 jobs and at its sweep's loads
        specs = {**cluster180.POLICIES, "gandiva-paper": PAPER, "gandiva-default": "gandiva"}
        for n in (1000, 250, 400, 550, 700):
            yield "paper", "sim", (("cluster180", n, 0), cluster180.CLUSTER, specs, None,
                                   f"cluster180/{n}jobs")
        # automl.py: FIFO, its gandiva (the paper's, every configuration on a server, no
        # packing), and the same built on the default
        for gpus in automl.SETUPS:
            configs = automl.SETUPS[gpus][0]
            specs = {"fifo": "fifo", "gandiva": f"{PAPER}:placement.max_height={configs}:-packing",
                     "gandiva-default": f"gandiva:placement.max_height={configs}:-packing"}
            for position in automl.POSITIONS:
                for seed in range(3):
                    for label, spec in specs.items():
                        yield "paper", "automl", (label, spec, gpus, position, seed)
    if "fidelity" in groups:
        replay = ("replay", 8800)
        for label, spec in POLICIES.items():
            yield "fidelity", "sim", (replay, trace_replay.CLUSTER, {label: spec}, None,
                                      "philly-replay-8800")
        for path in sorted(fidelity.GAVEL_TRACES.glob("*.trace")):
            yield "fidelity", "sim", (("file", str(path)), fidelity.GAVEL_CLUSTER, POLICIES,
                                      None, f"gavel/{path.stem}")
    for group, names, jobs, policies in (
            ("matrix", sorted(BUNDLED), MATRIX_JOBS, policy_matrix.POLICIES),
            ("quick", policy_matrix.QUICK, QUICK_JOBS, tuple(POLICIES))):
        if group in groups:
            for name in names:
                for load in policy_matrix.LOADS:
                    yield group, "matrix", (name, jobs, load, policies)


def run_task(task: Task) -> tuple[str, dict[str, tuple[dict, float]]]:
    group, fn, args = task
    return group, TASKS[fn](*args)


def compute(groups: list[str], workers: int,
            progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """{group: {"cases": {key: record}, "wall_s": {key: seconds}}}, keys sorted."""
    todo = list(tasks(groups))
    out: dict[str, dict[str, Any]] = {g: {"cases": {}, "wall_s": {}} for g in groups}
    if workers > 1:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap_unordered(run_task, todo, chunksize=1)
    else:
        pool, results = None, map(run_task, todo)
    try:
        for n, (group, cases) in enumerate(results, 1):
            for key, (rec, wall) in cases.items():
                if key in out[group]["cases"]:
                    raise RuntimeError(f"two cases named {group}:{key}")
                out[group]["cases"][key] = rec
                out[group]["wall_s"][key] = wall
            if progress:
                progress(f"[{n}/{len(todo)}] {group}: {', '.join(cases)}")
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    for g in out.values():
        g["cases"] = dict(sorted(g["cases"].items()))
    return out


# ---- comparing ----

def flat(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flat(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list):
        return flat({str(i): v for i, v in enumerate(value)}, path)
    return {path: value}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def differences(golden: dict[str, dict], now: dict[str, dict],
                ignore: frozenset[str] = frozenset()) -> list[tuple[str, str, Any, Any]]:
    """(case, field, golden, now) for every field that differs, a missing or a new case."""
    out = []
    for key in sorted(golden.keys() | now.keys()):
        if key not in now:
            out.append((key, "(case)", "present", "missing"))
            continue
        if key not in golden:
            out.append((key, "(case)", "missing", "present"))
            continue
        g, n = flat(golden[key]), flat(now[key])
        for f in sorted(g.keys() | n.keys()):
            if f.split(".")[0] in ignore:
                continue
            a, b = g.get(f, "(none)"), n.get(f, "(none)")
            if not same(a, b):
                out.append((key, f, a, b))
    return out


def load_golden(group: str) -> dict[str, dict]:
    return json.loads((GOLDEN / f"{group}.json").read_text(encoding="utf-8"))["cases"]


def write_golden(group: str, cases: dict[str, dict]) -> Path:
    GOLDEN.mkdir(exist_ok=True)
    path = GOLDEN / f"{group}.json"
    doc = {"about": f"golden outputs of benchmarks/golden.py, group {group}: regenerate only "
                    "with `python benchmarks/golden.py --write` after a change meant to change "
                    "decisions, and say why in the commit",
           "cases": cases}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write benchmarks/golden/*.json")
    ap.add_argument("--only", default=",".join(GROUPS), help=f"groups: {','.join(GROUPS)}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ignore", default="", help="fields a check leaves out, e.g. events")
    ap.add_argument("--quiet", action="store_true", help="no line per finished task")
    args = ap.parse_args()
    groups = [g for g in GROUPS if g in args.only.split(",")]
    unknown = set(args.only.split(",")) - set(GROUPS)
    if unknown or not groups:
        ap.error(f"--only takes some of {','.join(GROUPS)}; not {','.join(sorted(unknown))}")
    t0 = time.perf_counter()
    now = compute(groups, args.workers,
                  None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    for g in groups:
        w = now[g]["wall_s"]
        slow = max(w, key=w.get)
        print(f"{g}: {len(w)} runs, {sum(w.values()):.0f} s of simulation "
              f"(slowest {slow}: {w[slow]:.1f} s)")
        if g == "paper":  # per experiment
            parts: dict[str, float] = {}
            for key, s in w.items():
                parts[key.split("/")[0]] = parts.get(key.split("/")[0], 0.0) + s
            print("  " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(parts.items())))
    print(f"wall {wall:.0f} s with {args.workers} worker(s)")
    if args.write:
        for g in groups:
            print(f"wrote {write_golden(g, now[g]['cases']).relative_to(HERE.parent)}")
        return
    ignore = frozenset(filter(None, args.ignore.split(",")))
    diffs = []
    for g in groups:
        try:
            golden = load_golden(g)
        except FileNotFoundError:
            diffs.append((g, "(file)", "(group)", "missing", "run --write"))
            continue
        diffs += [(g, *d) for d in differences(golden, now[g]["cases"], ignore)]
    if not diffs:
        print(f"identical: {', '.join(groups)}"
              + (f" (ignoring {', '.join(sorted(ignore))})" if ignore else ""))
        return
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"{len(diffs)} differences from benchmarks/golden/")
    for col in ("group", "case", "field", "golden", "now"):
        table.add_column(col)
    for g, key, f, a, b in diffs:
        table.add_row(g, key, f, repr(a), repr(b))
    Console(width=200).print(table)
    cases = {(d[0], d[1]) for d in diffs}
    print(f"{len(cases)} case(s) differ. If the change is meant to change decisions: "
          f"python benchmarks/golden.py --write, with the reason in the commit")
    sys.exit(1)


if __name__ == "__main__":
    main()
