"""Shares: what each user and team was owed in each window of a run, against what it received.

A window's fair share is its GPU-seconds water-filled by tickets, capped by demand: teams
first, by their tickets, each capped by what its users asked for; then each team's share among
its users, by theirs. A job asks for its GPUs from its submission to its end (the simulator
holds no job: none is ever held out of demand). What a job received is the GPU-seconds of its
timeline segments, a packed segment charged half (two jobs shared the GPU), so a job's
suspended time costs its owner nothing.

Reported (``report``): the share of (user, window) pairs within ``tolerance`` of their fair
share (those with a fair share of at least a GPU-minute), the worst pair, each team's and
user's received over fair for the whole run, Jain's index of received over fair across users
(1: all equal), and each user's largest finish-time fairness (Themis' rho, ``metrics``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gandiva.accounting import spread
from gandiva.metrics import ftf_rho
from gandiva.shares import Shares, fair_shares
from gandiva.sim.engine import SimResult

WINDOW_S = 3600.0
TOLERANCE = 0.10
LEAST_FAIR = 60.0  # GPU-seconds: a pair owed less is left out of the within-tolerance count


@dataclass
class Windows:
    """Per window and user: GPU-seconds asked for, owed and received."""

    window: float
    capacity: float  # GPU-seconds of a whole window
    demand: dict[int, dict[str, float]]
    fair: dict[int, dict[str, float]]
    received: dict[int, dict[str, float]]


def windows(result: SimResult, shares: Shares, window: float = WINDOW_S) -> Windows:
    if not result.timeline and result.jobs:
        raise ValueError("the run kept no timeline: simulate with SimConfig(timeline=True)")
    end = result.span[1]
    user_of = {r.spec.id: r.spec.user for r in result.jobs}
    demand: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r in result.jobs:
        spread(demand[r.spec.user], r.spec.submit_time,
               r.finish if r.finish is not None else end, r.spec.num_gpus, 0.0, window)
    received: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for _, job, start, stop, shared in result.timeline:
        spread(received[user_of[job]], start, stop, 0.5 if shared else 1.0, 0.0, window)
    by_window: dict[int, dict[str, float]] = defaultdict(dict)
    for user, per in demand.items():
        for w, d in per.items():
            by_window[w][user] = d
    capacity = result.cluster_gpus * window
    fair = {w: fair_shares(capacity, d, shares) for w, d in by_window.items()}
    got = {w: {u: received[u].get(w, 0.0) for u in d} for w, d in by_window.items()}
    return Windows(window, capacity, dict(by_window), fair, got)


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def report(result: SimResult, shares: Shares, window: float = WINDOW_S,
           tolerance: float = TOLERANCE) -> dict[str, Any]:
    ws = windows(result, shares, window)
    pairs = [(w, u, ws.fair[w][u], ws.received[w][u]) for w in sorted(ws.fair)
             for u in ws.fair[w] if ws.fair[w][u] >= LEAST_FAIR]
    within = [abs(got - owed) <= tolerance * owed for _, _, owed, got in pairs]
    worst = max(pairs, key=lambda p: abs(p[3] - p[2]) / p[2], default=None)
    fair_total: dict[str, float] = defaultdict(float)
    got_total: dict[str, float] = defaultdict(float)
    for w, owed in ws.fair.items():
        for u, f in owed.items():
            fair_total[u] += f
            got_total[u] += ws.received[w][u]
    teams_fair: dict[str, float] = defaultdict(float)
    teams_got: dict[str, float] = defaultdict(float)
    for u in fair_total:
        team = shares.of(u)[0]
        teams_fair[team] += fair_total[u]
        teams_got[team] += got_total[u]
    rho_by_user: dict[str, float] = defaultdict(float)
    done = [r for r in result.jobs if r.finish is not None]
    for r, rho in zip(done, ftf_rho(result), strict=True):
        rho_by_user[r.spec.user] = max(rho_by_user[r.spec.user], rho)
    ratio = {u: got_total[u] / fair_total[u] for u in fair_total if fair_total[u] > 0}
    return {
        "window_s": window,
        "pairs": len(pairs),
        "within": round(sum(within) / len(pairs), 4) if pairs else math.nan,
        "tolerance": tolerance,
        "worst": None if worst is None else {
            "window": worst[0], "user": worst[1], "fair_gpu_h": round(worst[2] / 3600, 3),
            "received_gpu_h": round(worst[3] / 3600, 3)},
        "jain": round(jain(list(ratio.values())), 4),
        "teams": {t: {"fair_gpu_h": round(teams_fair[t] / 3600, 2),
                      "received_gpu_h": round(teams_got[t] / 3600, 2)} for t in teams_fair},
        "users": {u: {"team": shares.of(u)[0], "received_over_fair": round(ratio[u], 3),
                      "max_ftf": round(rho_by_user.get(u, math.nan), 3)} for u in ratio},
        "max_ftf": round(max(rho_by_user.values(), default=math.nan), 3),
    }
