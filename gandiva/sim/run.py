"""One call to simulate a trace under a policy: what the CLI, benchmarks and tests use."""

from __future__ import annotations

from collections.abc import Callable

from gandiva.policies import make_policy
from gandiva.shares import Shares
from gandiva.sim.engine import SimConfig, SimResult, Simulator
from gandiva.spec import Trace
from gandiva.state import Cluster

TIMELINE_MAX_JOBS = 300  # per-GPU segments are kept (and plotted) only for small runs


def simulate(
    trace: Trace,
    policy: str,
    *,
    cluster: str = "25x4",
    gpu_type: str = "V100",
    seed: int = 0,
    config: SimConfig | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    shares: Shares | None = None,
) -> SimResult:
    """Run ``trace`` under ``policy``; ``shares``: teams' and users' tickets (default: each
    user a team of its own, one ticket)."""
    config = config or SimConfig(seed=seed, timeline=len(trace.jobs) <= TIMELINE_MAX_JOBS)
    state = Cluster.build(cluster, gpu_type)
    state.shares = shares or Shares()
    sim = Simulator(
        state,
        make_policy(policy, seed),
        trace.jobs,
        reference_gpu=trace.reference_gpu,
        config=config,
    )
    result = sim.run(on_progress)
    result.notes[:0] = trace.notes
    return result
