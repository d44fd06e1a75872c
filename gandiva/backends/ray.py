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
  a process forked from its zygote, torch already imported (the paper's "warm up the
  destination first").
- Node failure: every checkpoint a job writes is also copied to the head
  (``<workdir>/replicas``), so when a node dies (its agent or its raylet), its jobs go back to
  placement and restart elsewhere from their last checkpoint; nothing else is disturbed. (A
  moved job's copy in transit is not copied again: the node it left keeps the file, as its
  spare, until the job's next checkpoint reaches the head.)
- Logs outlive their node: each rank's new output goes to the head with the node's events
  (``<workdir>/logs``), and reads of a job's log come from there. A node's sudden death
  loses at most what its jobs wrote in the last ``POLL_S`` (1 s) before it, and before the
  pump's round trip to the head (more only from a rank that writes over
  ``LOG_CHUNK_BYTES`` a second).
- A gang spread over several nodes runs as one part per node (``Gang``: global ranks, and
  torchrun's rendezvous at rank 0's node). It is suspended, resumed, checkpointed and moved
  as one: the head sends each action to every part at once (the job library makes the ranks
  act at the same mini-batch boundary), and every part restores the same checkpoint, the
  newest one, which rank 0's node writes and the others receive through the object store.
  When a rank crashes, the whole gang restarts from that checkpoint, as torchrun does.
- Nodes that join Ray later get an agent within ``JOIN_POLL_S`` and are reported
  (``node-joined``), so the scheduler adds them to its cluster state; a node that dies and
  comes back has a new Ray id and joins as a new node.

Decision: a job's working directory must exist on every node (a shared file system, as
Slurm assumes); checkpoints and logs are written on the node that runs the job.
"""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

# Without these, Ray on these machines picks a non-loopback address and hangs, and phones
# home; they must be set before Ray is imported
for _key, _value in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                     "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_key, _value)

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from gandiva.backends.driver import detect_devices  # noqa: E402
from gandiva.backends.nodes import AgentEvent, Launch  # noqa: E402
from gandiva.job import checkpoint  # noqa: E402
from gandiva.node import accounts, cgroups  # noqa: E402
from gandiva.node.accounts import Account  # noqa: E402
from gandiva.node.agent import Agent, Gang, rank_logs  # noqa: E402
from gandiva.state import GPU, Cluster, Node  # noqa: E402

POLL_S = 1.0  # a node agent's long poll for events
SILENT_S = 60.0  # a node agent that answers no poll for this long is ended and its node lost
JOIN_POLL_S = 2.0  # how often the head looks for nodes that joined Ray
AGENT_START_S = 120.0  # a node agent that is not up by then is given up (and reported)
LOG_CHUNK_BYTES = 1 << 20  # of a rank's output, a poll carries at most this: bounded memory


@ray.remote(num_cpus=0, max_concurrency=16)  # a long poll and actions at the same time
class NodeAgent:
    """The ``Agent`` of one Ray node, and what it reports to the head."""

    def __init__(self, workdir: str, users: str | None, slots: int, threads: int,
                 checkpoint_every_s: float, max_restarts: int) -> None:
        # Ray set CUDA_VISIBLE_DEVICES to the GPUs this actor claimed; without CUDA, the
        # claimed GPU resources become as many CPU slots
        devices, kind, memory = detect_devices(slots, threads)
        self.agent = Agent(Path(workdir), devices, threads=threads, memory_gb=memory,
                           checkpoint_every_s=checkpoint_every_s, max_restarts=max_restarts)
        self.users = Path(users) if users is not None else None
        self.about = {"node_id": ray.get_runtime_context().get_node_id(),
                      "ip": ray.util.get_node_ip_address(), "devices": devices, "kind": kind,
                      "memory_gb": memory, "pid": os.getpid(), "uid": os.geteuid(),
                      "token_auth": _token_auth()}
        self.owners: dict[str, int] = {}  # job -> the uid its checkpoints must belong to
        # a job's checkpoint is read whole to copy it to the head: no more than half this
        # machine's memory (a larger one stays on its node, the head keeps the older copy)
        total = cgroups.memory_bytes()
        self.max_bytes = total // 2 if total is not None else None
        self.copied: dict[str, int] = {}  # the newest checkpoint step copied to the head
        self.sent: dict[tuple[str, int], int] = {}  # (job, rank) -> bytes of its log sent
        self.logging: set[str] = set()  # jobs whose output may not all be at the head yet
        self._logging = threading.Lock()

    def info(self) -> dict[str, Any]:
        return self.about

    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...],
              ckpt: tuple[int, Any] | None = None, gang: Gang | None = None) -> None:
        """Start the job (this node's part of it) from ``ckpt``, the newest checkpoint, if
        it came from elsewhere."""
        account = launch.account
        self.owners[job_id] = account.uid if account is not None else os.geteuid()
        # (an account this node cannot run: the agent fails the job, naming why)
        if ckpt is not None and (account is None or accounts.problem(account) is None):
            checkpoint.install(self.agent.checkpoint_dir(job_id), *ckpt, transit=True,
                               owner=account)
            self.copied[job_id] = ckpt[0]  # it came from a node that keeps it, or the head
        for rank, path in rank_logs(self.agent.job_dir(job_id)):  # an earlier agent's
            self.sent.setdefault((job_id, rank), path.stat().st_size)  # (it sent it)
        self.agent.start(job_id, launch, devices, gang)
        with self._logging:  # after the start: see ``_new_output``
            self.logging.add(job_id)

    def rendezvous(self, job_id: str) -> int:
        return self.agent.rendezvous(job_id)

    def newest(self, job_id: str) -> tuple[int, Any, str] | None:
        """The job's newest checkpoint file, to hand on; mapped, not read: Ray copies it
        from the page cache into the object store once."""
        return checkpoint.mapped(self.agent.checkpoint_dir(job_id), self._owner(job_id))

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

    def hand_over(self, job_id: str) -> tuple[int, Any, str] | None:
        """Checkpoint at the next boundary, stop, and give the checkpoint file away."""
        self.agent.park(job_id)
        return self.newest(job_id)

    def read_log(self, job_id: str, rank: int, offset: int, size: int = -1) -> bytes:
        return self.agent.read_log(job_id, rank, offset, size)

    def log_size(self, job_id: str, rank: int) -> int:
        return self.agent.log_size(job_id, rank)

    def warm_ready(self) -> bool:
        return self.agent.warm_ready()

    def next_events(self, timeout: float) -> list[tuple[str, str, dict]]:
        """What happened since the last call (waiting up to ``timeout`` for something), and
        checkpoints and output written since, for the head to keep. The output comes first,
        read after the events: the head has a job's last lines when it learns it ended."""
        out = []
        try:
            ev = self.agent.events.get(timeout=timeout)
            while True:
                out.append((ev.kind, ev.job_id, ev.data))
                ev = self.agent.events.get_nowait()
        except queue.Empty:
            pass
        for job_id in list(self.agent.jobs):
            directory = self.agent.checkpoint_dir(job_id)
            if max(checkpoint.steps(directory), default=-1) <= self.copied.get(job_id, -1):
                continue  # (a directory listing: reading the file each poll cost a core)
            newest = checkpoint.newest_file(directory, self._owner(job_id), self.max_bytes)
            if newest is not None and newest[0] > self.copied.get(job_id, -1):
                self.copied[job_id] = newest[0]
                out.append(("checkpoint", job_id, {"step": newest[0], "data": newest[1],
                                                    "digest": newest[2]}))
        return self._new_output() + out

    def close(self) -> None:
        self.agent.close()

    def settle(self, name: str, account: Account) -> None:
        """The user ``name``'s base directory made ``account``'s (see ``accounts.settle``):
        one of the users' directories, never another path."""
        accounts.settle(self._base(name, account), account)

    def can_run(self, name: str, account: Account) -> str | None:
        return (accounts.problem(account)
                or accounts.can_run(account, self._base(name, account)))

    def _base(self, name: str, account: Account) -> Path:
        if self.users is None or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
            raise ValueError(f"no user directory {name!r} here")
        if account.uid <= 0 or account.gid <= 0:
            raise ValueError("no job runs as root")
        return self.users / name

    def _owner(self, job_id: str) -> int:
        return self.owners.get(job_id, os.geteuid())

    def _new_output(self) -> list[tuple[str, str, dict]]:
        """Each rank's output since the last call (up to ``LOG_CHUNK_BYTES``), of the jobs
        started here, until the whole of a job that ended here has been sent."""
        out = []
        with self._logging:  # a start meanwhile: its job is not forgotten before it is read
            for job_id in list(self.logging):
                running = job_id in self.agent.jobs  # before reading: its last lines are in
                for rank, _ in rank_logs(self.agent.job_dir(job_id)):
                    offset = self.sent.get((job_id, rank), 0)
                    data = self.agent.read_log(job_id, rank, offset, LOG_CHUNK_BYTES)
                    if data:
                        self.sent[job_id, rank] = offset + len(data)
                        out.append(("log", job_id, {"rank": rank, "offset": offset,
                                                    "data": data}))
                        running = True  # more may follow
                if not running:
                    self.logging.discard(job_id)
        return out


class RayNodes:
    """The ``Agent`` interface over one ``NodeAgent`` per Ray node with GPUs.

    Devices are numbered across the cluster, node by node; ``cluster()`` gives the
    scheduler's view (one server per node). A job runs as one part per node it has devices
    on; its ranks go node by node, in the order the devices were given."""

    def __init__(self, workdir: Path, address: str | None = None, threads: int = 1,
                 checkpoint_every_s: float = 300.0, max_restarts: int = 3,
                 silent_s: float = SILENT_S, users: Path | None = None) -> None:
        if not ray.is_initialized():
            _token_if_kept()
            ray.init(address=address, logging_level="warning", log_to_driver=False)
        self.workdir = Path(workdir).resolve()
        self.replicas = self.workdir / "replicas"
        self.logs = self.workdir / "logs"
        self.max_restarts = max_restarts
        self.silent_s = silent_s
        self.users_dir = Path(users).resolve() if users is not None else None  # shared
        self._agent_args = (threads, checkpoint_every_s, max_restarts)
        self.actors: list = []
        self.infos: list[dict[str, Any]] = []
        self.devices: list[str] = []
        self.where: list[tuple[int, int]] = []  # device -> (node, its index there)
        self.alive: list[bool] = []
        self.seen: set[str] = set()  # Ray node ids that have (or had) an agent
        for n in _gpu_nodes():
            self._add(n)
        if not self.actors:
            raise RuntimeError("no Ray node offers GPUs; start workers with --num-gpus N "
                               "(CPU slots stand in for GPUs where there is no CUDA)")
        self.events: queue.Queue[AgentEvent] = queue.Queue()
        self.jobs: dict[str, tuple[int, ...]] = {}  # job -> nodes running it, rank 0's first
        self.plans: dict[str, list[tuple[int, tuple[int, ...]]]] = {}  # its parts
        self.left: dict[str, set[int]] = {}  # job -> nodes whose part has not finished
        # where a job's newest checkpoint is: on its holder, the rank 0 node of its last run
        # (which writes them); else on its spare, the node it last moved from, until the
        # holder's next checkpoint reaches the head's replicas; else in the replicas
        self.holder: dict[str, int] = {}
        self.spare: dict[str, int] = {}
        self.restarts: dict[str, int] = {}  # restarts of gangs over several nodes
        self.runs: dict[str, int] = {}  # starts of each job: tells a part of this run
        self.ended: set[str] = set()
        self.launches: dict[str, Launch] = {}
        self._lock = threading.Lock()  # the maps above, between the loop and the pumps
        # (node, job, rank) -> how much of that node's log of the rank the head's copy holds
        self.copied: dict[tuple[int, str, int], int] = {}
        self._copying = threading.Lock()  # the copies of logs, and ``copied``
        # one action at a time on each job (the loop's, or a pump's restart of its gang);
        # actions on different jobs go on at once, as the loop hands them out (a suspend that
        # waits for a slow job's mini-batch boundary holds up no other job)
        # (held weakly: a job's lock lives while an action holds it, so ended jobs leave none)
        self._acting: weakref.WeakValueDictionary[str, threading.RLock] = (
            weakref.WeakValueDictionary())
        self._closed = False
        self._threads = [threading.Thread(target=self._watch, daemon=True,
                                          name="gandiva-ray-joins")]
        for i in range(len(self.actors)):
            self._pump_node(i)
        self._threads[0].start()

    def cluster(self) -> Cluster:
        gpus, nodes = [], []
        for i, info in enumerate(self.infos):
            ids = []
            for _ in info["devices"]:
                gpus.append(GPU(len(gpus), i, len(ids), 0, info["kind"], info["memory_gb"]))
                ids.append(gpus[-1].id)
            nodes.append(Node(i, 0, ids))
        return Cluster(nodes, gpus)

    @property
    def root(self) -> bool:
        """Every node agent runs as root (as its raylet does): each can run a job as its
        user's account."""
        return all(info["uid"] == 0 for info in self.infos)

    @property
    def token_auth(self) -> bool:
        """Ray's token authentication is on for every node's processes: a process that does
        not hold the cluster's token (a job's) cannot call the agents."""
        return all(info["token_auth"] for info in self.infos)

    def settle(self, name: str, base: Path, account: Account) -> None:
        """(Tenancy's node.) A user's directory, on the file system the nodes share, made
        its account's, by a node agent (root; the server on the head need not be)."""
        self._call(self._any(), "settle", name, account)

    def can_run(self, name: str, base: Path, account: Account) -> str | None:
        return self._call(self._any(), "can_run", name, account)

    def _any(self) -> int:
        return next((i for i, up in enumerate(self.alive) if up), 0)

    # ---- the Agent interface ------------------------------------------------------------
    def start(self, job_id: str, launch: Launch, devices: tuple[int, ...]) -> None:
        with self._job(job_id):
            self.launches[job_id] = launch
            self.ended.discard(job_id)
            self._launch(job_id, self._plan(devices))

    def suspend(self, job_id: str) -> None:
        with self._job(job_id):
            self._on_each(self.jobs.get(job_id, ()), "suspend", job_id)

    def resume(self, job_id: str, devices: tuple[int, ...]) -> None:
        with self._job(job_id):
            if job_id not in self.jobs:
                return
            plan, old = self._plan(devices), self.plans[job_id]
            # in place if every part stays on its node with as many devices; a gang over
            # several nodes changes GPUs only through a checkpoint (NCCL binds its GPUs)
            if _shape(plan) == _shape(old) and (len(plan) == 1 or plan == old
                                                or self._cpu(plan)):
                self.plans[job_id] = plan
                self._wait([self.actors[n].resume.remote(job_id, local) for n, local in plan])
            else:
                self._move(job_id, plan)

    def restart(self, job_id: str, devices: tuple[int, ...]) -> None:
        """Migration, grow and shrink; to other nodes, through the object store."""
        with self._job(job_id):
            if job_id not in self.jobs:
                return
            plan, old = self._plan(devices), self.plans[job_id]
            if len(plan) == len(old) == 1 and plan[0][0] == old[0][0]:
                self.plans[job_id] = plan  # within a node: its agent does it
                self._call(plan[0][0], "restart", job_id, plan[0][1])
            else:
                self._move(job_id, plan)

    def kill(self, job_id: str) -> None:
        with self._job(job_id):
            self._stop(job_id, "kill")

    def park(self, job_id: str) -> None:
        with self._job(job_id):
            self._stop(job_id, "park")

    def checkpoint_dir(self, job_id: str) -> Path:
        """The head's replicas of the job's checkpoints (each node's reaches it)."""
        return self.replicas / job_id

    def read_log(self, job_id: str, rank: int = 0, offset: int = 0, size: int = -1) -> bytes:
        """One rank's log from ``offset`` (all of the rest, or at most ``size`` bytes),
        across its restarts and the nodes it ran on: the head's copy, then what the rank
        wrote since the last poll, if its node is up."""
        node, path, copied, have = self._log_parts(job_id, rank)
        out = b""
        if offset < copied:
            with open(path, "rb") as f:
                f.seek(offset)
                out = f.read(copied - offset if size < 0 else min(size, copied - offset))
        if node is None or 0 <= size <= len(out):
            return out
        more = -1 if size < 0 else size - len(out)
        return out + (self._call(node, "read_log", job_id, rank,
                                 have + max(0, offset - copied), more) or b"")

    def log_size(self, job_id: str, rank: int = 0) -> int:
        node, _, copied, have = self._log_parts(job_id, rank)
        on_node = self._call(node, "log_size", job_id, rank) if node is not None else None
        return copied + max(0, (on_node or have) - have)

    def _log_parts(self, job_id: str, rank: int) -> tuple[int | None, Path, int, int]:
        """The up node the rank runs on (None: none), the head's copy of its log, how long
        the copy is, and how much of the node's log the copy holds."""
        where = _rank_nodes(self.plans.get(job_id, [])) if job_id in self.jobs else []
        node = where[rank] if rank < len(where) and self.alive[where[rank]] else None
        path = self._log(job_id, rank)
        with self._copying:  # the copy, and how much of the node's log it holds, together
            copied = path.stat().st_size if path.exists() else 0
            have = self.copied.get((node, job_id, rank), 0) if node is not None else 0
        return node, path, copied, have

    def close(self) -> None:
        self._closed = True
        for i, actor in enumerate(self.actors):
            try:  # a node that went away may not be known to be gone yet
                ray.get(actor.close.remote(), timeout=30)
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - Ray raises plain Exception for a lost actor
                self.alive[i] = False
        for t in self._threads:
            t.join(timeout=5)

    # ---- inside -------------------------------------------------------------------------
    def _add(self, n: dict[str, Any]) -> int:
        """Start an agent on Ray node ``n``, claiming all its GPUs; its devices are numbered
        after every device before (a node's id here, like its devices', is never reused)."""
        gpus = int(n["Resources"]["GPU"])
        self.seen.add(n["NodeID"])
        actor = NodeAgent.options(
            num_gpus=gpus, name=f"gandiva-agent-{n['NodeID'][:12]}",
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote(str(self.workdir / f"node-{n['NodeID'][:12]}"),
                 self.users_dir and str(self.users_dir), gpus, *self._agent_args)
        try:
            info = ray.get(actor.info.remote(), timeout=AGENT_START_S)
        except ray.exceptions.RayError:
            ray.kill(actor)
            raise
        node = len(self.actors)
        for local, name in enumerate(info["devices"]):
            self.devices.append(f"n{node}/{name}")
            self.where.append((node, local))
        self.infos.append(info)
        self.alive.append(True)
        self.actors.append(actor)  # last: the node is complete when it has an agent
        return node

    def _watch(self) -> None:
        """Give nodes that join Ray an agent, and report them (``node-joined``)."""
        while not self._closed:
            time.sleep(JOIN_POLL_S)
            for n in _gpu_nodes():
                if n["NodeID"] in self.seen or self._closed:
                    continue
                try:
                    node = self._add(n)
                except ray.exceptions.RayError as err:
                    print(f"gandiva: no agent on joining Ray node {n['NodeID']}: {err}",
                          file=sys.stderr, flush=True)
                    continue
                self._pump_node(node)
                info = self.infos[node]
                self.events.put(AgentEvent("node-joined", "", {
                    "node": node, "gpus": len(info["devices"]), "kind": info["kind"],
                    "memory_gb": info["memory_gb"]}))

    def _pump_node(self, node: int) -> None:
        t = threading.Thread(target=self._pump, args=(node,), daemon=True,
                             name=f"gandiva-ray-node{node}")
        self._threads.append(t)
        t.start()

    def _job(self, job_id: str) -> threading.RLock:
        """The lock that keeps the job's actions one at a time (reentrant: a start that fails
        restarts the gang under it)."""
        with self._lock:
            return self._acting.setdefault(job_id, threading.RLock())

    def _plan(self, devices: tuple[int, ...]) -> list[tuple[int, tuple[int, ...]]]:
        """The job's parts: (node, its devices there), nodes in the order they come."""
        parts: dict[int, list[int]] = {}
        for d in devices:
            node, local = self.where[d]
            parts.setdefault(node, []).append(local)
        return [(node, tuple(local)) for node, local in parts.items()]

    def _cpu(self, plan: list[tuple[int, tuple[int, ...]]]) -> bool:
        return all(self.infos[n]["devices"][0].startswith("cpu") for n, _ in plan)

    def _launch(self, job_id: str, plan: list[tuple[int, tuple[int, ...]]],
                ckpt: Any = None) -> None:
        """Start the job's parts at once, each node with the job's newest checkpoint:
        ``ckpt`` (a reference to it), or else the holder's or the spare's (from node to
        node), or the head's replica."""
        holder = self.holder.get(job_id)
        has = holder if holder is not None and self.alive[holder] else None
        if ckpt is None and holder is not None and any(n != has for n, _ in plan):
            source, spare = has, self.spare.get(job_id)
            if source is None and spare is not None and self.alive[spare]:
                source = spare
            ckpt = (self.actors[source].newest.remote(job_id) if source is not None
                    else self._replica(job_id))
        gang, first = None, 0
        world = sum(len(local) for _, local in plan)
        run = self.runs[job_id] = self.runs.get(job_id, 0) + 1
        if len(plan) > 1:
            master = plan[0][0]
            gang = (self.infos[master]["ip"], self._call(master, "rendezvous", job_id), run)
        self._drain(job_id)
        calls = []
        for index, (node, local) in enumerate(plan):
            part = Gang(first, world, *gang, node=index, nodes=len(plan)) if gang else None
            calls.append(self.actors[node].start.remote(
                job_id, self.launches[job_id], local, None if node == has else ckpt, part))
            first += len(local)
        with self._lock:
            self.jobs[job_id] = tuple(n for n, _ in plan)
            self.plans[job_id] = plan
            self.left[job_id] = set(self.jobs[job_id])
        error = self._wait(calls)
        if error is not None:  # e.g. the node it moved from died before handing it over
            self._crashed(job_id, run, f"it could not start: {error}")
            return
        self.holder[job_id] = plan[0][0]

    def _move(self, job_id: str, plan: list[tuple[int, tuple[int, ...]]]) -> None:
        """Checkpoint the job at its next boundary, stop every part, and start it on
        ``plan``: rank 0's node gives the checkpoint to the others straight (the head
        passes only a reference)."""
        with self._lock:
            nodes = self.jobs.pop(job_id)
        ckpt = self.actors[nodes[0]].hand_over.remote(job_id)
        self._wait([self.actors[n].park.remote(job_id) for n in nodes[1:]] + [ckpt],
                   fetch=False)
        self.holder[job_id] = self.spare[job_id] = nodes[0]
        self._launch(job_id, plan, ckpt)

    def _on_each(self, nodes, method: str, job_id: str) -> Exception | None:
        """Call ``method(job_id)`` on the agents of ``nodes`` at once, and wait for them."""
        return self._wait([getattr(self.actors[n], method).remote(job_id) for n in nodes])

    def _stop(self, job_id: str, how: str) -> None:
        with self._lock:
            nodes = self.jobs.pop(job_id, ())
            self.ended.add(job_id)
        self._on_each(nodes, how, job_id)

    def _call(self, node: int, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self.actors[node], method).remote(*args))
        except ray.exceptions.RayActorError:
            return None  # the node is gone: its pump reports it

    def _wait(self, refs: list, fetch: bool = True) -> Exception | None:
        """Wait for calls made at once on several nodes; the first error, but for lost
        nodes (their pumps report those)."""
        if not fetch:
            ray.wait(refs, num_returns=len(refs), fetch_local=False)
            return None
        error = None
        for ref in refs:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass
            except ray.exceptions.RayError as err:
                print(f"gandiva: a node agent failed: {err}", file=sys.stderr, flush=True)
                error = error or err
        return error

    def _log(self, job_id: str, rank: int) -> Path:
        return self.logs / job_id / f"rank{rank}.log"

    def _keep_output(self, node: int, job_id: str, rank: int, offset: int,
                     data: bytes) -> None:
        """Append the bytes from ``offset`` of a rank's log on ``node`` to the head's copy,
        but for those it holds already (a drain may have brought them first)."""
        with self._copying:
            have = self.copied.get((node, job_id, rank), 0)
            new = data[max(0, have - offset):]
            if not new:
                return
            path = self._log(job_id, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as f:
                f.write(new)
            self.copied[node, job_id, rank] = offset + len(data)

    def _drain(self, job_id: str) -> None:
        """Copy the rest of the output of the job's last run before it starts again, so
        that its log reads in order (a pump might bring it after the new run's first
        lines)."""
        parts = [(node, rank, self.copied.get((node, job_id, rank), 0))
                 for rank, node in enumerate(_rank_nodes(self.plans.get(job_id, [])))
                 if self.alive[node]]
        calls = [self.actors[node].read_log.remote(job_id, rank, offset)
                 for node, rank, offset in parts]
        for (node, rank, offset), call in zip(parts, calls, strict=True):
            try:
                self._keep_output(node, job_id, rank, offset, ray.get(call))
            except ray.exceptions.RayError:
                pass  # the node is gone: its pump reports it

    def _replica(self, job_id: str) -> tuple[int, bytes, str] | None:
        return checkpoint.newest_file(self.replicas / job_id)

    def _part_ended(self, node: int, kind: str, job_id: str, data: dict) -> None:
        """A part finished, failed or crashed. The job is done when all its parts are; a
        failure ends the whole gang; a crash restarts it (see ``_crashed``)."""
        with self._lock:
            if node not in self.jobs.get(job_id, ()) or (
                    len(self.jobs[job_id]) > 1 and data.get("run") != self.runs[job_id]):
                return  # a part of an earlier run, already stopped
            self.left[job_id].discard(node)
            if kind == "done" and self.left[job_id]:
                return
            others = list(self.left[job_id])
            if kind != "crashed":
                del self.jobs[job_id]
                self.ended.add(job_id)
        if kind == "crashed":
            self._crashed(job_id, data["run"], data["reason"])
            return
        self._on_each(others, "kill", job_id)
        self.events.put(AgentEvent(kind, job_id, data))

    def _crashed(self, job_id: str, run: int, reason: str) -> None:
        """A rank of a gang over several nodes died unasked, or a part could not start:
        stop every part and start the job again from its newest checkpoint, up to
        ``max_restarts`` times."""
        with self._job(job_id):
            if job_id not in self.jobs or self.runs[job_id] != run:
                return  # the loop stopped or moved it meanwhile
            plan = self.plans[job_id]
            if not all(self.alive[n] for n, _ in plan):
                return  # a lost node: its pump stops the job and requeues it
            self._stop(job_id, "kill")
            tries = self.restarts.get(job_id, 0)
            if tries >= self.max_restarts:
                self.events.put(AgentEvent("failed", job_id, {
                    "reason": f"{reason} (after {tries} restarts)"}))
                return
            self.restarts[job_id] = tries + 1
            self.events.put(AgentEvent("restarted", job_id,
                                       {"reason": reason, "attempt": tries + 2}))
            self.ended.discard(job_id)
            self._launch(job_id, plan)

    def _lost(self, node: int) -> None:
        """Node ``node`` is gone: its jobs go back to placement, and the parts of its gangs
        on other nodes stop (they cannot go on without it)."""
        self.alive[node] = False
        with self._lock:
            running = [j for j, nodes in self.jobs.items() if node in nodes]
        lost = []
        for j in running:
            with self._job(j):
                with self._lock:
                    if node not in self.jobs.get(j, ()):
                        continue  # the loop stopped or moved it meanwhile
                self._stop(j, "kill")
                self.ended.discard(j)
                lost.append(j)
        self.events.put(AgentEvent("node-lost", "", {"node": node, "jobs": lost}))

    def _pump(self, node: int) -> None:
        """Carry node ``node``'s events to the loop; keep its checkpoints and output; notice
        its end."""
        actor = self.actors[node]
        while not self._closed:
            try:
                batch = ray.get(actor.next_events.remote(POLL_S), timeout=POLL_S + self.silent_s)
            except ray.exceptions.GetTimeoutError:
                if self._closed:
                    return
                # alive but silent (stopped, hung, its machine thrashing): Ray would never
                # call it lost. Killed, its jobs' channels close and they end, so no second
                # copy of a job trains on beside the one the scheduler starts elsewhere.
                print(f"gandiva: node {node}'s agent answered nothing for {self.silent_s:g} "
                      "s; it is ended and its jobs go back to placement", file=sys.stderr,
                      flush=True)
                ray.kill(actor)
                self._lost(node)
                return
            except ray.exceptions.RayError:
                if not self._closed:
                    self._lost(node)
                return
            for kind, job_id, data in batch:
                if kind == "log":
                    self._keep_output(node, job_id, data["rank"], data["offset"], data["data"])
                elif kind == "checkpoint":
                    checkpoint.install(self.replicas / job_id, data["step"], data["data"],
                                       data["digest"])
                    if self.holder.get(job_id) == node:
                        self.spare.pop(job_id, None)  # the replica is newer now
                elif kind in ("done", "failed", "crashed"):
                    self._part_ended(node, kind, job_id, data)
                else:
                    self.events.put(AgentEvent(kind, job_id, data))


def _token_if_kept() -> None:
    """Use Ray's token where Ray keeps it (``~/.ray/auth_token``, or ``RAY_AUTH_TOKEN[_PATH]``)
    unless ``RAY_AUTH_MODE`` says otherwise: Ray does so only for ``address="auto"``, and a
    server given a cluster's address would otherwise be refused by it."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _token_auth() -> bool:
    """Whether this process (a node agent: its raylet's environment) requires Ray's token."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError:  # a Ray without token authentication
        return False
    return bool(get_authentication_mode() == AuthenticationMode.TOKEN)


def _gpu_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]


def _rank_nodes(plan: list[tuple[int, tuple[int, ...]]]) -> list[int]:
    """The node of each rank of a job: ranks go node by node, in the plan's order."""
    return [node for node, local in plan for _ in local]


def _shape(plan: list[tuple[int, tuple[int, ...]]]) -> list[tuple[int, int]]:
    return [(node, len(local)) for node, local in plan]
