"""What the scheduler's body asks of the machines that run jobs: the ``Nodes`` interface.

``Driver`` drives jobs through this and nothing else. Three implementations:
- ``gandiva.node.agent.Agent``: this machine's devices, real training processes (the default);
- ``ray.RayNodes``: one agent per Ray node, many machines;
- ``hollow.HollowNodes``: servers with no processes, for measuring the control plane at scale.

Every action may block (a suspend waits for the job's next mini-batch boundary) until done, or
return at once a ``Future`` that completes when it is done (hollow nodes); the backend calls
them off its loop, one job's actions in order (``courier``). What happens on its own (a
job's profile, its end, a node lost or joined) arrives on ``events``. The messages that cross
this interface (``Launch``, ``AgentEvent``) are declared here, by the interface, not by one of
its implementations.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Collection
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gandiva.node.accounts import Account

if TYPE_CHECKING:
    from gandiva.state import Cluster


@dataclass(frozen=True)
class Launch:
    """How to run a job: the body's part of a job spec (the policy never sees it)."""

    command: list[str]
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    account: Account | None = None  # who its processes run as (None: as the node's agent)


@dataclass
class AgentEvent:
    """What a node reports: ``started``, ``profile``, ``suspended`` (with the device
    memory its processes still hold, ``held_gb``, None if unknown), ``done``, ``failed``,
    ``restarted``, ``node-lost``, ``node-joined``; and ``crashed`` for a part of a gang (see
    ``gandiva.node.agent.Gang``). ``data``: the job's own report for ``started`` and
    ``profile`` (``wire.Started``, ``wire.Profile``), else a dict."""

    kind: str
    job_id: str
    data: Any = field(default_factory=dict)
    time: float = field(default_factory=time.monotonic)


class Nodes(Protocol):
    devices: list[str]  # every device's name, by the id the scheduler uses for it
    events: queue.Queue[AgentEvent]  # "profile", "done", "failed", "restarted", "node-lost"...
    jobs: Collection[str]  # jobs that have processes (running or suspended)
    ended: set[str]  # jobs whose processes ended (done, failed, parked or killed)

    def cluster(self) -> Cluster:
        """The cluster state these nodes make up (only where the backend did not detect it)."""

    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...]) -> Future | None:
        """Start the job (from its newest checkpoint, if any) on ``devices``."""

    def suspend(self, job_id: str) -> Future | None:
        """Suspend at the next mini-batch boundary (device memory freed)."""

    def resume(self, job_id: str, devices: tuple[int, ...]) -> Future | None:
        """Resume a suspended job on ``devices``."""

    def restart(self, job_id: str, devices: tuple[int, ...]) -> Future | None:
        """Checkpoint at the next boundary and go on on ``devices`` (migrate, grow, shrink)."""

    def park(self, job_id: str) -> Future | None:
        """Checkpoint at the next boundary and end the processes (hold, shutdown)."""

    def kill(self, job_id: str) -> Future | None:
        """End the processes now."""

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0, size: int = -1) -> bytes:
        """A rank's output from byte ``offset``: all of the rest, or at most ``size`` bytes."""

    def log_size(self, job_id: str, rank: int = 0) -> int:
        """How many bytes of output the rank has (``read_log`` reads up to here)."""

    def checkpoint_dir(self, job_id: str) -> Path | None:
        """Where the job's checkpoints are kept on this machine (None: nowhere here)."""

    def close(self) -> None:
        """End every process and free what the nodes hold."""


def newest_checkpoint(nodes: Nodes, job_id: str) -> Path | None:
    """The job's newest checkpoint on this machine, if any: asked of nodes that keep them
    where this process cannot look (a root server's node daemon), else looked for."""
    ask = getattr(nodes, "newest_checkpoint", None)
    if ask is not None:
        return ask(job_id)
    from gandiva.job import checkpoint

    where = nodes.checkpoint_dir(job_id)
    steps = checkpoint.steps(where) if where is not None else []
    return checkpoint.path(where, steps[0]) if where is not None and steps else None
