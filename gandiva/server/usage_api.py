"""Accounting in the REST API: ``GET /v1/usage?since=7d&by=team``.

GPU-seconds allocated and used (utilisation-weighted; ``unmeasured`` where no utilisation is
known), borrowed and lent (where teams have quotas), and each one's fair share against what it
received (``gandiva.accounting``), by user or by team, with the teams' fair and received share
per window (the dashboard draws them). A member sees their own row and their own team's; an
admin sees everyone's.
"""

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query
from pydantic import BaseModel, Field

from gandiva.accounting import NO_TEAM, Series, Totals
from gandiva.server.confinement import unprocessable
from gandiva.server.jobspec import duration_s
from gandiva.server.store import Principal, Store
from gandiva.server.usage import usage

WINDOWS_MAX = 2000  # windows in one answer: ``window`` must be at least the period / this
PERIOD_MAX_S = 400 * 86400.0  # how far back one question reaches (it reads every job's events)


class UsageRow(BaseModel):
    name: str = Field(description="The user (by=user) or team (by=team; '-': users in none)")
    team: str | None
    allocated_gpu_s: float = Field(description="Held devices; a device shared by n jobs "
                                   "charges each 1/n")
    used_gpu_s: float = Field(description="Allocated, weighted by reported utilisation")
    unmeasured_gpu_s: float = Field(description="Allocated with no utilisation known")
    borrowed_gpu_s: float = Field(description="Held beyond the team's quota")
    lent_gpu_s: float = Field(description="The team's idle quota others held (by=team)")
    fair_gpu_s: float = Field(description="Owed: water-filled by tickets, capped by demand")
    received_over_fair: float | None


class SharePoint(BaseModel):
    start: float
    # team (by=user: user) -> [fair, received] GPU-seconds in the window
    teams: dict[str, list[float]]


class UsageView(BaseModel):
    since: float
    until: float
    by: Literal["user", "team"]
    quotas: bool = Field(description="Whether any team has a quota (else nothing is "
                         "borrowed or lent)")
    rows: list[UsageRow]
    window_s: float
    series: list[SharePoint]


def moment(text: str, now: float, field: str) -> float:
    """A time: ``7d`` (that long ago), or a date or time in ISO 8601 (UTC unless it says)."""
    try:
        return now - duration_s(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise unprocessable(field, f"{text!r}: give a duration ago (7d, 12h, 90m) or an ISO "
                            "date or time (2026-12-01, 2026-12-01T09:00)", "query") from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _row(name: str, team: str | None, t: Totals) -> UsageRow:
    return UsageRow(name=name, team=team, allocated_gpu_s=round(t.allocated, 3),
                    used_gpu_s=round(t.used, 3), unmeasured_gpu_s=round(t.unmeasured, 3),
                    borrowed_gpu_s=round(t.borrowed, 3), lent_gpu_s=round(t.lent, 3),
                    fair_gpu_s=round(t.fair, 3),
                    received_over_fair=round(t.allocated / t.fair, 4) if t.fair > 0 else None)


def routes(app: FastAPI, store: Store, capacity: Callable[[], int], Who: Any,
           bad_body: dict) -> None:

    @app.get("/v1/usage", responses=bad_body)
    def usage_of(who: Who,
                 since: Annotated[str, Query(description="From: 7d (ago), or an ISO date "
                                                         "or time")] = "7d",
                 until: Annotated[str | None, Query(description="To (default: now)")] = None,
                 by: Literal["user", "team"] = "user",
                 window: Annotated[str, Query(description="The series' window: 1h, 1d, ...")]
                 = "1h") -> UsageView:
        """GPU-seconds allocated, used, borrowed and lent, and the fair share against what
        was received, by user or team (a member: their own and their team's)."""
        now = time.time()
        start = moment(since, now, "since")
        end = min(now, moment(until, now, "until")) if until else now  # (none of the future)
        if not math.isfinite(start) or start < now - PERIOD_MAX_S:
            raise unprocessable("since", f"at most {PERIOD_MAX_S / 86400:.0f} days ago",
                                "query")
        if end <= start:
            raise unprocessable("until", "must come after since, and not after now", "query")
        try:
            step = duration_s(window)
        except ValueError as e:
            raise unprocessable("window", str(e), "query") from None
        if not math.isfinite(step) or step <= 0 or (end - start) / step > WINDOWS_MAX:
            raise unprocessable("window", f"at least the period / {WINDOWS_MAX} "
                                f"({(end - start) / WINDOWS_MAX:.0f} s)", "query")
        u = usage(store, capacity(), start, end, step)
        mine = _team(store, who)
        alone = not who.admin and mine == NO_TEAM  # '-' is every user in no team
        if by == "user":
            rows = [_row(name, u.team_of[name] if u.team_of[name] != NO_TEAM else None, t)
                    for name, t in sorted(u.users.items())
                    if who.admin or name == who.name]
            series = _series(u.user_series, lambda name: who.admin or name == who.name)
        elif alone:  # a member in no team: their own, under '-'
            rows = [_row(NO_TEAM, None, u.users[who.name])] if who.name in u.users else []
            series = [SharePoint(start=s, teams={NO_TEAM: [round(x, 3) for x in per[who.name]]}
                                 if who.name in per else {})
                      for s, per in u.user_series]
        else:
            rows = [_row(team, team if team != NO_TEAM else None, t)
                    for team, t in sorted(u.teams.items()) if who.admin or team == mine]
            series = _series(u.series, lambda team: who.admin or team == mine)
        return UsageView(since=start, until=end, by=by, quotas=u.quotas, rows=rows,
                         window_s=step, series=series)


def _series(series: Series, shown: Callable[[str], bool]) -> list[SharePoint]:
    return [SharePoint(start=s, teams={k: [round(f, 3), round(r, 3)]
                                       for k, (f, r) in per.items() if shown(k)})
            for s, per in series]


def _team(store: Store, who: Principal) -> str:
    """The team a member's usage counts under."""
    team = store.shares().users.get(who.name)
    return team[0] if team is not None else NO_TEAM
