"""The CLI over the REST API: ``gandiva submit/jobs/show/logs/cancel/suspend/resume/priority/
explain/cluster/login``. Each command is one or two API calls and a rich table."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gandiva.client import Client, ClientError, Settings
from gandiva.server.jobspec import SpecError, parse
from gandiva.spec import TERMINAL, JobState

console = Console()
err = Console(stderr=True, soft_wrap=True)  # a path in an error stays whole, to copy

Url = Annotated[str | None, typer.Option("--url", help="Server URL (else GANDIVA_URL, the "
                                         "config file, http://127.0.0.1:8080)")]
Token = Annotated[str | None, typer.Option("--token", help="Your token (else GANDIVA_TOKEN, "
                                           "the config file)")]
JobId = Annotated[str, typer.Argument(help="The job's id (as `gandiva jobs` lists it)")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts), not a table")]
Labels = Annotated[list[str] | None, typer.Option(
    "--label", "-l", help="key=value: only jobs with this label (repeat for several)")]
STATE_STYLE = {JobState.RUNNING: "green", JobState.SUSPENDED: "yellow",
               JobState.HELD: "magenta", JobState.QUEUED: "cyan", JobState.DONE: "dim",
               JobState.FAILED: "red", JobState.CANCELLED: "dim"}


def _client(url: str | None, token: str | None) -> Client:
    return Client(Settings.resolve(url, token))


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(2)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%m-%d %H:%M:%S") if t else ""


def _state(s: str) -> str:
    return f"[{STATE_STYLE.get(s, 'white')}]{s}[/]"


def _jobs_table(jobs: list[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold")
    for col in ("ID", "STATE", "GPUS", "PRIO", "STEPS", "SUBMITTED", "WHY"):
        t.add_column(col, overflow="fold")
    for j in jobs:
        t.add_row(j["id"], _state(j["state"]), str(j["gpus"]), str(j["priority"]),
                  str(j["steps"]), _when(j["submitted_at"]), escape(j["why"]))
    return t


def _show(job: dict[str, Any]) -> None:
    t = Table(box=None, show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for key in ("id", "name", "state", "why", "reason", "gpus", "priority", "steps"):
        value = job[key]
        t.add_row(key, _state(value) if key == "state" else escape(str(value)))
    for key in ("submitted_at", "started_at", "finished_at"):
        t.add_row(key.removesuffix("_at"), _when(job[key]))
    console.print(t)


def _labels(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--label {item!r}: give key=value, e.g. --label sweep=lr")
        out[key] = value
    return out


def read_spec(path: Path, parse: Callable[[str, str], Any], hint: str = "") -> dict[str, Any]:
    """A spec file, checked as the server checks it (``parse``), as JSON to send; a missing
    file or a bad spec ends the command with the field and the fix."""
    if not path.exists():
        raise _fail(f"{path}: no such file{hint}")
    try:
        return parse(path.read_text(), str(path)).model_dump(mode="json")
    except SpecError as e:
        raise _fail(str(e)) from None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def run(call: Callable[[], Any]) -> Any:
    """``call()``, a client's error ending the command with its message."""
    try:
        return call()
    except ClientError as e:
        raise _fail(str(e)) from None


def register(app: typer.Typer, user_app: typer.Typer, team_app: typer.Typer) -> None:
    """Add the client commands to the ``gandiva`` command line, and the user commands that
    go through a running server (so a revoked token stops working at once)."""

    @app.command()
    def login(url: Url = None, token: Token = None) -> None:
        """Save the server URL and your token in the config file (checked first). With no
        token given, it is asked for (or read from standard input): a token typed on the
        command line stays in the shell's history."""
        settings = Settings.resolve(url, token)
        if not settings.token:
            typed = (typer.prompt("Token", hide_input=True) if sys.stdin.isatty()
                     else sys.stdin.readline())
            settings = Settings.resolve(url, typed.strip())
        me = run(lambda: Client(settings).whoami())
        path = settings.save()
        console.print(f"logged in to {settings.url} as [bold]{escape(me['name'])}[/]"
                      f"{' (admin)' if me['admin'] else ''}; saved in {path}")

    @app.command()
    def submit(spec: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON")],
               url: Url = None, token: Token = None,
               follow: Annotated[bool, typer.Option("--follow", "-f",
                                                    help="Then follow its log; exit 1 if the "
                                                         "job fails or is cancelled")] = False,
               as_json: Json = False) -> None:
        """Submit a job; prints its id."""
        body = read_spec(spec, parse)
        client = run(lambda: _client(url, token))
        job = run(lambda: client.submit(body))
        if as_json:
            _print_json(job)
        else:
            console.print(job["id"])
        if follow:
            run(lambda: _follow(client, job["id"], tail=200, rank=0))
            final = run(lambda: client.job(job["id"]))
            if final["state"] != "done":
                err.print(f"{final['id']}: {final['state']}"
                          f"{': ' + final['reason'] if final['reason'] else ''}")
                raise typer.Exit(1)

    @app.command()
    def jobs(url: Url = None, token: Token = None,
             state: Annotated[str | None, typer.Option(help="Only these states, e.g. "
                                                       "queued,running")] = None,
             label: Labels = None,
             limit: Annotated[int | None, typer.Option(help="At most this many, newest "
                                                       "first (default: all)")] = None,
             as_json: Json = False) -> None:
        """List your jobs (an admin: everyone's), newest first."""
        found = run(lambda: _client(url, token).jobs(state, _labels(label), limit))
        if as_json:
            _print_json(found)
        else:
            console.print(_jobs_table(found))

    @app.command()
    def show(job_id: JobId, url: Url = None, token: Token = None, as_json: Json = False
             ) -> None:
        """A job's details and its events."""
        client = run(lambda: _client(url, token))
        job = run(lambda: client.job(job_id))
        if as_json:
            _print_json({**job, "events": run(lambda: client.events(job_id))})
            return
        _show(job)
        t = Table(box=None, header_style="bold", title="events", title_justify="left")
        for col in ("AT", "EVENT", "DETAIL"):
            t.add_column(col)
        for e in run(lambda: client.events(job_id)):
            t.add_row(_when(e["at"]), e["kind"], escape(", ".join(
                f"{k}={v}" for k, v in e["data"].items())))
        console.print(t)

    def _follow(client: Client, job_id: str, tail: int, rank: int) -> None:
        for chunk in client.stream(f"/v1/jobs/{job_id}/logs", tail=tail, rank=rank,
                                   follow="true"):
            console.out(chunk, end="", highlight=False)

    @app.command()
    def logs(job_id: JobId, url: Url = None, token: Token = None,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new "
                                                  "lines until the job ends")] = False,
             tail: Annotated[int, typer.Option(help="Lines from the end")] = 200,
             rank: Annotated[int, typer.Option(help="Which rank's log")] = 0) -> None:
        """A job's output (across its restarts)."""
        client = run(lambda: _client(url, token))
        if follow:
            run(lambda: _follow(client, job_id, tail, rank))
        else:
            console.out(run(lambda: client.logs(job_id, tail, rank)), end="", highlight=False)

    def verb(name: str, doc: str) -> None:
        def command(job_ids: Annotated[list[str] | None, typer.Argument(
                        help="Job ids (as `gandiva jobs` lists them)")] = None,
                    label: Labels = None,
                    all_users: Annotated[bool, typer.Option(
                        "--all-users", help="With --label, an admin's: everyone's jobs, not "
                                            "only their own")] = False,
                    url: Url = None, token: Token = None) -> None:
            client = run(lambda: _client(url, token))
            ids = list(job_ids or [])
            if label:  # every unfinished job of yours with these labels
                me = None if all_users else run(client.whoami)["name"]
                ids += [j["id"] for j in run(lambda: client.jobs(None, _labels(label), user=me))
                        if j["state"] not in TERMINAL]
            if not job_ids and not label:
                raise _fail(f"name the jobs to {name}: ids, or --label key=value")
            failed = 0
            for job_id in dict.fromkeys(ids):
                try:
                    job = client.act(job_id, name)
                    console.print(f"{job['id']}: {_state(job['state'])}")
                except ClientError as e:
                    err.print(f"{escape(job_id)}: {escape(str(e))}")
                    failed += 1
            if failed:  # as every other refusal of the CLI
                raise typer.Exit(2)
        command.__doc__ = doc
        app.command(name)(command)

    verb("cancel", "Cancel jobs (ids, or --label); their processes are stopped.")
    verb("suspend", "Hold jobs: each checkpoints and gives up its devices until resumed.")
    verb("resume", "Give held jobs back to the scheduler; each continues from its checkpoint.")

    @app.command()
    def priority(job_id: JobId, value: Annotated[int, typer.Argument(
            help="-100..50, higher first among your own jobs (51..100: admins only, ahead of "
                 "every team's share)")],
                 url: Url = None, token: Token = None) -> None:
        """Change a job's priority."""
        job = run(lambda: _client(url, token).set_priority(job_id, value))
        console.print(f"{job['id']}: priority {job['priority']}")

    @app.command()
    def explain(job_id: JobId, url: Url = None, token: Token = None) -> None:
        """Why is my job pending (or where is it running)?"""
        why = run(lambda: _client(url, token).explain(job_id))
        console.print(f"{job_id}: {_state(why['state'])}")
        console.print(escape(why["reason"]))
        if why.get("transition"):
            console.print(f"its node is carrying it out: {why['transition']}")
        if why["queue_position"]:
            console.print(f"place in line: {why['queue_position']}")
        if why["needs"]:
            console.print(f"to start it needs: {escape(why['needs'])}")
        if why.get("share"):
            console.print(escape(why["share"]))

    @user_app.command("list")
    def user_list(url: Url = None, token: Token = None, as_json: Json = False) -> None:
        """Every user and whether their token works (admins, through the server)."""
        users = run(lambda: _client(url, token).users())
        if as_json:
            _print_json(users)
            return
        t = Table(box=None, header_style="bold")
        for col in ("NAME", "ADMIN", "RUNS AS", "CREATED", "TOKEN"):
            t.add_column(col)
        for u in users:  # (as root; a server that is not runs every job as itself)
            runs_as = (escape(u["os_user"]) if u.get("os_user") else
                       f"uid {u['uid']}" if u.get("uid") is not None else "")
            t.add_row(escape(u["name"]), "yes" if u["admin"] else "", runs_as,
                      _when(u["created_at"]),
                      f"revoked {_when(u['revoked_at'])}" if u["revoked_at"] else "active")
        console.print(t)

    @user_app.command("set")
    def user_set(name: Annotated[str, typer.Argument(help="User name")],
                 team: Annotated[str | None, typer.Option(
                     help="Move the user to this team ('-': to none)")] = None,
                 tickets: Annotated[int | None, typer.Option(
                     help="The user's weight inside their team")] = None,
                 url: Url = None, token: Token = None) -> None:
        """Move a user to a team or set their tickets in it (admins)."""
        change: dict[str, Any] = {} if team is None else {"team": None if team == "-" else team}
        if tickets is not None:
            change["tickets"] = tickets
        u = run(lambda: _client(url, token).set_user(name, **change))
        console.print(f"{escape(u['name'])}: team {escape(u['team'] or '-')}, "
                      f"{u['tickets']} tickets")

    def _say_team(t: dict[str, Any]) -> None:
        console.print(f"team {escape(t['name'])}: {t['tickets']} tickets, quota "
                      f"{t['quota_gpus'] if t['quota_gpus'] is not None else 'none'}")

    @team_app.command("add")
    def team_add(name: Annotated[str, typer.Argument(help="Team name")],
                 tickets: Annotated[int, typer.Option(
                     help="The team's weight in the cluster's fair shares")] = 1,
                 quota_gpus: Annotated[int | None, typer.Option(
                     help="GPUs the team is guaranteed (default: none)")] = None,
                 url: Url = None, token: Token = None) -> None:
        """Create a team (admins)."""
        t = run(lambda: _client(url, token).add_team(name=name, tickets=tickets,
                                                      quota_gpus=quota_gpus))
        _say_team(t)

    @team_app.command("set")
    def team_set(name: Annotated[str, typer.Argument(help="Team name")],
                 tickets: Annotated[int | None, typer.Option(
                     help="The team's weight in the cluster's fair shares")] = None,
                 quota_gpus: Annotated[int | None, typer.Option(
                     help="GPUs the team is guaranteed (-1: none)")] = None,
                 url: Url = None, token: Token = None) -> None:
        """Change a team's tickets or quota (admins)."""
        change: dict[str, Any] = {} if tickets is None else {"tickets": tickets}
        if quota_gpus is not None:
            change["quota_gpus"] = None if quota_gpus == -1 else quota_gpus
        t = run(lambda: _client(url, token).set_team(name, **change))
        _say_team(t)

    @team_app.command("list")
    def team_list(url: Url = None, token: Token = None, as_json: Json = False) -> None:
        """Every team: tickets, quota and members (admins)."""
        teams = run(lambda: _client(url, token).teams())
        if as_json:
            _print_json(teams)
            return
        t = Table(box=None, header_style="bold")
        for col in ("TEAM", "TICKETS", "QUOTA GPUS", "MEMBERS"):
            t.add_column(col)
        for team in teams:
            t.add_row(escape(team["name"]), str(team["tickets"]),
                      "-" if team["quota_gpus"] is None else str(team["quota_gpus"]),
                      escape(", ".join(team["members"])))
        console.print(t)

    @app.command()
    def usage(since: Annotated[str, typer.Option(help="From: 7d (ago), 12h, or an ISO date")]
              = "7d",
              until: Annotated[str | None, typer.Option(help="To (default: now)")] = None,
              by: Annotated[str, typer.Option(help="user or team")] = "user",
              url: Url = None, token: Token = None, as_json: Json = False) -> None:
        """GPU-hours allocated, used, borrowed and lent, and the fair share against what was
        received, by user or team (yours; an admin: everyone's)."""
        params = {"since": since, "by": by, **({"until": until} if until else {})}
        u = run(lambda: _client(url, token).usage(**params))
        if as_json:
            _print_json(u)
            return
        t = Table(box=None, header_style="bold", title=(
            f"GPU-hours, {datetime.fromtimestamp(u['since']):%Y-%m-%d %H:%M} to "
            f"{datetime.fromtimestamp(u['until']):%Y-%m-%d %H:%M}"))
        cols = ["USER" if by == "user" else "TEAM", *(["TEAM"] if by == "user" else []),
                "ALLOCATED", "USED", "UNMEASURED", *(["BORROWED", "LENT"] if u["quotas"]
                                                      else []), "FAIR", "RECEIVED/FAIR"]
        for col in cols:
            t.add_column(col, justify="left" if col in ("USER", "TEAM") else "right")
        for r in u["rows"]:
            h = [f"{r[k] / 3600:.3f}" for k in ("allocated_gpu_s", "used_gpu_s",
                                                 "unmeasured_gpu_s")]
            lend = [f"{r[k] / 3600:.3f}" for k in ("borrowed_gpu_s", "lent_gpu_s")]
            t.add_row(escape(r["name"]), *([escape(r["team"] or "-")] if by == "user" else []),
                      *h, *(lend if u["quotas"] else []), f"{r['fair_gpu_s'] / 3600:.3f}",
                      "-" if r["received_over_fair"] is None else f"{r['received_over_fair']:.2f}")
        console.print(t)

    @user_app.command("revoke")
    def user_revoke(name: Annotated[str, typer.Argument(help="User name")],
                    url: Url = None, token: Token = None) -> None:
        """Stop a user's token at once (admins); their jobs go on."""
        run(lambda: _client(url, token).user_action(name, "revoke"))
        console.print(f"{escape(name)}: token revoked")

    @user_app.command("rotate")
    def user_rotate(name: Annotated[str, typer.Argument(help="User name")],
                    url: Url = None, token: Token = None) -> None:
        """Give a user a new token (printed once); the old one stops at once (admins)."""
        print(run(lambda: _client(url, token).user_action(name, "rotate"))["token"])

    @app.command()
    def cluster(url: Url = None, token: Token = None,
                watch: Annotated[float, typer.Option(help="Redraw every N seconds (0: "
                                                     "once)")] = 0.0) -> None:
        """Nodes and devices: who runs where, packed or time-sliced, and the queue."""
        client = run(lambda: _client(url, token))
        while True:
            view = run(client.cluster)
            t = Table(box=None, header_style="bold",
                      title=f"{view['policy']}: {view['total'] - view['free']} of "
                            f"{view['total']} devices busy, "
                            f"{view.get('queue_length', len(view['queue']))} queued",
                      title_justify="left")
            for col in ("NODE", "DEVICE", "MODE", "RUNNING", "TIME-SLICED (WAITING TURN)"):
                t.add_column(col, overflow="fold")
            for node in view["nodes"]:
                sliced = ", ".join(j["name"] if j["id"] is None else j["id"]
                                   for j in node["time_sliced"])
                for i, d in enumerate(node["devices"]):
                    t.add_row(node["name"] if i == 0 else "", d["name"], d["mode"],
                              ", ".join(j["name"] if j["id"] is None else j["id"]
                                        for j in d["jobs"]), sliced if i == 0 else "")
            console.print(t)
            if not watch:
                return
            time.sleep(watch)
            console.clear()
