"""The server's sweeps: each trial's reported values in, the sweep's decisions out.

A sweep's trials are ordinary jobs, submitted together. As a trial reports the sweep's
metric, the rule (``gandiva.sweep.rules``) judges it at each rung it reaches: a trial surely
promoted has its priority set to the sweep's plus the rungs it passed (the scheduler then runs
it before the trials at lower rungs, time-slicing only among equals); one let through for want
of company goes on as it was ("continued"); a stopped one is cancelled, with the reason saying
at which rung, with what value and rank. Its devices go to the next trial at once.

Decision: a promotion raises a trial's priority only once every trial of its sweep has been
judged at the first rung (or has ended). Until then the trials not yet tried come first:
their first judgement costs a fraction of a second each, and a raised priority would let the
first trials promoted, on the word of the few judged before them, take the devices from the
rest (measured: the benchmark's best trial then waited behind a slow learner promoted
"#1 of 4" early on). Under time-slicing every trial gets its first turn within a round.

Decisions are stored before they are carried out; after a restart ``load`` takes every sweep
with a trial not yet finished up again and carries out again what a crash may have left
undone (a stop, a priority).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gandiva.spec import TERMINAL
from gandiva.sweep.rules import judge, value_at
from gandiva.sweep.spec import SweepSpec

if TYPE_CHECKING:
    from gandiva.server.app import Service

log = logging.getLogger("gandiva.sweeps")
POINTS_KEPT = 512  # a trial's newest points of the sweep's metric, for its next rung's value


@dataclass
class Trial:
    sweep: Sweep
    number: int
    job_id: str
    rungs: dict[int, float] = field(default_factory=dict)  # rung -> its value there
    decision: str = "running"  # running, promoted, continued, stopped
    ended: bool = False
    raised_to: int | None = None  # the priority its promotion gave it, once carried out
    why: str = ""  # the reason of its latest promotion
    points: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=POINTS_KEPT))


@dataclass
class Sweep:
    id: str
    spec: SweepSpec
    trials: list[Trial] = field(default_factory=list)

    def untried(self) -> bool:
        """Has a trial not yet reached the first rung, and not ended? (A stopped trial has
        ended: ``_stop`` forgets it.)"""
        return any(not t.rungs and not t.ended for t in self.trials)

    def at(self, rung: int, but: Trial) -> dict[int, float]:
        """The values other trials had at ``rung``."""
        return {t.number: t.rungs[rung] for t in self.trials if t is not but and rung in t.rungs}


class Sweeps:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.by_job: dict[str, Trial] = {}
        self._lock = threading.Lock()  # the loop observes; the API adds sweeps

    def add(self, sweep_id: str, spec: SweepSpec, job_ids: list[str]) -> None:
        sweep = Sweep(sweep_id, spec)
        sweep.trials = [Trial(sweep, i, j) for i, j in enumerate(job_ids)]
        with self._lock:
            self.by_job.update({t.job_id: t for t in sweep.trials})

    def load(self) -> int:
        """After a restart: every sweep with a trial not finished, as the store has it;
        decisions not yet carried out are carried out. Returns how many sweeps."""
        store = self.service.store
        sweeps = {row.id: Sweep(row.id, SweepSpec.model_validate(row.spec))
                  for row in store.sweeps(unfinished=True)}
        for t, job in store.trials(list(sweeps)):
            sweep = sweeps[t.sweep_id]
            trial = Trial(sweep, t.trial, t.job_id, {int(r): v for r, v in t.rungs.items()},
                          t.decision)
            sweep.trials.append(trial)
            trial.ended = job.state in TERMINAL
            if trial.ended:
                continue
            if trial.decision == "promoted":
                trial.why = f"sweep {sweep.id} (decided before a restart)"
                if job.priority == self._priority(trial):
                    trial.raised_to = job.priority
            with self._lock:
                self.by_job[trial.job_id] = trial
            if trial.decision == "stopped":
                self._stop(trial, f"sweep {sweep.id} (decided before a restart)")
        for sweep in sweeps.values():
            self._raise(sweep)
        return len(sweeps)

    def observe(self, job_id: str, series: dict[str, list[list[float]]]) -> None:
        """(The loop.) A job reported ``series``; if it is a trial, judge it at every rung
        it has now reached."""
        trial = self.by_job.get(job_id)
        if trial is None or trial.decision == "stopped":
            return
        spec = trial.sweep.spec
        trial.points.extend((int(s), float(v)) for s, v in series.get(spec.metric, ()))
        stop = spec.stop
        judged = False
        for rung in stop.rungs[len(trial.rungs):]:
            value = value_at(rung, trial.points)
            if value is None:
                break
            judged = True
            verdict = judge(stop.rule, value, trial.sweep.at(rung, trial),
                            minimize=spec.mode == "min", reduction=stop.reduction,
                            min_trials=stop.min_trials)
            trial.rungs[rung] = value
            why = (f"sweep {trial.sweep.id}, rung {rung}: {spec.metric} {value:.4g}, "
                   f"#{verdict.rank} of {verdict.of} ({verdict.why})")
            trial.decision = ("stopped" if not verdict.go_on
                              else "promoted" if verdict.sure else "continued")
            self.service.store.set_trial(trial.sweep.id, trial.number,
                                         {str(r): v for r, v in trial.rungs.items()},
                                         trial.decision)
            if not verdict.go_on:
                self._stop(trial, why)
                break
            if verdict.sure:
                trial.why = why
            else:
                self.service.store.record(trial.job_id, "sweep-continued", {"why": why})
        if judged:  # (not at every report: a sweep's trials are scanned)
            self._raise(trial.sweep)

    def forget(self, job_id: str) -> None:
        with self._lock:
            trial = self.by_job.pop(job_id, None)
        if trial is not None:
            trial.ended = True
            self._raise(trial.sweep)

    def _priority(self, trial: Trial) -> int:
        return trial.sweep.spec.priority + len(trial.rungs)

    def _raise(self, sweep: Sweep) -> None:
        """Carry out the sweep's promotions, once no trial waits for its first judgement."""
        if sweep.untried():
            return
        for trial in sweep.trials:
            priority = self._priority(trial)
            if trial.decision == "promoted" and not trial.ended and trial.raised_to != priority:
                trial.raised_to = priority
                self.service.store.record(trial.job_id, "sweep-promoted",
                                          {"why": trial.why, "to": priority}, priority=priority)
                self.service.backend.set_priority(trial.job_id, priority)
                log.info("promoted %s: %s", trial.job_id, trial.why)

    def _stop(self, trial: Trial, why: str) -> None:
        self.service.store.record(trial.job_id, "sweep-stopped", {"why": why})
        self.service.backend.cancel(trial.job_id, reason=f"stopped by {why}")
        self.forget(trial.job_id)
        log.info("stopped %s: %s", trial.job_id, why)

