"""An Optuna study driving trials through gandiva: its sampler picks each trial's parameters,
gandiva runs the trial as a job (time-sliced with the others), and its pruner sees every value
the job reports and has the scheduler stop the trials it prunes.

    import optuna
    from gandiva.client import Client, Settings
    from gandiva.sweep.optuna_bridge import optimize

    def job(trial):
        lr = trial.suggest_float("lr", 1e-4, 0.3, log=True)
        return {"name": f"lr-{trial.number}", "command": f"python cnn.py --lr {lr}"}

    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_warmup_steps=50))
    optimize(study, job, n_trials=32, client=Client(Settings.resolve()), metric="loss")

Ask-and-tell: ``parallel`` trials are asked for and submitted at once, more as they end; each
new point of ``metric`` is ``trial.report(value, step)``; a trial ``should_prune`` is cancelled
(its devices go to the next trial at once) and told PRUNED; a job that ends done tells its
last value, one that fails or is cancelled otherwise tells FAIL.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import optuna

from gandiva.client import Client

ENDED = ("done", "failed", "cancelled")


def optimize(study: optuna.Study, job: Callable[[optuna.Trial], dict[str, Any]],
             n_trials: int, *, client: Client, metric: str, parallel: int = 4,
             poll_s: float = 1.0) -> None:
    """Run ``n_trials`` of ``study``; ``job(trial)`` is a trial's job spec (as ``gandiva
    submit`` takes), built from the parameters it suggests."""
    live: dict[str, tuple[optuna.Trial, list[int]]] = {}  # job -> (trial, [last step seen])
    asked = 0
    study_label = re.sub(r"[^A-Za-z0-9._-]", "-", study.study_name)[:63].strip("-._") or "study"
    while asked < n_trials or live:
        while asked < n_trials and len(live) < parallel:
            trial = study.ask()
            asked += 1
            spec = job(trial)
            spec["labels"] = {**spec.get("labels", {}), "optuna-study": study_label,
                              "optuna-trial": str(trial.number)}
            live[client.submit(spec)["id"]] = (trial, [-1])
        for job_id, (trial, seen) in list(live.items()):
            state = client.job(job_id)["state"]  # before the points: none is missed at the end
            points = client.metrics(job_id, [metric], seen[0]).get(metric, [])
            for step, value, _ in points:
                trial.report(value, int(step))
                seen[0] = int(step)
            if state in ENDED:
                if state == "done" and seen[0] >= 0:
                    study.tell(trial, points[-1][1] if points else _last(client, job_id, metric))
                else:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                del live[job_id]
            elif points and trial.should_prune():
                client.act(job_id, "cancel")
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                del live[job_id]
        if live:
            time.sleep(poll_s)


def _last(client: Client, job_id: str, metric: str) -> float:
    return client.metrics(job_id, [metric])[metric][-1][1]
