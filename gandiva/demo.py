"""``gandiva demo``: a hyper-parameter search of real PyTorch jobs, under fifo and gandiva.

Each job trains the example CNN (``examples/cnn.py``) with its own learning rate. There are
more jobs than devices, which is when the policies differ: fifo runs them in turn, so the last
configurations wait for all the others before they show a single loss value; gandiva
over-subscribes the devices and time-slices them, so every configuration reports early (the
paper's early feedback), at the price of a little switching.

Decision: the quantum is 5 s, not the paper's 60 s: the demo's jobs last seconds, not hours,
and a 60 s quantum would be longer than the whole search.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gandiva import actions as A
from gandiva.backends.driver import Driver, detect_devices
from gandiva.node.agent import Launch
from gandiva.policies import make_policy
from gandiva.run import RunResult, outcome
from gandiva.spec import JobSpec, JobState

DEMO_QUANTUM_S = 5.0


def examples_dir() -> Path:
    here = Path(__file__).resolve().parents[1] / "examples"
    if not (here / "cnn.py").exists():
        raise FileNotFoundError(f"the demo needs the example scripts in {here}; run it from a "
                                "checkout of the gandiva repository")
    return here


@dataclass
class DemoConfig:
    jobs: int | None = None  # default: three per device
    slots: int | None = None
    steps: int = 1500
    width: int = 32
    feedback_steps: int = 150  # "first feedback": this many mini-batches done (10% of a job)
    quantum: float = DEMO_QUANTUM_S
    policies: tuple[str, ...] = ("fifo", "gandiva")


def search(cfg: DemoConfig, n: int) -> list[tuple[JobSpec, Launch]]:
    """``n`` configurations of the CNN, learning rates spread log-uniformly over 1e-3..3e-1."""
    script = examples_dir() / "cnn.py"
    out = []
    for i in range(n):
        lr = 1e-3 * (300 ** (i / max(1, n - 1)))
        spec = JobSpec(f"lr-{lr:.4f}", 0.0, 1, "cnn", mini_batches=cfg.steps)
        out.append((spec, Launch(["{python}", str(script), "--steps", str(cfg.steps),
                                  "--lr", f"{lr:.6f}", "--width", str(cfg.width),
                                  "--seed", str(i)])))
    return out


def policy_spec(name: str, cfg: DemoConfig) -> str:
    return f"{name}:quantum={cfg.quantum:g}" if name.split(":")[0] == "gandiva" else name


def summarize(res: RunResult) -> dict[str, Any]:
    """A run's outcome (``run.outcome``), and what this machine measured of it: devices
    busy, how long a suspend took here, each job's final loss."""
    suspend_s = [d for _, a, d in res.actions if isinstance(a, A.Suspend)]
    makespan = max((j.finish for j in res.jobs if j.status == JobState.DONE), default=0.0)
    return {
        **outcome(res),
        "makespan_s": makespan,
        "utilization": (res.busy_device_seconds() / (len(res.devices) * makespan)
                        if makespan else 0.0),
        "suspends": res.counts.get("suspends", 0),  # unpacks apart (the table shows both)
        "unpacks": res.counts.get("unpacks", 0),
        "mean_suspend_s": sum(suspend_s) / len(suspend_s) if suspend_s else None,
        "final_losses": {j.spec.id: j.metrics.get("loss") for j in res.jobs},
    }


def run_demo(cfg: DemoConfig, workdir: Path, on_start=None) -> dict[str, tuple[RunResult, dict]]:
    devices, _, _ = detect_devices(cfg.slots)
    n = cfg.jobs or 3 * len(devices)
    out = {}
    for name in cfg.policies:
        spec = policy_spec(name, cfg)
        if on_start:
            on_start(spec, n, devices)
        run_dir = workdir / spec.replace(":", "_").replace("=", "-")
        shutil.rmtree(run_dir, ignore_errors=True)
        backend = Driver(make_policy(spec), run_dir, slots=cfg.slots,
                               feedback_steps=cfg.feedback_steps)
        for job_spec, launch in search(cfg, n):
            backend.submit(job_spec, launch)
        res = backend.run()
        out[spec] = (res, summarize(res))
    return out
