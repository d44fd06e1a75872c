"""Early stopping at rungs: what a sweep does with a trial that has just reached one.

A rung is a number of mini-batches. A trial reaches it when it reports the sweep's metric at
that step or later; its value there is the mean of the values it reported over the last tenth
of the way to the rung (one mini-batch's loss is noisy). Each rule then says *continue*
(the trial is promoted: the sweep raises its priority, so the scheduler runs it before trials
at lower rungs, as the paper's AutoML ran its top configurations exclusively) or *stop*.

- ``asha``: asynchronous successive halving (Li et al., "A System for Massively Parallel
  Hyperparameter Tuning", MLSys 2020). A trial continues if it is in the top 1/``reduction``
  of every value recorded at its rung so far, itself included, and always if it is the best
  there (so the first trials to arrive are not stopped for lack of company; ASHA's rule).
- ``median``: the median stopping rule (Golovin et al., "Google Vizier", KDD 2017). A trial
  stops if its value is worse than the median of the other trials' values at the rung, once
  ``min_trials`` others have one.
- ``none``: every trial runs to its end (the baseline a search is measured against).

Decision: only a *sure* promotion (judged against enough others) raises a trial's priority. A
trial let through for want of company (the first to reach a rung) goes on at the priority it
had: raised, it would take the devices from the trials not yet judged and keep them until its
next rung, and under strict priority classes a run of lucky early arrivals would screen the
rest of the search out (measured: ``benchmarks/sweep.py``). For the same reason the server
carries out a sure promotion only once every trial has been judged at the first rung, and
judges a trial let through again once the rung has company for it (``gandiva/server/sweeps.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SMOOTH = 0.1  # a rung's value: the mean over this last fraction of the way to it


@dataclass(frozen=True)
class Verdict:
    go_on: bool
    rank: int  # 1: the best recorded at the rung
    of: int  # trials recorded at the rung, this one included
    why: str
    sure: bool  # judged against enough others (asha: at least ``reduction``; median:
    # ``min_trials``), not let through for want of them


def value_at(rung: int, points: Iterable[tuple[int, float]]) -> float | None:
    """The trial's value at ``rung`` from its points (step, value), oldest first, or None if
    it has not reached the rung (no point at or after it)."""
    points = list(points)
    if not points or points[-1][0] < rung:
        return None
    reached = next(s for s, _ in points if s >= rung)
    window = [v for s, v in points if rung * (1 - SMOOTH) <= s <= reached]
    return statistics.fmean(window)


def judge(rule: str, value: float, others: Mapping[int, float], minimize: bool,
          reduction: int = 3, min_trials: int = 3) -> Verdict:
    """Whether a trial with ``value`` at a rung goes on, given the values ``others`` (trial ->
    value) recorded there before it."""
    better = sum(1 for v in others.values() if (v < value if minimize else v > value))
    n = len(others) + 1
    rank = better + 1
    if rule == "asha":
        keep = max(1, n // reduction)
        go_on = better < keep
        sure = n >= reduction
        why = f"{'in' if go_on else 'not in'} the top {keep} of {n}"
    elif rule == "median":
        if len(others) < min_trials:
            return Verdict(True, rank, n, f"fewer than {min_trials} others to compare with",
                           sure=False)
        median = statistics.median(others.values())
        go_on = not (value > median if minimize else value < median)
        why = f"{'not worse' if go_on else 'worse'} than the others' median {median:.4g}"
        sure = True
    elif rule == "none":
        go_on, why, sure = True, "no early stopping", False
    else:
        raise ValueError(f"rule must be asha, median or none, not {rule!r}")
    return Verdict(go_on, rank, n, why, sure)
