"""Who used what, over a period: GPU-seconds allocated and used, borrowed and lent, and the
fair share each user and team was owed against what it received.

Pure arithmetic over intervals (the server reads them from its jobs' events,
``server/usage.py``):
- **Allocated**: a job's GPU-seconds while it held devices; a device held by n jobs at once
  (packed) charges each 1/n. Suspended, queued and held time charges nothing.
- **Used**: allocated weighted by the job's latest reported utilisation (its profile);
  where none is known (no NVML, CPU slots, before its first sample) the GPU-seconds are
  ``unmeasured``, never counted as 0 or as busy.
- **Borrowed and lent** (only where some team has a quota): at each moment, what a team holds
  beyond its quota (none: 0) is borrowed; borrowing draws first on the GPUs no quota
  reserves, then on other teams' idle quota, which is lent in proportion to each one's idle.
- **Fair**: each window's GPU-seconds water-filled by tickets, teams then users, capped by
  demand (a job's GPUs from its submission to its end, held time left out): the simulator's
  measure (``fairness.py``), on the server's record.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from gandiva.shares import Shares, fair_shares

Series = list[tuple[float, dict[str, tuple[float, float]]]]  # per window: who -> (fair, got)
NO_TEAM = "-"  # a user in no team is a team of its own for shares, and under this in reports


@dataclass
class JobUse:
    """What the record says of one job in the period."""

    id: str
    user: str
    gpus: int
    held: list[tuple[float, float, tuple[int, ...]]] = field(default_factory=list)
    demand: list[tuple[float, float]] = field(default_factory=list)  # asked for its GPUs
    samples: list[tuple[float, float | None]] = field(default_factory=list)  # utilisation


@dataclass
class Totals:
    allocated: float = 0.0  # GPU-seconds
    used: float = 0.0
    unmeasured: float = 0.0
    borrowed: float = 0.0
    lent: float = 0.0
    fair: float = 0.0

    def add(self, other: Totals) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class Usage:
    since: float
    until: float
    users: dict[str, Totals]
    teams: dict[str, Totals]
    team_of: dict[str, str]
    series: Series  # per window (its start): team -> (fair, received) GPU-seconds
    user_series: Series  # the same by user
    quotas: bool  # whether borrowed and lent mean anything (some team has a quota)


def shares_of(jobs: list[JobUse]) -> dict[str, list[tuple[float, float, float]]]:
    """Each job's (start, end, GPUs) pieces: its devices, each split between the jobs on it
    at the time."""
    on: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for job in jobs:
        for start, end, devices in job.held:
            for d in devices:
                on[d].append((start, end, job.id))
    pieces: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for intervals in on.values():  # a sweep over each device's starts and ends, in time order
        edges = sorted((t, opens, jid) for s, e, jid in intervals
                       for t, opens in ((s, 1), (e, 0)))
        here: dict[str, int] = defaultdict(int)  # job -> intervals of it open (overlaps count)
        last = None
        for t, opens, jid in edges:  # (at one time, ends come before starts)
            if last is not None and t > last and here:
                for j in here:
                    pieces[j].append((last, t, 1.0 / len(here)))
            if opens:
                here[jid] += 1
            else:
                here[jid] -= 1
                if not here[jid]:
                    del here[jid]
            last = t
    return pieces


def _used(pieces: list[tuple[float, float, float]], samples: list[tuple[float, float | None]]
          ) -> tuple[float, float]:
    """(used, unmeasured) GPU-seconds of a job's pieces: each moment weighted by its latest
    utilisation sample."""
    used = unmeasured = 0.0
    samples = sorted(samples, key=lambda s: s[0])  # (stable: a batch's events share a time)
    for a, b, gpus in pieces:
        t = a
        util = next((u for s, u in reversed(samples) if s <= a), None)
        for s, u in samples:
            if s <= a:
                continue
            if s >= b:
                break
            if util is None:
                unmeasured += gpus * (s - t)
            else:
                used += gpus * (s - t) * util
            t, util = s, u
        if util is None:
            unmeasured += gpus * (b - t)
        else:
            used += gpus * (b - t) * util
    return used, unmeasured


def spread(into: dict[int, float], start: float, end: float, rate: float, origin: float,
           window: float) -> None:
    """Add ``rate`` x the seconds of [start, end) to each window (from ``origin``)."""
    w = int((start - origin) // window)
    while start < end:
        stop = min(end, origin + (w + 1) * window)
        into[w] += rate * (stop - start)
        start, w = stop, w + 1


def account(jobs: list[JobUse], shares: Shares, quotas: Mapping[str, int],
            capacity: int, since: float, until: float, window: float = 3600.0) -> Usage:
    """The period [``since``, ``until``)'s usage of ``jobs`` (their intervals clipped to it)
    on a cluster of ``capacity`` GPUs, ``quotas`` by team."""
    clip = [JobUse(j.id, j.user, j.gpus,
                   [(max(s, since), min(e, until), d) for s, e, d in j.held
                    if e > since and s < until],
                   [(max(s, since), min(e, until)) for s, e in j.demand
                    if e > since and s < until], j.samples) for j in jobs]
    pieces = shares_of(clip)
    team_of = {j.user: shares.users.get(j.user, (NO_TEAM, 1.0))[0] for j in clip}
    users: dict[str, Totals] = defaultdict(Totals)
    for j in clip:
        got = pieces.get(j.id, [])
        t = users[j.user]
        t.allocated += sum((b - a) * g for a, b, g in got)
        used, unmeasured = _used(got, j.samples)
        t.used += used
        t.unmeasured += unmeasured
    with_quota = any(q for q in quotas.values())
    lent = _lending(clip, pieces, team_of, quotas, capacity, users) if with_quota else {}
    series, user_series = _fair(clip, pieces, shares, team_of, capacity, since, until,
                                window, users)
    teams: dict[str, Totals] = defaultdict(Totals)
    for user, t in users.items():
        teams[team_of[user]].add(t)
    for team, gpu_s in lent.items():
        teams[team].lent += gpu_s
    return Usage(since, until, dict(users), dict(teams), team_of, series, user_series,
                 with_quota)


def _lending(jobs: list[JobUse], pieces: dict[str, list[tuple[float, float, float]]],
             team_of: dict[str, str], quotas: Mapping[str, int], capacity: int,
             users: dict[str, Totals]) -> dict[str, float]:
    """Borrowed (onto ``users``, a team's excess shared by what each member holds) and lent
    (returned, by team), moment by moment: a team's holding beyond its quota is borrowed;
    borrowing takes the unreserved GPUs first, then the other teams' idle quota, lent by
    each in proportion to its idle."""
    steps: dict[float, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for j in jobs:
        for a, b, g in pieces.get(j.id, []):
            steps[a][j.user] += g
            steps[b][j.user] -= g
    quota = {t: q or 0 for t, q in quotas.items()}
    members: dict[str, list[str]] = defaultdict(list)
    for user, team in team_of.items():
        members[team].append(user)
    unreserved = max(0, capacity - sum(quota.values()))
    holding: dict[str, float] = defaultdict(float)
    lent: dict[str, float] = defaultdict(float)
    times = sorted(steps)
    for a, b in zip(times, times[1:], strict=False):
        for user, change in steps[a].items():
            holding[user] += change
        dt = b - a
        held = {t: sum(holding[u] for u in us) for t, us in members.items()}
        over = {t: h - quota.get(t, 0) for t, h in held.items() if h - quota.get(t, 0) > 1e-9}
        for t, extra in over.items():
            for u in members[t]:
                if holding[u] > 0:
                    users[u].borrowed += extra * dt * holding[u] / held[t]
        from_quotas = sum(over.values()) - unreserved
        idle = {t: q - held.get(t, 0.0) for t, q in quota.items() if q - held.get(t, 0.0) > 0}
        if from_quotas > 0 and idle:
            scale = min(1.0, from_quotas / sum(idle.values()))
            for t, free in idle.items():
                lent[t] += free * scale * dt
    return dict(lent)


def _fair(jobs: list[JobUse], pieces: dict[str, list[tuple[float, float, float]]],
          shares: Shares, team_of: dict[str, str], capacity: int, since: float, until: float,
          window: float, users: dict[str, Totals]) -> tuple[Series, Series]:
    """Each window's fair share and what was received, by team and by user (the users'
    fair shares are added to ``users``)."""
    demand: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    received: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for j in jobs:
        for a, b in j.demand:
            spread(demand[j.user], a, b, j.gpus, since, window)
        for a, b, g in pieces.get(j.id, []):
            spread(received[j.user], a, b, g, since, window)
    n = max(1, int((until - since + window - 1e-9) // window))
    series: Series = []
    user_series: Series = []
    for w in range(n):
        start = since + w * window
        span = min(window, until - start)
        asked = {u: d[w] for u, d in demand.items() if d.get(w, 0.0) > 0}
        owed = fair_shares(capacity * span, asked, shares)
        by_user: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for u, f in owed.items():
            users[u].fair += f
            by_user[u][0] += f
        for u, per in received.items():
            if per.get(w):
                by_user[u][1] += per[w]
        by_team: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for u, (owed_u, got) in by_user.items():
            by_team[team_of[u]][0] += owed_u
            by_team[team_of[u]][1] += got
        series.append((start, {k: (a, b) for k, (a, b) in by_team.items()}))
        user_series.append((start, {k: (a, b) for k, (a, b) in by_user.items()}))
    return series, user_series
