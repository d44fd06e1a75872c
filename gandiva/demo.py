"""``gandiva demo``: a shared machine's queue of real PyTorch jobs, under fifo and gandiva.

The jobs train the example CNN (``examples/cnn.py``), each with its own learning rate, and
arrive a few seconds apart the way a shared cluster's jobs do: more jobs than devices, most of
them short and a few long (in the Philly trace the middle 98% of run times span 17 s to 71 h,
and 40% are under ten minutes). That is when the policies differ. fifo runs the jobs in arrival
order, so a short job that arrives behind a long one waits for it, first feedback included.
gandiva over-subscribes the devices and time-slices them, so every job starts soon after it
arrives and short jobs end without waiting; it pays with suspends (a device idle while a job
is put away and another resumed) and with the long jobs, which share their device and end
later.

Decision: the quantum is 5 s, not the paper's 60 s: the demo's jobs last seconds, not hours,
and a 60 s quantum would be longer than most of them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gandiva import actions as A
from gandiva.backends.driver import Driver, detect_devices
from gandiva.node.agent import Launch, start_zygote
from gandiva.policies import make_policy
from gandiva.run import RunResult, outcome
from gandiva.spec import JobSpec, JobState

DEMO_QUANTUM_S = 5.0
# the demo waits this long for its zygote's imports before its first run, so that its
# timings are the scheduler's, not an import's (a job's start waits less: agent.ZYGOTE_WAIT_S)
WARM_UP_S = 120.0


def examples_dir() -> Path:
    here = Path(__file__).resolve().parents[1] / "examples"
    if not (here / "cnn.py").exists():
        raise FileNotFoundError(f"the demo needs the example scripts in {here}; run it from a "
                                "checkout of the gandiva repository")
    return here


# Each job's length as a fraction of the longest (``--steps``), cycled in the order they
# arrive: two long jobs first, which take the devices, then four short ones (a twentieth to a
# fifth), which is the case that separates the policies (short jobs first wait for nothing).
LENGTHS = (1.0, 0.6, 0.1, 0.05, 0.2, 0.05)


@dataclass
class DemoConfig:
    jobs: int | None = None  # default: three per device
    slots: int | None = None
    steps: int = 8000  # the longest job's mini-batches (about 40 s alone on a CPU core)
    arrival_gap: float = 2.0  # seconds between one job's submission and the next's
    width: int = 32
    quantum: float = DEMO_QUANTUM_S
    policies: tuple[str, ...] = ("fifo", "gandiva")

    def lengths(self, n: int) -> list[int]:
        return [max(1, round(self.steps * LENGTHS[i % len(LENGTHS)])) for i in range(n)]

    @property
    def shortest(self) -> int:
        """The shortest job's mini-batches."""
        return min(self.lengths(len(LENGTHS)))

    @property
    def feedback_steps(self) -> int:
        """"First feedback": a third of the shortest job's mini-batches done."""
        return max(1, round(self.steps * min(LENGTHS) / 3))


def search(cfg: DemoConfig, n: int) -> list[tuple[JobSpec, Launch]]:
    """``n`` jobs of the CNN, learning rates spread log-uniformly over 1e-3..3e-1, lengths
    from ``LENGTHS``, submitted ``cfg.arrival_gap`` seconds apart."""
    script = examples_dir() / "cnn.py"
    out = []
    for i, steps in enumerate(cfg.lengths(n)):
        lr = 1e-3 * (300 ** (i / max(1, n - 1)))
        spec = JobSpec(f"job{i}-{steps}steps", i * cfg.arrival_gap, 1, "cnn",
                       mini_batches=steps)
        out.append((spec, Launch(["{python}", str(script), "--steps", str(steps),
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
        "packs_unpacks": f"{res.counts.get('packs', 0)} / {res.counts.get('unpacks', 0)}",
        "mean_suspend_s": sum(suspend_s) / len(suspend_s) if suspend_s else None,
        "final_losses": {j.spec.id: j.metrics.get("loss") for j in res.jobs},
    }


@dataclass(frozen=True)
class Metric:
    """A row of the demo's table, and what makes the policies differ on it (``why``)."""

    label: str
    key: str  # the summary's value this row shows
    form: str
    lower_is_better: bool | None  # None: a count of what time-slicing costs
    why: str


# what decides each row, said for either outcome
WAITS = "under fifo a job waits for the jobs ahead of it to end; under gandiva for a turn"
LAST = ("the long job, put behind the short ones, ends last and alone, with nothing left for "
        "the other devices; each switch idles a device a moment too")
METRICS = (
    Metric("mean time to first feedback", "mean_first_feedback_s", "{:.1f} s", True, WAITS),
    Metric("worst time to first feedback", "max_first_feedback_s", "{:.1f} s", True, WAITS),
    Metric("mean JCT", "mean_jct_s", "{:.1f} s", True,
           "short jobs pass the long ones under gandiva; each switch costs a suspend and a "
           "resume"),
    Metric("p95 JCT", "p95_jct_s", "{:.1f} s", True,
           "the long jobs share their device with the jobs that arrive after them"),
    Metric("makespan", "makespan_s", "{:.1f} s", True, LAST),
    Metric("device utilisation", "utilization", "{:.0%}", False, LAST),
    Metric("suspends", "suspends", "{:.0f}", None,
           "each saves a job's state to host memory and frees its device"),
    Metric("mean suspend latency", "mean_suspend_s", "{:.3f} s", None,
           "how long a device waits for a suspend on this machine"),
    Metric("packs / unpacks", "packs_unpacks", "{}", None,
           "two jobs tried on one device, kept only if both run faster together"),
)


def shown(m: Metric, summary: dict[str, Any]) -> str:
    v = summary.get(m.key)
    return "-" if v is None or v != v else m.form.format(v)  # None or NaN


def reading(m: Metric, base: dict[str, Any], other: dict[str, Any]) -> str:
    """What ``other`` (gandiva) wins or pays against ``base`` (fifo) on ``m``, and why."""
    a, b = base.get(m.key), other.get(m.key)
    if m.lower_is_better is None or not a or not b or a != a or b != b:  # None, 0 or NaN
        return m.why
    better = b < a if m.lower_is_better else b > a
    if a == b:
        return f"even: {m.why}"
    ratio = max(a, b) / min(a, b)
    amount = f"{ratio:.1f}x" if ratio >= 1.5 else f"{ratio - 1:.0%}"
    return f"{'wins' if better else 'pays'} {amount}: {m.why}"


def run_demo(cfg: DemoConfig, workdir: Path, on_start=None) -> dict[str, tuple[RunResult, dict]]:
    devices, _, _ = detect_devices(cfg.slots)
    n = cfg.jobs or 3 * len(devices)
    out = {}
    # One warm zygote for every policy's run, ready before the first: each job starts as a
    # fork of an interpreter that has imported torch, under every policy, rather than the
    # first jobs of each run cold (seconds of CPU each, in the first-feedback times) while
    # that run's agent starts a zygote of its own.
    workdir.mkdir(parents=True, exist_ok=True)
    zygote = start_zygote(workdir)
    zygote.wait_ready(WARM_UP_S)  # if it never is, the jobs start cold, as without it
    try:
        for name in cfg.policies:
            spec = policy_spec(name, cfg)
            if on_start:
                on_start(spec, n, devices)
            run_dir = workdir / spec.replace(":", "_").replace("=", "-")
            shutil.rmtree(run_dir, ignore_errors=True)
            backend = Driver(make_policy(spec), run_dir, slots=cfg.slots,
                             feedback_steps=cfg.feedback_steps, zygote=zygote)
            for job_spec, launch in search(cfg, n):
                backend.submit(job_spec, launch)
            res = backend.run()
            out[spec] = (res, summarize(res))
    finally:
        zygote.close()
    return out
