"""Who is owed what: teams' tickets, users' teams and tickets, and water-filling by tickets.

Pure data and arithmetic, read by the policy (``policies/gandiva/fair.py``) and by the
metrics (``fairness.py``). The server fills a ``Shares`` from its teams table; the simulator
from a stated map (``benchmarks/fair_share.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

# the highest priority a team's member may give a job (-100 up to it); above it is the admins'
# class, which alone orders jobs across teams before their shares (decision 0037)
CEILING = 50
PRIORITY_MAX = 100  # (and -100 the lowest: what a job spec allows)


def priority_class(priority: int) -> int:
    """1 for the admins' class (above ``CEILING``), 0 for every member's priority."""
    return int(priority > CEILING)


@dataclass(frozen=True)
class Shares:
    """Teams' tickets, and each user's team and tickets inside it. A user with no entry is a
    team of its own with one ticket. ``quotas``: GPUs a team is guaranteed (none: 0)."""

    teams: Mapping[str, float] = field(default_factory=dict)
    users: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    quotas: Mapping[str, int] = field(default_factory=dict)

    def of(self, user: str) -> tuple[str, float, float]:
        """(team, the team's tickets, the user's tickets inside it)."""
        team, tickets = self.users.get(user, (user, 1.0))
        return team, self.teams.get(team, 1.0), tickets


def water_fill(capacity: float, demand: Mapping[str, float],
               tickets: Mapping[str, float]) -> dict[str, float]:
    """``capacity`` split in proportion to ``tickets``, none given more than its ``demand``;
    what a capped one leaves goes to the others, again by tickets."""
    out = dict.fromkeys(demand, 0.0)
    open_ = {k for k, d in demand.items() if d > 0}
    left = capacity
    while open_ and left > 1e-9:
        weight = sum(tickets[k] for k in open_)
        capped = {k for k in open_ if demand[k] - out[k] <= left * tickets[k] / weight}
        if not capped:
            for k in open_:
                out[k] += left * tickets[k] / weight
            break
        for k in capped:
            left -= demand[k] - out[k]
            out[k] = demand[k]
        open_ -= capped
    return out


def fair_shares(capacity: float, demand: Mapping[str, float], shares: Shares
                ) -> dict[str, float]:
    """Each user's fair share of ``capacity`` GPU-seconds: teams by tickets, then users."""
    of = {user: shares.of(user) for user in demand}
    team_demand: dict[str, float] = defaultdict(float)
    team_tickets: dict[str, float] = {}
    members: dict[str, dict[str, float]] = defaultdict(dict)
    for user, d in demand.items():
        team, tickets, _ = of[user]
        team_demand[team] += d
        team_tickets[team] = tickets
        members[team][user] = d
    out: dict[str, float] = {}
    for team, owed in water_fill(capacity, team_demand, team_tickets).items():
        users = members[team]
        out.update(water_fill(owed, users, {u: of[u][2] for u in users}))
    return out


def read_teams(data: object, source: str = "teams file") -> Shares:
    """A ``Shares`` from a teams file's data (``gandiva simulate --teams``)::

        teams:
          vision: {tickets: 3, quota_gpus: 8}
          speech: {}                 # one ticket, no quota
        users:
          ada: vision                # a user's team (one ticket inside it)
          bo: {team: vision, tickets: 2}

    ValueError naming the field and what to write."""
    def fail(field: str, what: str) -> ValueError:
        return ValueError(f"{source}: {field}: {what}")

    def number(value: object, field: str, least: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < least:
            raise fail(field, f"{value!r}: give a number of at least {least:g}")
        return float(value)

    if not isinstance(data, dict) or set(data) - {"teams", "users"}:
        raise fail("(top)", "a mapping with 'teams' and 'users'")
    teams: dict[str, float] = {}
    quotas: dict[str, int] = {}
    for name, spec in (data.get("teams") or {}).items():
        spec = spec or {}
        if not isinstance(spec, dict) or set(spec) - {"tickets", "quota_gpus"}:
            raise fail(f"teams.{name}", "a mapping of tickets and quota_gpus")
        teams[str(name)] = number(spec.get("tickets", 1), f"teams.{name}.tickets", 1)
        if spec.get("quota_gpus") is not None:
            quotas[str(name)] = int(number(spec["quota_gpus"], f"teams.{name}.quota_gpus", 0))
    users: dict[str, tuple[str, float]] = {}
    for name, spec in (data.get("users") or {}).items():
        if isinstance(spec, str):
            spec = {"team": spec}
        if not isinstance(spec, dict) or "team" not in spec or set(spec) - {"team", "tickets"}:
            raise fail(f"users.{name}", "a team's name, or a mapping of team and tickets")
        if spec["team"] not in teams:
            raise fail(f"users.{name}.team", f"no team {spec['team']!r} under teams")
        users[str(name)] = (str(spec["team"]), number(spec.get("tickets", 1),
                                                      f"users.{name}.tickets", 1))
    return Shares(teams, users, quotas)

