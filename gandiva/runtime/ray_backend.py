"""The ``ray`` backend: the local backend's loop over many machines, one agent per Ray node.

Each Ray node with GPUs (or GPU resources standing in for them) gets a ``NodeAgent`` actor,
pinned there with ``NodeAffinitySchedulingStrategy``. It claims all the node's GPUs from Ray
(``num_gpus``), so Ray's own scheduler hands none of them to anything else, and runs the job
processes with the same ``Agent`` the local backend uses. The scheduler loop (and a server)
runs on the head, in the driver: ``RayNodes`` gives it the ``Agent`` interface over all the
node agents, with one cluster-wide numbering of devices.

- Migration to another node: the job checkpoints at a mini-batch boundary and exits on the
  source; the checkpoint file goes through Ray's object store straight to the destination
  (the head passes a reference on, never the bytes), which installs it and starts the job in
  one of its warm processes (the paper's "warm up the destination first").
- Node failure: every new checkpoint a node writes is also copied to the head
  (``<workdir>/replicas``), so when a node dies (its agent or its raylet), its jobs go back to
  placement and restart elsewhere from their last checkpoint; nothing else is disturbed.
- Not yet: a gang spread over several nodes (a job wider than one node fails with a clear
  reason), and nodes that join after the server started.

Decision: a job's working directory must exist on every node (a shared file system, as
Slurm assumes); checkpoints and logs live on the node that runs the job.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

# Without these, Ray on these machines picks a non-loopback address and hangs, and phones
# home; they must be set before Ray is imported
for _key, _value in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                     "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_key, _value)

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from gandiva.runtime import checkpoint  # noqa: E402
from gandiva.runtime.agent import Agent, AgentEvent, Launch  # noqa: E402
from gandiva.runtime.local import detect_devices  # noqa: E402
from gandiva.state import GPU, Cluster, Node  # noqa: E402

POLL_S = 1.0  # a node agent's long poll for events


@ray.remote(num_cpus=0, max_concurrency=16)  # a long poll and actions at the same time
class NodeAgent:
    """The ``Agent`` of one Ray node, and what it reports to the head."""

    def __init__(self, workdir: str, slots: int, threads: int, checkpoint_every_s: float,
                 max_restarts: int) -> None:
        # Ray set CUDA_VISIBLE_DEVICES to the GPUs this actor claimed; without CUDA, the
        # claimed GPU resources become as many CPU slots
        devices, kind, memory = detect_devices(slots, threads)
        self.agent = Agent(Path(workdir), devices, threads=threads,
                           checkpoint_every_s=checkpoint_every_s, max_restarts=max_restarts)
        self.about = {"node_id": ray.get_runtime_context().get_node_id(),
                      "ip": ray.util.get_node_ip_address(), "devices": devices, "kind": kind,
                      "memory_gb": memory, "pid": os.getpid()}
        self.copied: dict[str, int] = {}  # the newest checkpoint step copied to the head

    def info(self) -> dict[str, Any]:
        return self.about

    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...],
              ckpt: tuple[int, bytes] | None = None) -> None:
        if ckpt is not None:
            checkpoint.install(self.agent.checkpoint_dir(job_id), *ckpt)
            self.copied[job_id] = ckpt[0]
        self.agent.start(job_id, launch, devices)

    def suspend(self, job_id: str) -> None:
        self.agent.suspend(job_id)

    def resume(self, job_id: str, devices: tuple[int, ...]) -> None:
        self.agent.resume(job_id, devices)

    def restart(self, job_id: str, devices: tuple[int, ...]) -> None:
        self.agent.restart(job_id, devices)

    def kill(self, job_id: str) -> None:
        self.agent.kill(job_id)

    def park(self, job_id: str) -> None:
        self.agent.park(job_id)

    def hand_over(self, job_id: str) -> tuple[int, bytes] | None:
        """Checkpoint at the next boundary, stop, and give the checkpoint file away."""
        self.agent.park(job_id)
        return checkpoint.newest_file(self.agent.checkpoint_dir(job_id))

    def read_log(self, job_id: str, rank: int, offset: int) -> bytes:
        return self.agent.read_log(job_id, rank, offset)

    def warm_ready(self) -> int:
        return self.agent.warm_ready()

    def next_events(self, timeout: float) -> list[tuple[str, str, dict]]:
        """What happened since the last call (waiting up to ``timeout`` for something), and
        checkpoints written since, for the head to keep."""
        out = []
        try:
            ev = self.agent.events.get(timeout=timeout)
            while True:
                out.append((ev.kind, ev.job_id, ev.data))
                ev = self.agent.events.get_nowait()
        except queue.Empty:
            pass
        for job_id in list(self.agent.jobs):
            newest = checkpoint.newest_file(self.agent.checkpoint_dir(job_id))
            if newest is not None and newest[0] > self.copied.get(job_id, -1):
                self.copied[job_id] = newest[0]
                out.append(("checkpoint", job_id, {"step": newest[0], "data": newest[1]}))
        return out

    def close(self) -> None:
        self.agent.close()


class RayNodes:
    """The ``Agent`` interface over one ``NodeAgent`` per Ray node with GPUs.

    Devices are numbered across the cluster, node by node; ``cluster()`` gives the
    scheduler's view (one server per node)."""

    def __init__(self, workdir: Path, address: str | None = None, threads: int = 1,
                 checkpoint_every_s: float = 300.0, max_restarts: int = 3) -> None:
        if not ray.is_initialized():
            ray.init(address=address, logging_level="warning", log_to_driver=False)
        self.workdir = Path(workdir).resolve()
        self.replicas = self.workdir / "replicas"
        nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
        if not nodes:
            raise RuntimeError("no Ray node offers GPUs; start workers with --num-gpus N "
                               "(CPU slots stand in for GPUs where there is no CUDA)")
        self.actors = []
        for n in nodes:
            gpus = int(n["Resources"]["GPU"])
            self.actors.append(NodeAgent.options(
                num_gpus=gpus, name=f"gandiva-agent-{n['NodeID'][:12]}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
            ).remote(str(self.workdir / f"node-{n['NodeID'][:12]}"), gpus, threads,
                     checkpoint_every_s, max_restarts))
        self.infos = ray.get([a.info.remote() for a in self.actors])
        self.devices: list[str] = []
        self.where: list[tuple[int, int]] = []  # device -> (node, its index there)
        for i, info in enumerate(self.infos):
            for local, name in enumerate(info["devices"]):
                self.devices.append(f"n{i}/{name}")
                self.where.append((i, local))
        self.events: queue.Queue[AgentEvent] = queue.Queue()
        self.jobs: dict[str, int] = {}  # job -> the node running it
        self.ended: set[str] = set()
        self.launches: dict[str, Launch] = {}
        self.visited: dict[str, list[int]] = {}  # job -> nodes it ran on, in order (its logs)
        self.alive = [True] * len(self.actors)
        self._lock = threading.Lock()
        self._closed = False
        self._pumps = [threading.Thread(target=self._pump, args=(i,), daemon=True,
                                        name=f"gandiva-ray-node{i}")
                       for i in range(len(self.actors))]
        for t in self._pumps:
            t.start()

    def cluster(self) -> Cluster:
        gpus, nodes = [], []
        for i, info in enumerate(self.infos):
            ids = []
            for _ in info["devices"]:
                gpus.append(GPU(len(gpus), i, len(ids), 0, info["kind"], info["memory_gb"]))
                ids.append(gpus[-1].id)
            nodes.append(Node(i, 0, ids))
        return Cluster(nodes, gpus)

    # ---- the Agent interface ------------------------------------------------------------
    def _on(self, devices: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        nodes = {self.where[d][0] for d in devices}
        if len(nodes) > 1:
            raise NotImplementedError("a gang over several nodes")
        node = nodes.pop()
        return node, tuple(self.where[d][1] for d in devices)

    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...]) -> None:
        self.launches[job_id] = launch
        self.ended.discard(job_id)
        try:
            node, local = self._on(devices)
        except NotImplementedError:
            self._failed(job_id, f"it needs {len(devices)} devices on one node; gangs over "
                                 "several nodes are not supported on the ray backend yet")
            return
        ckpt = self._replica(job_id) if self.visited.get(job_id, [node])[-1] != node else None
        self._call(node, "start", job_id, launch, local, ckpt)
        self._ran(job_id, node)

    def suspend(self, job_id: str) -> None:
        if job_id in self.jobs:
            self._call(self.jobs[job_id], "suspend", job_id)

    def resume(self, job_id: str, devices: tuple[int, ...]) -> None:
        if job_id not in self.jobs:
            return
        node, local = self._on(devices)
        if node == self.jobs[job_id]:
            self._call(node, "resume", job_id, local)
        else:
            self.restart(job_id, devices)

    def restart(self, job_id: str, devices: tuple[int, ...]) -> None:
        """Migration, grow and shrink; to another node, through the object store."""
        if job_id not in self.jobs:
            return
        src = self.jobs[job_id]
        node, local = self._on(devices)
        if node == src:
            self._call(node, "restart", job_id, local)
            return
        ckpt = self.actors[src].hand_over.remote(job_id)  # a reference: src -> dst directly
        self._call(node, "start", job_id, self.launches[job_id], local, ckpt)
        self._ran(job_id, node)

    def kill(self, job_id: str) -> None:
        self._stop(job_id, "kill")

    def park(self, job_id: str) -> None:
        self._stop(job_id, "park")

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0) -> bytes:
        """The job's log (one rank's) from ``offset``, across the nodes it ran on."""
        parts = [self._call(node, "read_log", job_id, rank, 0) or b""
                 for node in self.visited.get(job_id, []) if self.alive[node]]
        return b"".join(parts)[offset:]

    def close(self) -> None:
        self._closed = True
        for i, actor in enumerate(self.actors):
            try:  # a node that went away may not be known to be gone yet
                ray.get(actor.close.remote(), timeout=30)
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - Ray raises plain Exception for a lost actor
                self.alive[i] = False
        for t in self._pumps:
            t.join(timeout=5)

    # ---- inside -------------------------------------------------------------------------
    def _call(self, node: int, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self.actors[node], method).remote(*args))
        except ray.exceptions.RayActorError:
            return None  # the node is gone: its pump reports it

    def _ran(self, job_id: str, node: int) -> None:
        with self._lock:
            self.jobs[job_id] = node
            seen = self.visited.setdefault(job_id, [])
            if not seen or seen[-1] != node:
                seen.append(node)

    def _stop(self, job_id: str, how: str) -> None:
        node = self.jobs.pop(job_id, None)
        self.ended.add(job_id)
        if node is not None:
            self._call(node, how, job_id)

    def _failed(self, job_id: str, reason: str) -> None:
        self.jobs.pop(job_id, None)
        self.ended.add(job_id)
        self.events.put(AgentEvent("failed", job_id, {"reason": reason}))

    def _replica(self, job_id: str) -> tuple[int, bytes] | None:
        return checkpoint.newest_file(self.replicas / job_id)

    def _pump(self, node: int) -> None:
        """Carry node ``node``'s events to the loop; keep its checkpoints; notice its end."""
        actor = self.actors[node]
        while not self._closed:
            try:
                batch = ray.get(actor.next_events.remote(POLL_S))
            except ray.exceptions.RayError:
                if self._closed:
                    return
                self.alive[node] = False
                with self._lock:
                    lost = [j for j, n in self.jobs.items() if n == node]
                    for j in lost:
                        del self.jobs[j]
                self.events.put(AgentEvent("node-lost", "", {"node": node, "jobs": lost}))
                return
            for kind, job_id, data in batch:
                if kind == "checkpoint":
                    checkpoint.install(self.replicas / job_id, data["step"], data["data"])
                    continue
                if kind in ("done", "failed"):
                    with self._lock:
                        if self.jobs.get(job_id) == node:
                            del self.jobs[job_id]
                    self.ended.add(job_id)
                self.events.put(AgentEvent(kind, job_id, data))
