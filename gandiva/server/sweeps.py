"""The server's sweeps: each trial's reported values in, the sweep's decisions out.

A sweep's trials are ordinary jobs, submitted together. As a trial reports the sweep's
metric, the rule (``gandiva.sweep.rules``) judges it at each rung it reaches: a trial surely
promoted has its priority set to the sweep's plus the rungs it passed (the scheduler then runs
it before the trials at lower rungs, time-slicing only among equals); one let through for want
of company goes on as it was ("continued"); one that does not go on is *paused*: held (it
checkpoints and its processes exit), its devices going to the next trial at once. As ASHA
promotes a paused configuration (Li et al., MLSys 2020), each new value at a rung judges the
trials paused there again, against every value there now, and one now in the top goes on
from its checkpoint. Once no trial of the sweep runs or waits to run, the paused ones are
stopped: cancelled, with the reason saying at which rung, with what value and rank.
Decision: a trial let through for want of company is judged again at that rung as soon as
enough others have a value there (promoted, or paused), unless it has reached its next rung.
Without this, which trials a sweep stops hung on the order in which they reached a rung:
trials arriving worst first were each let through alone and then outranked by nobody before
them, and a CI run of four trials (``tests/test_dashboard.py``) stopped none of them.
Decision: pause, not stop at once. Stopping at the first judgement, against the few values a
rung had so far, lost good trials to early company: with 16 trials of ``benchmarks/sweep.py``
(seed 0, keeping half), a trial at loss 0.400 beside one other at 0.388 at rung 300 was
stopped ("#2 of 2"); 15 of 16 were stopped, and the one left was not the best FIFO found.

Decision: every trial is judged at the first rung before a trial let through only for want
of company runs on. While some trial has not reached the first rung, a trial let through at
its latest rung waits one priority below the sweep's, unless the values at the first rung now
put it in the top there against enough others, so a scheduler that preempts gives its device
to the untried trials; a trial in the top keeps the sweep's priority and takes its turns
beside them (the best of the first trials, let through alone at the second rung, went on
waiting while the benchmark's 13 others were judged). Once every trial has been judged (or
has ended), priorities are as the rungs say. A first judgement costs a fraction of a second
each; without this the first trials, let through unjudged, kept both devices for a whole
quantum and more (measured with ``benchmarks/sweep.py``, seed 2: the last of 16 trials got
its first turn 32 s after the submission, against 3.6 s with every judged trial waiting).
A promotion raises priority only once every trial has been judged: the first trials
promoted, on the word of the few judged before them, would otherwise take the devices from
the rest (the benchmark's best trial waited behind a slow learner promoted "#1 of 4" early
on). A scheduler that never preempts (fifo) only orders its queue by these priorities.

Decision: the best trial at the first rung, once judged against enough others (the rule's
``sure``), *leads*: its priority is one above any the rungs give, so it runs on devices of its
own while the other trials take turns on the rest (the paper's AutoML ran its top
configurations exclusively and time-sliced the others; here the top one, from the first
judgement on). The first rung, because every trial is judged there against all the others;
the lead moves when a better value comes in there, and ends when the trial is paused at a
later rung or ends. Only while the cluster has devices for the leader and as many again for
the rest: on fewer, leading would stop the search. Without it the best of the first trials
waited for every other trial's first turn (``benchmarks/sweep.py`` seed 3: the good trial is
third of 16, and FIFO with ASHA, which runs it to the end as soon as it starts, reached the
target sooner).

A sweep acts on its trials only through ``Trials`` (the server's loop implements it): every
decision is recorded before it is carried out, and after a restart ``load`` takes every sweep
with a trial not yet finished up again and carries out again what a crash may have left
undone (a stop, a priority).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from gandiva.server.store import JobRow, SweepRow, TrialDecision, TrialRow
from gandiva.shares import CEILING, PRIORITY_MAX
from gandiva.spec import TERMINAL, JobState
from gandiva.sweep.rules import Verdict, judge, value_at
from gandiva.sweep.spec import SweepSpec

log = logging.getLogger("gandiva.sweeps")
POINTS_KEPT = 512  # a trial's newest points of the sweep's metric, for its next rung's value


class Trials(Protocol):
    """What a sweep does to its trials' jobs, and all it may do. Each call is recorded (an
    event of the job, with ``why``, queued for the store in the order made) before it is
    carried out."""

    def devices(self) -> int:
        """The cluster's devices (a sweep leads with one trial only where there is room)."""

    def decided(self, decision: TrialDecision) -> None:
        """Store the sweep's decision on a trial (what a restarted server takes up)."""

    def note(self, job_id: str, kind: str, why: str) -> None:
        """An event of the trial's job, nothing to carry out."""

    def set_priority(self, job_id: str, priority: int, kind: str, why: str) -> None: ...

    def hold(self, job_id: str, why: str) -> None:
        """Pause: the trial checkpoints and gives up its devices until ``release``."""

    def release(self, job_id: str, why: str) -> None: ...

    def stop(self, job_id: str, why: str) -> None:
        """Cancel the trial, with ``why`` as its reason."""


@dataclass
class Trial:
    sweep: Sweep
    number: int
    job_id: str
    rungs: dict[int, float] = field(default_factory=dict)  # rung -> its value there
    decision: str = "running"  # running, promoted, continued, paused, stopped
    ended: bool = False
    set_to: int | None = None  # the priority the sweep gave it last (None: the sweep's own)
    why: str = ""  # the reason of its latest promotion, or of its pause
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

    def active(self) -> bool:
        """Does a trial still run or wait to run (not ended, not paused)?"""
        return any(not t.ended and t.decision != "paused" for t in self.trials)

    def verdict(self, trial: Trial, rung: int) -> tuple[Verdict, str]:
        """The rule on ``trial``'s value at ``rung`` against every other value there now, and
        the reason in words."""
        stop, value = self.spec.stop, trial.rungs[rung]
        verdict = judge(stop.rule, value, self.at(rung, trial), minimize=self.spec.mode == "min",
                        reduction=stop.reduction, min_trials=stop.min_trials)
        return verdict, (f"sweep {self.id}, rung {rung}: {self.spec.metric} {value:.4g}, "
                         f"#{verdict.rank} of {verdict.of} ({verdict.why})")


class Sweeps:
    """Every sweep with a trial not yet finished; judges its trials as they report."""

    def __init__(self, trials: Trials) -> None:
        self.trials = trials
        self.by_job: dict[str, Trial] = {}
        self._lock = threading.Lock()  # the loop observes; the API adds sweeps

    def add(self, sweep_id: str, spec: SweepSpec, job_ids: list[str]) -> None:
        sweep = Sweep(sweep_id, spec)
        sweep.trials = [Trial(sweep, i, j) for i, j in enumerate(job_ids)]
        with self._lock:
            self.by_job.update({t.job_id: t for t in sweep.trials})

    def load(self, rows: list[SweepRow], trials: list[tuple[TrialRow, JobRow]]) -> int:
        """After a restart: the sweeps with a trial not finished (``rows``) and their trials,
        as stored; decisions not yet carried out are carried out. Returns how many sweeps."""
        sweeps = {row.id: Sweep(row.id, SweepSpec.model_validate(row.spec)) for row in rows}
        for t, job in trials:
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
            elif trial.decision == "paused":
                trial.why = f"sweep {sweep.id} (paused before a restart)"
                if job.state != JobState.HELD:
                    self.trials.hold(trial.job_id, trial.why)
        for sweep in sweeps.values():
            for rung in sweep.spec.stop.rungs:
                self._revisit(sweep, rung)
            self._raise(sweep)
            self._finish(sweep)
        return len(sweeps)

    def observe(self, job_id: str, series: dict[str, list[tuple[int, float]]]) -> None:
        """(The loop.) A job reported ``series``; if it is a trial, judge it at every rung
        it has now reached."""
        trial = self.by_job.get(job_id)
        if trial is None or trial.decision in ("stopped", "paused"):
            return  # (a held trial's last values may still come in)
        spec = trial.sweep.spec
        trial.points.extend((int(s), float(v)) for s, v in series.get(spec.metric, ()))
        stop = spec.stop
        judged = False
        for rung in stop.rungs[len(trial.rungs):]:
            value = value_at(rung, trial.points)
            if value is None:
                break
            judged = True
            trial.rungs[rung] = value
            verdict, why = trial.sweep.verdict(trial, rung)
            trial.decision = ("paused" if not verdict.go_on
                              else "promoted" if verdict.sure else "continued")
            self._store(trial)
            if not verdict.go_on:
                self._pause(trial, why)
            elif verdict.sure:
                trial.why = why
            else:
                self.trials.note(trial.job_id, "sweep-continued", why)
            self._revisit(trial.sweep, rung)
            if not verdict.go_on:
                break
        if judged:  # (not at every report: a sweep's trials are scanned)
            self._raise(trial.sweep)
            self._finish(trial.sweep)

    def forget(self, job_id: str) -> None:
        """(The loop.) A job ended; if it was a trial, its sweep goes on without it."""
        trial = self._ended(job_id)
        if trial is not None:
            self._raise(trial.sweep)
            self._finish(trial.sweep)

    def _ended(self, job_id: str) -> Trial | None:
        with self._lock:
            trial = self.by_job.pop(job_id, None)
        if trial is not None:
            trial.ended = True
        return trial

    def _store(self, trial: Trial) -> None:
        self.trials.decided(TrialDecision(trial.sweep.id, trial.number, dict(trial.rungs),
                                          trial.decision))

    def _revisit(self, sweep: Sweep, rung: int) -> None:
        """A value came in at ``rung``: promote the trials paused there that are now in the
        rule's top (ASHA's promotion of a paused configuration), and judge the trials let
        through there for want of company, now that they may have enough."""
        for trial in sweep.trials:
            if (trial.decision not in ("paused", "continued") or trial.ended
                    or max(trial.rungs) != rung):
                continue
            verdict, why = sweep.verdict(trial, rung)
            if trial.decision == "continued":
                self._judge_again(trial, verdict, why)
                continue
            if not verdict.go_on:
                continue
            trial.decision = "promoted"
            trial.why = f"{why}, after a pause"
            self._store(trial)
            self.trials.release(trial.job_id, trial.why)
            log.info("unpaused %s: %s", trial.job_id, trial.why)

    def _judge_again(self, trial: Trial, verdict: Verdict, why: str) -> None:
        """A trial let through for want of company, judged against the company that came:
        promoted if in the top, paused if not; left as it is while still too few."""
        if not verdict.sure:
            return
        why = f"{why}, once others reached the rung"
        trial.decision = "promoted" if verdict.go_on else "paused"
        self._store(trial)
        if verdict.go_on:
            trial.why = why
        else:
            self._pause(trial, why)

    def _pause(self, trial: Trial, why: str) -> None:
        trial.why = why
        self.trials.hold(trial.job_id, why)
        log.info("paused %s: %s", trial.job_id, why)

    def _finish(self, sweep: Sweep) -> None:
        """Once no trial runs or waits to run, the paused ones are stopped: none can be
        promoted any more."""
        if sweep.active():
            return
        for trial in sweep.trials:
            if trial.decision == "paused" and not trial.ended:
                trial.decision = "stopped"
                self._store(trial)
                self._stop(trial, sweep.verdict(trial, max(trial.rungs))[1])

    def _priority(self, trial: Trial, untried: bool, leader: Trial | None
                  ) -> tuple[int, str, str]:
        """The priority the sweep's rules give ``trial`` now (never past the ceiling a
        member's sweep starts under: its rungs order its own trials, not other users'), the
        event that says so, and why."""
        priority, kind, why = self._rule(trial, untried, leader)
        # a sweep above the ceiling is an admin's (members' are refused, and migration 0007
        # brought older ones down): its rungs go up to the top
        cap = CEILING if trial.sweep.spec.priority <= CEILING else PRIORITY_MAX
        return min(priority, cap), kind, why

    def _rule(self, trial: Trial, untried: bool, leader: Trial | None
              ) -> tuple[int, str, str]:
        sweep = trial.sweep
        base, first = sweep.spec.priority, sweep.spec.stop.rungs[0]  # (a rule has rungs)
        if trial is leader:
            return base + len(sweep.spec.stop.rungs) + 1, "sweep-leads", (
                f"sweep {sweep.id}: the best at rung {first} so far; runs on devices of its "
                "own while the other trials take turns on the rest")
        if not untried:
            if trial.decision == "promoted":
                return base + len(trial.rungs), "sweep-promoted", trial.why
            return base, "sweep-resumes", (f"sweep {sweep.id}: every trial has been judged "
                                           f"at rung {first}")
        if trial.decision == "continued" and not self._on_top(trial, first):
            return base - 1, "sweep-waits", (
                f"sweep {sweep.id}: let through at rung {max(trial.rungs)} for want of "
                f"company; waits until every trial has been judged at rung {first}")
        return base, "sweep-resumes", (f"{trial.why}; takes turns beside the trials not yet "
                                       "judged")

    def _leader(self, sweep: Sweep, first: int) -> Trial | None:
        """The live trial with the best value at the first rung, judged against enough others
        (the rule's ``sure``), while the cluster has devices for it and as many again for the
        other trials; else None."""
        live = [t for t in sweep.trials
                if first in t.rungs and not t.ended and t.decision != "paused"]
        if not live or self.trials.devices() < 2 * sweep.spec.gpus:
            return None
        sign = 1 if sweep.spec.mode == "min" else -1
        best = min(live, key=lambda t: (sign * t.rungs[first], t.number))
        return best if self._on_top(best, first) else None

    def _on_top(self, trial: Trial, first: int) -> bool:
        """Is ``trial`` in the rule's top at the first rung, judged against enough of the
        values there now?"""
        verdict = trial.sweep.verdict(trial, first)[0]
        return verdict.go_on and verdict.sure

    def _raise(self, sweep: Sweep) -> None:
        """Carry out the priorities the sweep's rules give its trials now (a paused trial
        keeps its own: it is held; with no rule, nothing changes)."""
        if sweep.spec.stop.rule == "none":
            return
        untried = sweep.untried()
        leader = self._leader(sweep, sweep.spec.stop.rungs[0])  # once: it reads every trial
        for trial in sweep.trials:
            if trial.ended or trial.decision == "paused":
                continue
            priority, kind, why = self._priority(trial, untried, leader)
            if priority == (sweep.spec.priority if trial.set_to is None else trial.set_to):
                continue
            trial.set_to = priority
            self.trials.set_priority(trial.job_id, priority, kind, why)
            log.info("%s %s: %s", kind, trial.job_id, why)

    def _stop(self, trial: Trial, why: str) -> None:
        self.trials.stop(trial.job_id, why)
        self._ended(trial.job_id)
        log.info("stopped %s: %s", trial.job_id, why)

