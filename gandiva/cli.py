"""The ``gandiva`` command line."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gandiva import cli_jobs, cli_sweeps

app = typer.Typer(help="gandiva: a scheduler for deep-learning jobs on shared GPU clusters.",
                  no_args_is_help=True, add_completion=False)
console = Console()
err = Console(stderr=True, soft_wrap=True)  # a path in an error stays whole, to copy

PROGRESS_AFTER_S = 2.0  # show a progress bar only for runs that last longer than this


def fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(2)


class _LazyProgress:
    """A rich progress bar that appears only once a run has taken a few seconds."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.t0 = time.monotonic()
        self.bar: Progress | None = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.monotonic() - self.t0 < PROGRESS_AFTER_S or done >= total:
                return
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                TextColumn("{task.completed:,}/{task.total:,} jobs"),
                                TimeElapsedColumn(), console=err, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=lambda x: None)
    os.replace(tmp, path)


def _json_safe(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


@app.command()
def simulate(
    trace: Annotated[str, typer.Argument(help="Trace file, or a bundled trace name (see "
                                         "`gandiva traces`).")],
    policy: Annotated[str, typer.Option(help="Comma-separated policies; parameters after colons, "
                                        "e.g. fifo,las,fifo:backfill")] = "fifo,las",
    cluster: Annotated[str, typer.Option(help="SERVERSxGPUS[:TYPE], joined by '+', e.g. 25x4 or "
                                         "23x4:P100+22x4:P40")] = "25x4",
    gpu_type: Annotated[str, typer.Option(help="GPU type where --cluster names none")] = "V100",
    jobs: Annotated[int | None, typer.Option(help="Take only the first N jobs")] = None,
    window: Annotated[str | None, typer.Option(help="START:END submit window, seconds")] = None,
    arrival_scale: Annotated[float, typer.Option(help="Arrivals this many times denser")] = 1.0,
    mix: Annotated[str, typer.Option(help="Model mix for traces without models")] = "paper",
    seed: Annotated[int, typer.Option(help="Seed for model assignment, noise and policies")] = 0,
    out: Annotated[Path | None, typer.Option(help="Directory for report.html and plots")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write metrics as JSON")] = None,
    teams: Annotated[Path | None, typer.Option(help="Teams file (YAML): teams' tickets and "
                                               "quotas, users' teams; with it, each user's "
                                               "share against fair is reported "
                                               "(examples/teams.yaml)")] = None,
) -> None:
    """Replay TRACE under each policy on a simulated cluster and compare them."""
    from gandiva.fairness import report
    from gandiva.metrics import summarize
    from gandiva.policies import make_policy
    from gandiva.report import COLUMNS, fmt, write_report
    from gandiva.sim.engine import SimConfig
    from gandiva.sim.run import simulate as run_sim
    from gandiva.state import Cluster
    from gandiva.traces import TraceError, load_trace

    win = None
    if window:
        try:
            start, end = (float(x) for x in window.split(":"))
        except ValueError:
            raise fail(f"--window: cannot read {window!r}; write START:END in seconds") from None
        win = (start, end)
    policies = [p.strip() for p in policy.split(",") if p.strip()]
    shares = None
    if teams is not None:
        import yaml

        from gandiva.shares import read_teams
        try:
            shares = read_teams(yaml.safe_load(teams.read_text()), str(teams))
        except (OSError, yaml.YAMLError, ValueError) as e:
            raise fail(str(e)) from None
    try:
        for p in policies:
            make_policy(p, seed)
        Cluster.build(cluster, gpu_type)
        loaded = load_trace(trace, jobs=jobs, window=win, arrival_scale=arrival_scale, mix=mix,
                            seed=seed)
    except TraceError as e:
        raise fail(str(e)) from None
    except (ValueError, FileNotFoundError) as e:
        raise fail(str(e)) from None
    if not loaded.jobs:
        raise fail(f"{trace}: no jobs to simulate (check --jobs/--window)")
    try:
        check_models(loaded)
    except ValueError as e:
        raise fail(f"{trace}: {e}") from None

    results = {}
    summaries = {}
    for p in policies:
        bar = _LazyProgress(f"{p:>10}")
        t0 = time.perf_counter()
        try:
            res = run_sim(loaded, p, cluster=cluster, gpu_type=gpu_type, seed=seed,
                          on_progress=bar, shares=shares,
                          config=SimConfig(timeline=True) if shares else None)
        except ValueError as e:
            raise fail(f"{p}: {e}") from None
        finally:
            bar.close()
        results[p] = res
        summaries[p] = summarize(res) | {"wall_s": time.perf_counter() - t0,
                                         "left_out": len(loaded.jobs) - len(res.jobs)}
        if shares is not None:
            summaries[p]["fairness"] = report(res, shares)

    table = Table(title=f"{loaded.name}: {len(loaded.jobs):,} jobs on {cluster}")
    table.add_column("metric")
    for p in summaries:
        table.add_column(p, justify="right")
    for key, label, kind in COLUMNS:
        table.add_row(label, *(fmt(s[key], kind) for s in summaries.values()))
    table.add_row("wall time", *(f"{s['wall_s']:.2f} s" for s in summaries.values()))
    console.print(table)
    widths = Table(title="where jobs of each width spent their time (mean per finished job)")
    for col in ("policy", "GPUs", "jobs", "JCT", "queue", "sliced out", "running", "stalled",
                "alone"):
        widths.add_column(col, justify="right")
    for p, s in summaries.items():
        for w, d in s["by_width"].items():
            widths.add_row(p, w, f"{d['jobs']:,}", *(fmt(d[k], "duration") for k in (
                "mean_jct_s", "queue_s", "sliced_out_s", "running_s", "stalled_s", "alone_s")))
    console.print(widths)
    if shares is not None:
        fair = Table(title="shares: each team's GPU-hours received against its fair share; "
                           "(user, hour) pairs within 10% of theirs")
        for col in ("policy", "within 10%", "Jain", "worst pair", "teams received/fair"):
            fair.add_column(col, justify="left" if col == "teams received/fair" else "right")
        for p, s in summaries.items():
            f = s["fairness"]
            worst = f["worst"]
            fair.add_row(p, f"{f['within']:.0%}", f"{f['jain']:.3f}",
                         "-" if worst is None else f"{worst['user']}: "
                         f"{worst['received_gpu_h']:.1f} of {worst['fair_gpu_h']:.1f} GPU-h",
                         ", ".join(f"{t} {v['received_gpu_h'] / v['fair_gpu_h']:.2f}"
                                   for t, v in sorted(f["teams"].items())
                                   if v["fair_gpu_h"] > 0))
        console.print(fair)
    for note in sorted({n for r in results.values() for n in r.notes}):
        console.print(f"[dim]note: {note}[/]")

    if out is not None:
        page = write_report(out, results, summaries, loaded.name, cluster)
        console.print(f"report: {page}")
    if json_path is not None:
        _write_json_atomic(json_path, {
            "policies": {p: _json_safe(s) for p, s in summaries.items()},
            "trace": loaded.name,
            "cluster": cluster,
            "gpu_type": gpu_type,
            "seed": seed,
            "trace_jobs": len(loaded.jobs),
            "notes": sorted({n for r in results.values() for n in r.notes}),
        })
        console.print(f"json: {json_path}")


def check_models(trace: Any) -> None:
    """Every job's model must be one the performance model knows: fail before simulating."""
    from gandiva.sim.perf import UnknownModelError, default_perf_model

    perf = default_perf_model()
    for spec in trace.jobs:
        try:
            perf.resolve(spec.model)
        except UnknownModelError as e:
            raise ValueError(f"job {spec.id!r}, field 'model': {e}") from None


@app.command()
def demo(
    jobs: Annotated[int | None, typer.Option(help="Jobs to run (default: 3 per device)")]
    = None,
    slots: Annotated[int | None, typer.Option(help="Devices to use (default: every GPU, or "
                                              "one CPU slot per core)")] = None,
    steps: Annotated[int, typer.Option(help="Mini-batches of the longest job (the others "
                                       "run 5-60% of it)")] = 8000,
    arrival_gap: Annotated[float, typer.Option(help="Seconds between one job's submission "
                                               "and the next's")] = 2.0,
    quantum: Annotated[float, typer.Option(help="gandiva's time slice, seconds")] = 5.0,
    policy: Annotated[str, typer.Option(help="Comma-separated policies to compare")]
    = "fifo,gandiva",
    out: Annotated[Path, typer.Option(help="Directory for job logs, checkpoints and plots")]
    = Path("demo-out"),
    json_path: Annotated[Path | None, typer.Option("--json", help="Write results as JSON")]
    = None,
) -> None:
    """Run a queue of real PyTorch jobs of mixed lengths on this machine, once per policy."""
    from gandiva.demo import (
        METRICS,
        DemoConfig,
        examples_dir,
        policy_spec,
        reading,
        run_demo,
        shown,
    )
    from gandiva.policies import make_policy
    from gandiva.report import plot_timeline

    if (jobs is not None and jobs < 1) or (slots is not None and slots < 1) or steps < 1:
        raise fail("--jobs, --slots and --steps must be at least 1")
    if quantum <= 0:
        raise fail("--quantum must be positive (seconds)")
    if arrival_gap < 0:
        raise fail("--arrival-gap must be 0 or more (seconds)")
    cfg = DemoConfig(jobs=jobs, slots=slots, steps=steps, arrival_gap=arrival_gap,
                     quantum=quantum,
                     policies=tuple(p.strip() for p in policy.split(",") if p.strip()))
    try:
        examples_dir()
        for p in cfg.policies:
            make_policy(policy_spec(p, cfg))
    except (ValueError, FileNotFoundError) as e:
        raise fail(str(e)) from None

    def started(spec: str, n: int, devices: list[str]) -> None:
        console.print(f"[bold]{spec}[/]: {n} jobs on {len(devices)} devices "
                      f"({', '.join(devices)}), one every {cfg.arrival_gap:g} s ...")

    results = run_demo(cfg, out.resolve(), on_start=started)
    summaries = [s for _, s in results.values()]
    table = Table(title=f"jobs of {cfg.shortest}-{cfg.steps} mini-batches, one every "
                        f"{cfg.arrival_gap:g} s; first feedback = {cfg.feedback_steps} "
                        f"mini-batches done")
    table.add_column("metric")
    for spec in results:
        table.add_column(spec, justify="right")
    compared = len(summaries) == 2  # the second policy read against the first
    if compared:
        table.add_column(f"{list(results)[1]} against {list(results)[0]}, and why")
    for m in METRICS:
        table.add_row(m.label, *(shown(m, s) for s in summaries),
                      *([reading(m, *summaries)] if compared else []))
    console.print(table)
    for i, (spec, (res, _)) in enumerate(results.items()):
        png = out / f"timeline_{i}_{spec.split(':')[0]}.png"
        plot_timeline(spec, res, png, device="CPU slot" if res.devices[0].startswith("cpu")
                      else "GPU", unit=1.0)
        console.print(f"timeline: {png}")
    for spec, (res, _) in results.items():
        for j in res.jobs:
            if j.status != "done":
                console.print(f"[red]{spec}: job {j.spec.id} "
                              f"failed:[/] {escape(j.reason)}")
    if json_path is not None:
        _write_json_atomic(json_path, {spec: _json_safe(s) for spec, (_, s) in results.items()})
        console.print(f"json: {json_path}")
    if any(s["failed"] for s in summaries):
        raise typer.Exit(1)


DEFAULT_HOME = Path("gandiva-home")  # the server's work directory: database, jobs, users


LOG_LEVELS = ("debug", "info", "warning", "error")
SWITCH_INTERVAL_S = 0.001  # the server's GIL switch interval (see server())
# the server's garbage-collector thresholds (see server()); Python's default is (700, 10, 10)
GC_THRESHOLDS = (50_000, 20, 20)
# Decision: crash-only. A server whose scheduler loop died would go on taking jobs it never
# runs; it exits instead, with this status (EX_SOFTWARE), and its supervisor starts it again,
# which is the path every crash already takes: the store has every acknowledged job.
LOOP_DIED = 70
GRACE_S = 5  # on SIGTERM, how long open requests and streams get before the drain starts


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: what log collectors (Loki, CloudWatch, ...) parse."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
                 "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def log_config(level: str, as_json: bool) -> dict[str, Any]:
    """logging.dictConfig for the server and uvicorn (its access log included)."""
    formatter = ({"()": JsonLogFormatter} if as_json else
                 {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"})
    handler = {"class": "logging.StreamHandler", "formatter": "main",
               "stream": "ext://sys.stderr"}
    loggers = {name: {"handlers": ["main"], "level": level.upper(), "propagate": False}
               for name in ("gandiva", "uvicorn", "uvicorn.error", "uvicorn.access")}
    return {"version": 1, "disable_existing_loggers": False, "formatters": {"main": formatter},
            "handlers": {"main": handler}, "loggers": loggers}


def _env(name: str) -> dict[str, Any]:
    """Every server flag can come from the environment: GANDIVA_<FLAG> (e.g. GANDIVA_DB,
    which keeps a database password out of ``ps``)."""
    return {"envvar": f"GANDIVA_{name}", "show_envvar": True}


@app.command()
def server(
    home: Annotated[Path, typer.Option(help="Work directory: the database (unless --db), "
                                       "job logs and checkpoints, users' base directories",
                                       **_env("HOME"))] = DEFAULT_HOME,
    db: Annotated[str | None, typer.Option(help="Database URL or SQLite path (default: "
                                           "HOME/gandiva.db)", **_env("DB"))] = None,
    host: Annotated[str, typer.Option(help="Address to bind; loopback unless told "
                                      "otherwise", **_env("HOST"))] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port", **_env("PORT"))] = 8080,
    policy: Annotated[str, typer.Option(help="Scheduling policy", **_env("POLICY"))]
    = "gandiva",
    slots: Annotated[int | None, typer.Option(help="Devices to use (default: all)",
                                              **_env("SLOTS"))] = None,
    checkpoint_every: Annotated[float, typer.Option(help="Seconds between a job's periodic "
                                                    "checkpoints (bounds what a crash loses)",
                                                    **_env("CHECKPOINT_EVERY"))] = 300.0,
    hang_after: Annotated[float, typer.Option(help="Seconds a running job may report nothing "
                                              "(a rank stuck in a collective) before it is "
                                              "restarted from its checkpoint (local backend)",
                                              **_env("HANG_AFTER"))] = 600.0,
    backend: Annotated[str, typer.Option(help="local: this machine's devices; ray: every "
                                         "Ray node with GPUs; hollow: simulated servers "
                                         "with no processes (scale tests)",
                                         **_env("BACKEND"))] = "local",
    hollow_cluster: Annotated[str, typer.Option(help="With --backend hollow: SERVERSxGPUS"
                                                "[:TYPE], e.g. 1000x8:V100; jobs run the "
                                                "command 'gandiva-hollow MODEL STEPS'",
                                                **_env("HOLLOW_CLUSTER"))] = "4x8:V100",
    ray_address: Annotated[str | None, typer.Option(help="The Ray cluster to join (default: "
                                                    "RAY_ADDRESS, else a local one)",
                                                    **_env("RAY_ADDRESS"))] = None,
    drain: Annotated[float, typer.Option(help="On SIGTERM, seconds to wait for every job "
                                         "to checkpoint at its next mini-batch before "
                                         "stopping it (an upgrade loses no work)",
                                         **_env("DRAIN"))] = 60.0,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (413 beyond)",
                                                **_env("MAX_BODY_BYTES"))] = 1024 * 1024,
    max_unfinished_per_user: Annotated[int, typer.Option(
        help="Most jobs a user may have not yet finished (429 beyond)",
        **_env("MAX_UNFINISHED_PER_USER"))] = 10_000,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error",
                                           **_env("LOG_LEVEL"))] = "info",
    log_json: Annotated[bool, typer.Option(help="Log one JSON object per line",
                                           **_env("LOG_JSON"))] = False,
    access_log: Annotated[bool, typer.Option(help="Log every request",
                                             **_env("ACCESS_LOG"))] = True,
    service_user: Annotated[str, typer.Option(
        help="Started as root: the account the server itself runs as (its node daemon stays "
        "root); a machine without it: uid 65519, no account", **_env("SERVICE_USER"))
    ] = "gandiva",
    shared_account: Annotated[bool, typer.Option(
        help="Not root: run every user's jobs as this server's account, each able to reach "
        "every other user's files (needed with more than one non-admin user)",
        **_env("SHARED_ACCOUNT"))] = False,
) -> None:
    """Run the scheduler as a service: the REST API over a persistent store. As root, each
    user's jobs run as that user's account (see the README's Confinement)."""
    import logging.config
    import signal
    import threading

    import uvicorn

    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.server.app import Service, create_app
    from gandiva.server.store import Store

    if log_level.lower() not in LOG_LEVELS:
        raise fail(f"--log-level {log_level!r}: use one of {', '.join(LOG_LEVELS)}")
    config = log_config(log_level, log_json)
    logging.config.dictConfig(config)
    try:
        pol = make_policy(policy)
    except ValueError as e:
        raise fail(str(e)) from None
    os.umask(0o077)  # the database, logs and checkpoints: this account's alone
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    if backend not in ("local", "ray", "hollow"):
        raise fail(f"--backend {backend!r}: use local, ray or hollow")
    root = os.geteuid() == 0
    nodes: Any = None
    if root and backend == "local":  # the agent in a root daemon, the server off root
        nodes = _separate(home, db, service_user, slots, hang_after, checkpoint_every)
    if backend == "hollow":
        from gandiva.backends.hollow import HollowNodes
        try:
            nodes = HollowNodes.parse(hollow_cluster)
        except ValueError as e:
            raise fail(f"--hollow-cluster {hollow_cluster!r}: {e}") from None
    if backend == "ray":
        try:
            from gandiva.backends.ray import RayNodes
        except ImportError:
            raise fail("the ray backend needs Ray: pip install 'gandiva[ray]'") from None
        try:
            nodes = RayNodes(home / "run", address=ray_address,
                             checkpoint_every_s=checkpoint_every, users=home / "users")
        except (RuntimeError, ConnectionError) as e:
            raise fail(f"ray: {e}") from None
        root = nodes.root  # the raylets' account, not the server's, runs the jobs
    store = Store(db or str(home / "gandiva.db"))
    from gandiva.server.tenancy import Tenancy

    try:
        tenancy = Tenancy.for_server(store, backend, shared_account, root, nodes)
    except SystemExit as e:
        if nodes is not None and backend == "ray":
            nodes.close()
        raise fail(str(e)) from None
    loop_backend = Driver(pol, home / "run", slots=slots, hang_s=hang_after,
                          checkpoint_every_s=checkpoint_every, nodes=nodes)
    service = Service(store, loop_backend, home,
                      max_unfinished_per_user=max_unfinished_per_user, tenancy=tenancy)
    tenancy.settle(store, service.user_dir)
    log = logging.getLogger("gandiva.server")
    log.info("tenancy: %s", tenancy.detail)
    again = service.resume_unfinished()
    if again:
        log.info("taking up %d unfinished jobs from their last checkpoints", again)
    def schedule() -> None:
        try:
            loop_backend.run(until_idle=False)
        except BaseException:  # noqa: BLE001 - crash-only: see LOOP_DIED
            log.critical("the scheduler loop died: the server exits (status %d) for its "
                         "supervisor to start it again; every unfinished job resumes then, "
                         "from its last checkpoint", LOOP_DIED, exc_info=True)
            logging.shutdown()
            os._exit(LOOP_DIED)

    loop = threading.Thread(target=schedule, name="gandiva-scheduler", daemon=True)
    loop.start()
    devices = loop_backend.devices
    log.info("gandiva server on http://%s:%d (%s, devices: %s, store: %s)", host, port, policy,
             ", ".join(devices) if len(devices) <= 16 else f"{len(devices)} ({devices[0]} to "
             f"{devices[-1]})", store.engine.url.render_as_string())
    # uvicorn stops serving on SIGTERM or SIGINT, then hands the signal on to the handler it
    # found: this one, so that the process lives on to drain its jobs below
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda signum, frame: log.info("stopping on signal %d", signum))
    # an API thread reading rows releases the GIL at every row and waits to get it back from
    # the scheduler's loop, busy in a round, for up to the switch interval each time. Measured
    # with benchmarks/scale.py at 100 servers, a page of 50 jobs' p99 in rounds: 49 ms at the
    # default 5 ms, 27 ms at 1 ms (one run each); submissions/s did not change beyond their
    # run-to-run spread (api_load.py: 300-460 either way)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Decision: the young generation is collected every 50,000 net allocations, not 700.
    # With the default, the objects a time-slicing round builds outlive a few young
    # collections and reach the oldest generation, which is then collected whenever it grew
    # by a quarter: every 0.6 s during rounds at 1,000 servers, each pause 250-450 ms with
    # every thread stopped. benchmarks/scale.py at 1,000 servers, SQLite, one run each: 43
    # full collections and 7.0 s paused at the default, 7 and 0.6 s at these thresholds; API
    # p99 in rounds 149 against 112 ms. (Measured with gc.callbacks; the server now counts
    # its pauses in gandiva_gc_pause_seconds.) The simulator's speed did not change with it.
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        # open streams (logs -f, the event stream) get GRACE_S to end, then are cut: they
        # must not hold the drain back
        uvicorn.run(create_app(service, max_body_bytes=max_body_bytes), host=host, port=port,
                    log_config=config, log_level=log_level.lower(), access_log=access_log,
                    timeout_graceful_shutdown=GRACE_S)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C aborts the drain
        log.info("stopping: checkpointing every job at its next mini-batch (at most %g s)",
                 drain)
        loop_backend.stop(drain_s=drain)
        loop.join(timeout=drain + 30)
        service.close()  # what the loop reported last, stored before the process ends
        log.info("stopped")


def _separate(home: Path, db: str | None, service_user: str, slots: int | None,
              hang_s: float, checkpoint_every_s: float) -> Any:
    """(A server started as root.) Start this machine's agent in the node daemon, which
    stays root to run each job as its user's account; hand the server's home and database
    to the service account and become it, for good. The API, the scheduler and the store
    never run as root."""
    from gandiva.backends.daemon import DaemonNodes
    from gandiva.backends.driver import detect_devices
    from gandiva.node import accounts
    from gandiva.node.agent import OOM_SCORE_ADJ

    # the machine out of memory, the kernel kills a job before the server or the daemon
    # (the agent raises its jobs' scores); lowered where this root may (CAP_SYS_RESOURCE)
    try:
        Path("/proc/self/oom_score_adj").write_text(str(OOM_SCORE_ADJ))
    except OSError:
        pass
    devices, kind, memory = detect_devices(slots, 1)
    service = accounts.service(service_user)
    database = _sqlite_path(db or str(home / "gandiva.db"))
    if database is not None and database.parent.resolve() != home:
        raise fail(f"--db {db}: started as root, the server runs as its service account "
                   f"(uid {service.uid}), which keeps a SQLite database in its home "
                   f"({home}): put it there, or use PostgreSQL")
    nodes = DaemonNodes(home / "run", home / "users", devices, kind, memory, hang_s=hang_s,
                        checkpoint_every_s=checkpoint_every_s)
    os.chown(home, service.uid, service.gid)
    os.chmod(home, 0o711)  # its users' directories and its jobs' are reached through it
    if database is not None:
        for part in ("", "-wal", "-shm", "-journal"):
            path = database.with_name(database.name + part)
            if path.exists():
                os.chown(path, service.uid, service.gid)
    accounts.drop(service, dumpable=False)
    return nodes


def _sqlite_path(db: str) -> Path | None:
    if db.startswith("sqlite:///"):
        return Path(db.removeprefix("sqlite:///")).resolve()
    return None if "://" in db else Path(db).resolve()


user_app = typer.Typer(help="Manage users and their tokens.", no_args_is_help=True)
app.add_typer(user_app, name="user")
team_app = typer.Typer(help="Manage teams: their members, tickets and quotas (admins).",
                       no_args_is_help=True)
app.add_typer(team_app, name="team")


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="User name")],
    admin: Annotated[bool, typer.Option(help="May see and act on every job")] = False,
    os_user: Annotated[str | None, typer.Option(
        help="The OS account the user's jobs run as on a server run as root (default: a "
        "uid of the user's own, with no account)")] = None,
    team: Annotated[str | None, typer.Option(help="The team the user belongs to (gandiva "
                                             "team add)")] = None,
    tickets: Annotated[int, typer.Option(help="The user's weight inside their team")] = 1,
    home: Annotated[Path, typer.Option(help="The server's work directory")] = DEFAULT_HOME,
    db: Annotated[str | None, typer.Option(help="Database URL or SQLite path")] = None,
) -> None:
    """Add a user and print their token (shown once: only its hash is stored)."""
    from gandiva.node import accounts
    from gandiva.server.store import Store, StoreError

    os.umask(0o077)  # the database it may create holds the tokens' hashes: the server's alone
    if os_user is not None:
        try:
            accounts.named(os_user)
        except KeyError:
            err.print(f"warning: no OS account {os_user!r} on this machine: "
                              f"{name}'s jobs are refused until it exists")
    home.mkdir(parents=True, exist_ok=True)
    store = Store(db or str(home / "gandiva.db"))
    try:
        token = store.add_user(name, admin=admin, os_user=os_user, team=team, tickets=tickets)
    except StoreError as e:
        raise fail(str(e)) from None
    base = home / "users" / name
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:  # a root server runs the user's jobs as this account: theirs
        who = next(p for p in store.principals() if p.name == name)
        try:
            account = (accounts.named(os_user) if os_user else
                       accounts.dynamic(who.uid or 0, str(base)))
        except KeyError:
            account = None
        if account is not None and account.uid > 0:
            accounts.settle(base, account)
    print(token)


@app.command()
def traces() -> None:
    """List the bundled traces."""
    from gandiva.traces import bundled_traces

    table = Table(title="bundled traces")
    table.add_column("name")
    table.add_column("description")
    for name, desc in bundled_traces().items():
        table.add_row(name, desc)
    console.print(table)


@app.command()
def policies() -> None:
    """List the policies and their parameters."""
    from gandiva.policies import available, parameters, summary

    for name in available():
        params = " ".join(f"{k}={v!r}" for k, v in parameters(name).items())
        console.print(f"[bold]{name}[/]  {params}")
        console.print(f"  [dim]{summary(name)}[/]")


cli_jobs.register(app, user_app, team_app)  # submit, jobs, ...: a server's client
cli_sweeps.register(app)  # metrics, sweep

if __name__ == "__main__":
    app()
