"""The server's sweeps: each trial's reported values in, the sweep's decisions out.

A sweep's trials are ordinary jobs, submitted together. As a trial reports the sweep's
metric, the rule (``gandiva.sweep.rules``) judges it at each rung it reaches: a trial surely
promoted has its priority set to the sweep's plus the rungs it passed (the scheduler then runs
it before the trials at lower rungs, time-slicing only among equals); one let through for want
of company goes on as it was ("continued"); a stopped one is cancelled, with the reason saying
at which rung, with what value and rank. Its devices go to the next trial at once.

Decision: every trial is judged at the first rung before any trial runs on. While some trial
has not reached it, a trial already judged there (promoted or let through) waits one priority
below the sweep's, so a scheduler that preempts gives the devices to the untried trials first;
once every trial has been judged (or has ended), priorities are as the rungs say. A first
judgement costs a fraction of a second each; without this the first trials, let through for
want of company, kept both devices for a whole quantum and more (measured with
``benchmarks/sweep.py``, seed 2: the last of 16 trials got its first turn 32 s after the
submission; the rung values of a few early trials promoted nothing surely). It also keeps the
first trials promoted, on the word of the few judged before them, from taking the devices
from the rest. A scheduler that never preempts (fifo) only orders its queue by it.

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
    set_to: int | None = None  # the priority the sweep gave it last (None: the sweep's own)
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
            if job.priority != sweep.spec.priority:
                trial.set_to = job.priority
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

    def _priority(self, trial: Trial, untried: bool) -> int:
        """The priority the sweep's rules give ``trial`` now."""
        base = trial.sweep.spec.priority
        if untried and trial.rungs:
            return base - 1  # judged once: waits for the trials not yet judged
        return base + len(trial.rungs) if trial.decision == "promoted" else base

    def _raise(self, sweep: Sweep) -> None:
        """Carry out the priorities the sweep's rules give its trials now."""
        untried = sweep.untried()
        for trial in sweep.trials:
            priority = self._priority(trial, untried)
            now = sweep.spec.priority if trial.set_to is None else trial.set_to
            if trial.ended or now == priority:
                continue
            trial.set_to = priority
            if priority < sweep.spec.priority:
                kind, why = "sweep-waits", (f"sweep {sweep.id}: judged at rung "
                                            f"{sweep.spec.stop.rungs[0]}; waits until every "
                                            "trial has been")
            elif priority > sweep.spec.priority:
                kind, why = "sweep-promoted", trial.why
            else:
                kind, why = "sweep-resumes", (f"sweep {sweep.id}: every trial has been judged "
                                              f"at rung {sweep.spec.stop.rungs[0]}")
            self.service.store.record(trial.job_id, kind, {"why": why, "to": priority},
                                      priority=priority)
            self.service.backend.set_priority(trial.job_id, priority)
            log.info("%s %s: %s", kind, trial.job_id, why)

    def _stop(self, trial: Trial, why: str) -> None:
        self.service.store.record(trial.job_id, "sweep-stopped", {"why": why})
        self.service.backend.cancel(trial.job_id, reason=f"stopped by {why}")
        self.forget(trial.job_id)
        log.info("stopped %s: %s", trial.job_id, why)

