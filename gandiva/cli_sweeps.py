"""The CLI for learning curves and sweeps: ``gandiva metrics JOB``, ``gandiva sweep SPEC``,
``gandiva sweep show ID [--best]``, ``gandiva sweep list``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gandiva.cli_jobs import (
    JobId,
    Json,
    Token,
    Url,
    _client,
    _fail,
    _print_json,
    _state,
    _when,
    console,
    read_spec,
    run,
)
from gandiva.sweep.spec import parse

FOLLOW_EVERY_S = 2.0


def _value(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def _sweep_table(s: dict[str, Any]) -> Table:
    t = Table(title=f"sweep {s['id']}: {s['metric']} ({s['mode']}), {s['rule']} at rungs "
                    f"{s['rungs']}", box=None, header_style="bold")
    for col in ("TRIAL", "JOB", "STATE", "STEP", s["metric"].upper(), "RUNGS", "DECISION",
                "PARAMS"):
        t.add_column(col, overflow="fold")
    sign = 1 if s["mode"] == "min" else -1
    # best first: by the furthest rung reached, then by the latest value
    for tr in sorted(s["trials"], key=lambda tr: (-len(tr["rungs"]), tr["value"] is None,
                                                  sign * (tr["value"] or 0.0), tr["trial"])):
        rungs = " ".join(f"{r}:{_value(v)}" for r, v in tr["rungs"].items())
        t.add_row(str(tr["trial"]), tr["job_id"], _state(tr["state"]), str(tr["step"] or ""),
                  _value(tr["value"]), rungs, tr["decision"],
                  escape(json.dumps(tr["params"])))
    return t


def register(app: typer.Typer) -> None:
    @app.command()
    def metrics(job_id: JobId, url: Url = None, token: Token = None,
                names: Annotated[str | None, typer.Option(
                    help="Comma-separated metrics (default: all it reports)")] = None,
                follow: Annotated[bool, typer.Option("--follow", "-f", help="Print new "
                                                     "points as they come, until it ends")]
                = False,
                as_json: Json = False) -> None:
        """A job's learning curves: every value it reported, by step."""
        client = run(lambda: _client(url, token))
        wanted = [n for n in (names or "").split(",") if n] or None
        after = -1
        while True:
            series = run(lambda after=after: client.metrics(job_id, wanted, after))
            if as_json and not follow:
                _print_json(series)
                return
            for name, points in sorted(series.items()):
                for step, value, _at in points:
                    if as_json:
                        print(json.dumps({"metric": name, "step": step, "value": value}))
                    else:
                        console.print(f"{name:>12} step {step:>8}  {value:.6g}")
            after = max([after, *(p[0] for pts in series.values() for p in pts)])
            if not follow:
                return
            if run(lambda: client.job(job_id))["state"] in ("done", "failed", "cancelled"):
                return
            time.sleep(FOLLOW_EVERY_S)

    @app.command()
    def sweep(what: Annotated[str, typer.Argument(help="A sweep spec (YAML or JSON) to "
                                                       "start; or show, or list")],
              sweep_id: Annotated[str | None, typer.Argument(help="show: the sweep's id")]
              = None,
              best: Annotated[bool, typer.Option("--best", help="show: only the best "
                                                 "finished trial: its parameters and "
                                                 "job")] = False,
              url: Url = None, token: Token = None, as_json: Json = False) -> None:
        """Start a hyper-parameter sweep from a spec (prints its id); `sweep show ID` lists
        its trials, best first; `sweep list` your sweeps."""
        if what == "list":
            client = run(lambda: _client(url, token))
            sweeps = run(client.sweeps)
            if as_json:
                _print_json(sweeps)
                return
            t = Table(box=None, header_style="bold")
            for col in ("ID", "CREATED", "TRIALS", "RUNNING", "STOPPED", "DONE", "BEST"):
                t.add_column(col)
            for s in sweeps:
                states = [tr["state"] for tr in s["trials"]]
                t.add_row(s["id"], _when(s["created_at"]), str(len(states)),
                          str(sum(st not in ("done", "failed", "cancelled") for st in states)),
                          str(sum(tr["decision"] == "stopped" for tr in s["trials"])),
                          str(states.count("done")),
                          _value(s["best"]["value"]) if s["best"] else "")
            console.print(t)
            return
        if what == "show":
            if sweep_id is None:
                raise _fail("give the sweep's id: gandiva sweep show ID")
            client = run(lambda: _client(url, token))
            s = run(lambda: client.sweep(sweep_id))
            if best:
                if s["best"] is None:
                    raise _fail(f"sweep {sweep_id}: no trial has finished yet")
                if as_json:
                    _print_json(s["best"])
                else:
                    b = s["best"]
                    console.print(f"trial {b['trial']} (job {b['job_id']}): {s['metric']} "
                                  f"{_value(b['value'])} at step {b['step']}")
                    console.print(json.dumps(b["params"]))
                    if b.get("checkpoint"):
                        console.print(f"checkpoint: {b['checkpoint']}")
                return
            if as_json:
                _print_json(s)
            else:
                console.print(_sweep_table(s))
            return
        body = read_spec(Path(what), parse, " (give a sweep spec, or show ID, or list)")
        client = run(lambda: _client(url, token))
        s = run(lambda: client.submit_sweep(body))
        if as_json:
            _print_json(s)
        else:
            console.print(s["id"])
