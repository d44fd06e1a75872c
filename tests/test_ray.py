"""The ray backend on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``: one head
and three worker nodes of two GPUs each, CPU slots standing in for the GPUs), started once
for this file."""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
# Ray's token authentication on, as gandiva wants it where node agents run as root (the
# cluster and this driver take the token from the environment)
os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                   "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)})
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from serving import passable  # noqa: E402
from test_runtime import EXAMPLES, SMALL, assert_identical, reference  # noqa: E402
from waiting import until  # noqa: E402

from gandiva import actions as A  # noqa: E402
from gandiva.backends.driver import Driver  # noqa: E402
from gandiva.backends.ray import RayNodes  # noqa: E402
from gandiva.job import checkpoint  # noqa: E402
from gandiva.node import accounts  # noqa: E402
from gandiva.node.agent import Launch  # noqa: E402
from gandiva.policies import make_policy  # noqa: E402
from gandiva.spec import JobSpec  # noqa: E402

# one cluster for the file, on one worker: it takes the whole machine
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("ray")]


# A job that must still run when the test acts on it runs long enough for that on a loaded
# machine; the tests that prove a bit-identical end share two such jobs, so each reference
# run (an uninterrupted run, alone) is made once: the cnn small (--width 4 --batch 8: 1,500
# steps, each followed by an 8 ms wait when it runs under gandiva: ~14 s, ~2 s of CPU, so
# that it outlasts a silent node's 5 s and its detection; its reference does not wait), the
# MLP gang's shards small (a 4-rank gang: ~6 s)
CNN = ("--steps", "1500", "--seed", "7", *SMALL)
PACE = ("--pace-ms", "8")
MLP = ("--steps", "500", "--seed", "4", "--shard-size", "4")


@pytest.fixture(scope="module")
def cluster():
    # nothing runs on the head (no CPU: no idle workers started there), nor needs the
    # autoscaler's monitor or a log monitor (the driver reads no worker's output); a worker
    # node's one CPU starts the one worker process its agent takes
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "num_gpus": 0, "no_monitor": True, "include_log_monitor": False})
    for _ in range(3):
        c.add_node(num_cpus=1, num_gpus=2)
    ray.init(address=c.address, logging_level="warning", log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """``reference(script, *args)`` run once for the module."""
    made: dict[tuple[str, ...], dict] = {}

    def get(script: str, *args: str) -> dict:
        if (script, *args) not in made:
            made[script, *args] = reference(tmp_path_factory.mktemp("ref"), script, *args)
        return made[script, *args]
    return get


def warm(nodes: RayNodes) -> RayNodes:
    """Until every node's zygote has imported torch: none of the test's jobs starts cold
    (~2.5 s of CPU each, on a machine of two cores)."""
    for actor in nodes.actors:
        until(lambda a=actor: ray.get(a.warm_ready.remote()), what="a node's warm zygote",
              every=0.1)
    return nodes


@pytest.fixture(scope="module")
def pool(cluster):
    """The module's shared ``RayNodes``, while one is open (at most one: its agents claim
    every GPU)."""
    held: dict[str, RayNodes] = {}
    yield held
    if "nodes" in held:
        held.pop("nodes").close()


class _Fresh(queue.Queue):
    """A test's events from the shared nodes: none of an earlier test's jobs (a killed
    job's last profile may come after its test)."""

    def __init__(self, earlier: set[str]) -> None:
        super().__init__()
        self.earlier = earlier

    def put(self, item, block=True, timeout=None) -> None:
        if item.job_id not in self.earlier:
            super().put(item, block, timeout)


class _Lent:
    """The shared nodes as a test's own: a driver's ``close`` at the end of its run leaves
    them open for the next test."""

    def __init__(self, nodes: RayNodes) -> None:
        self._nodes = nodes

    def __getattr__(self, name: str):
        return getattr(self._nodes, name)

    def close(self) -> None:
        pass


@pytest.fixture
def nodes(pool, tmp_path_factory):
    """For a test that stops no node and no agent: the module's ``RayNodes`` (started, and
    its zygotes warm, once), its events from this test's jobs only; the test's jobs still
    running after it are killed."""
    if "nodes" not in pool:
        pool["nodes"] = warm(RayNodes(tmp_path_factory.mktemp("ray") / "head",
                                      checkpoint_every_s=0.5,
                                      users=tmp_path_factory.mktemp("home") / "users"))
    n = pool["nodes"]
    n.events = _Fresh(set(n.launches))
    yield _Lent(n)
    for job_id in list(n.jobs):
        n.kill(job_id)


@pytest.fixture
def own_nodes(pool, tmp_path):
    """``make(**options)``: a test's own ``RayNodes`` (for a test that loses, stops or adds
    a node), its zygotes warm; the shared one is closed first."""
    made: list[RayNodes] = []

    def make(**options) -> RayNodes:
        if "nodes" in pool:
            pool.pop("nodes").close()
        made.append(RayNodes(tmp_path / "head", **{"checkpoint_every_s": 0.5, **options}))
        return warm(made[-1])
    yield make
    for n in made:
        n.close()


def cnn(*args: str) -> Launch:
    return Launch(["{python}", str(EXAMPLES / "cnn.py"), *args])


def node_checkpoints(nodes: RayNodes, node: int, job_id: str) -> Path:
    return (nodes.workdir / f"node-{nodes.infos[node]['node_id'][:12]}" / "jobs" / job_id
            / "checkpoints")


def wait(condition, timeout: float = 120.0, what: str = "") -> None:
    until(condition, timeout, what)


def test_agents_claim_every_gpu_and_placement_follows_the_policy(nodes):
    assert len(nodes.devices) == 6 and len({i["node_id"] for i in nodes.infos}) == 3
    assert ray.available_resources().get("GPU", 0) == 0  # claimed: Ray hands out none
    backend = Driver(make_policy("fifo"), nodes.workdir, nodes=nodes, feedback_steps=20)
    for i in range(3):  # fifo keeps each gang on one server: one per node
        backend.submit(JobSpec(f"g{i}", 0.0, 2, "unknown"),
                       Launch(["{python}", str(EXAMPLES / "elastic_mlp.py"), "--steps", "100"]))
    backend.submit(JobSpec("late", 1.0, 1, "unknown"),
                   cnn("--steps", "100", *SMALL))
    result = backend.run(timeout=300)
    assert all(r.status == "done" for r in result.jobs), [(r.spec.id, r.reason)
                                                          for r in result.jobs]
    placed = {r.spec.id: {nodes.where[d][0] for d in r.devices} for r in result.jobs}
    assert [len(placed[f"g{i}"]) for i in range(3)] == [1, 1, 1]  # never split
    assert {n for i in range(3) for n in placed[f"g{i}"]} == {0, 1, 2}
    node = placed["late"].pop()
    log = node_checkpoints(nodes, node, "late").parent / "rank0.log"  # where it ran
    assert "done: 100 steps" in log.read_text()


def test_a_job_migrated_to_another_node_ends_bit_identical(nodes, references):
    ref = references("cnn.py", *CNN)
    nodes.start("m", cnn(*CNN, *PACE), (0,))  # node 0
    wait(lambda: checkpoint.steps(node_checkpoints(nodes, 0, "m")), what="a checkpoint")
    nodes.restart("m", (3,))  # device 3 is on node 1: checkpoint, object store, restore
    assert nodes.jobs["m"] == (1,)
    ev = nodes.events.get(timeout=180)
    while ev.kind in ("profile", "started"):
        ev = nodes.events.get(timeout=180)
    assert (ev.kind, ev.job_id) == ("done", "m"), ev
    log = nodes.read_log("m").decode()
    assert "restored from checkpoint at step" in log  # it did not start over
    assert_identical(checkpoint.latest(node_checkpoints(nodes, 1, "m"))[1], ref)


SLOW_STEPS = """
import time
import gandiva.job as gj
job = gj.init()
for step in job.steps(1000):
    time.sleep(8 if step else 0.3)  # the first reported at once (after 0.25 s), then slow
    job.report(samples=1)
"""


def test_actions_on_different_jobs_go_on_at_once(nodes, tmp_path):
    """A suspend waits for the job's next mini-batch boundary (here up to 8 s away); an
    action on another job, on another node, does not wait behind it."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_STEPS)
    nodes.start("slow", Launch(["{python}", str(script)]), (0,))  # node 0
    wait(lambda: any(e.kind == "profile" and e.job_id == "slow"
                     for e in [nodes.events.get(timeout=120)]), what="the slow job's steps")
    ended: dict[str, float] = {}

    def suspend() -> None:
        nodes.suspend("slow")
        ended["suspend"] = time.monotonic()

    t = threading.Thread(target=suspend)
    t.start()
    # no event says that a suspend is under way on its node: half a second puts it there,
    # well inside the up to 8 s it waits for the boundary (a wait is what is tested)
    time.sleep(0.5)
    nodes.start("quick", cnn("--steps", "10", *SMALL), (2,))  # device 2 is on node 1
    ended["start"] = time.monotonic()
    t.join(timeout=60)
    assert ended["start"] < ended["suspend"], ended  # the start did not queue behind it
    nodes.kill("slow")
    nodes.kill("quick")


def test_a_gang_over_two_nodes_trains_and_is_time_sliced(nodes, references):
    """Two 4-rank gangs on three 2-device nodes: each spans two nodes (torchrun rendezvous
    across them), and they take turns; both end bit-identical to an uninterrupted run."""
    ref = references("elastic_mlp.py", *MLP)  # about 6 s each: several turns of 2 s
    backend = Driver(make_policy("slicer:quantum=2"), nodes.workdir, nodes=nodes,
                     feedback_steps=20)
    for name in ("a", "b"):
        backend.submit(JobSpec(name, 0.0, 4, "unknown"),
                       Launch(["{python}", str(EXAMPLES / "elastic_mlp.py"), *MLP]))
    result = backend.run(timeout=400)
    recs = {r.spec.id: r for r in result.jobs}
    assert all(r.status == "done" and r.restarts == 0 for r in recs.values()), [
        (r.spec.id, r.status, r.reason) for r in recs.values()]
    for name in ("a", "b"):
        suspends = [a for _, a, _ in result.actions
                    if isinstance(a, A.Suspend) and a.job_id == name]
        assert suspends, f"{name} was never time-sliced"
        spans = {nodes.where[d][0] for d in recs[name].devices}
        assert len(spans) == 2, f"{name} ran on {spans}"
        last = nodes.holder[name]  # rank 0's node wrote the final checkpoint
        assert_identical(checkpoint.latest(node_checkpoints(nodes, last, name))[1], ref)
        other = nodes.plans[name][1][0]  # ranks 2 and 3 ran on the other node
        log = (node_checkpoints(nodes, other, name).parent / "rank3.log").read_text()
        assert f"done: {MLP[1]} steps on 4 rank(s)" in log


def test_a_crashed_rank_restarts_its_whole_gang_and_the_gang_moves_as_one(nodes, references):
    ref = references("elastic_mlp.py", *MLP)
    nodes.start("g", Launch(["{python}", str(EXAMPLES / "elastic_mlp.py"), *MLP]), (0, 1, 2, 3))
    assert nodes.jobs["g"] == (0, 1)
    wait(lambda: checkpoint.steps(node_checkpoints(nodes, 0, "g")), what="a checkpoint")
    pids = node_checkpoints(nodes, 1, "g").parent / "pids"  # ranks 2 and 3, on node 1
    os.kill(int(pids.read_text().split()[0]), signal.SIGKILL)
    seen = [nodes.events.get(timeout=180)]
    while seen[-1].kind != "restarted":
        seen.append(nodes.events.get(timeout=180))
    assert "killed by signal 9" in seen[-1].data["reason"]
    while seen[-1].kind != "profile":  # training again, from the checkpoint
        seen.append(nodes.events.get(timeout=180))
    log = (node_checkpoints(nodes, 0, "g").parent / "rank0.log").read_text()
    assert log.count("--- gandiva: start on") == 2 and "restored from checkpoint" in log
    nodes.restart("g", (2, 3, 4, 5))  # the whole gang moves: from nodes 0 and 1 to 1 and 2
    assert nodes.jobs["g"] == (1, 2)
    while seen[-1].kind not in ("done", "failed"):
        seen.append(nodes.events.get(timeout=180))
    ends = [e for e in seen if e.kind not in ("profile", "started")]
    assert [e.kind for e in ends] == ["restarted", "done"], ends
    moved = (node_checkpoints(nodes, 2, "g").parent / "rank2.log").read_text()
    assert "restored from checkpoint" in moved  # a node it never ran on, from rank 0's file
    assert_identical(checkpoint.latest(node_checkpoints(nodes, 1, "g"))[1], ref)


# A job that says who it runs as, what of Ray's environment it has, and whether it can read
# its node agent's (which holds the cluster's token)
OWN = """\
import json, os, time
import torch
import gandiva.job as gj

status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
try:
    open(f"/proc/{os.environ['AGENT']}/environ").read()
    token = "read"
except OSError as e:
    token = type(e).__name__
print("AS", json.dumps({"uid": status["Uid"].split(), "token": token,
                        "ray": sorted(k for k in os.environ if k.startswith("RAY_"))}),
      flush=True)
job = gj.init()
job.register(model=torch.nn.Linear(2, 2))
for step in job.steps(400):
    time.sleep(0.02)
"""


def test_a_root_cluster_runs_each_job_as_its_account_and_moves_it_with_its_checkpoints(
        nodes, root):
    """Node agents run as root (as their raylets) with Ray's token authentication on: a job
    runs as its user's account, has nothing of Ray's, cannot read the token; moved to
    another node, it resumes from checkpoints that are its account's there too. A job
    whose account that node lacks fails, naming it."""
    assert nodes.root and nodes.token_auth
    uid = accounts.DYNAMIC_UIDS[-7]
    base = nodes.users_dir / "ada"
    account = accounts.dynamic(uid, str(base))
    nodes.settle("ada", base, account)
    for place in (base, nodes.workdir):  # (pytest's directories above them are 0700)
        passable(place)
    (base / "own.py").write_text(OWN)
    own = Launch(["{python}", "own.py"], cwd=base, account=account, env={
        "AGENT": str(nodes.infos[0]["pid"])})
    nodes.start("own", own, (0,))
    wait(lambda: checkpoint.steps(node_checkpoints(nodes, 0, "own")), what="a checkpoint")
    nodes.restart("own", (3,))  # to node 1
    ev = nodes.events.get(timeout=180)
    while ev.kind in ("profile", "started"):
        ev = nodes.events.get(timeout=180)
    assert (ev.kind, ev.job_id) == ("done", "own"), ev
    log = nodes.read_log("own").decode()
    said = [json.loads(line[3:]) for line in log.splitlines() if line.startswith("AS ")]
    assert said and all(s == {"uid": [str(uid)] * 4, "token": "PermissionError", "ray": []}
                        for s in said), log
    assert "restored from checkpoint at step" in log
    moved = node_checkpoints(nodes, 1, "own")
    assert {p.stat().st_uid for p in moved.iterdir()} == {uid}  # installed, then its own
    missing = accounts.Account(uid - 1, uid - 1, name="gandiva-no-such-account")
    nodes.start("lost", Launch(["{python}", "own.py"], cwd=base, account=missing), (0,))
    ev = nodes.events.get(timeout=60)
    assert (ev.kind, ev.job_id) == ("failed", "lost"), ev
    assert "'gandiva-no-such-account' does not exist on this node" in ev.data["reason"]


def test_a_move_whose_destination_cannot_take_it_fails_with_the_reason(nodes):
    nodes.start("x", cnn("--steps", "100000", *SMALL), (0,))
    wait(lambda: checkpoint.steps(node_checkpoints(nodes, 0, "x")), what="a checkpoint")
    blocked = node_checkpoints(nodes, 1, "x")
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where the checkpoint directory goes")
    nodes.restart("x", (2,))  # device 2 is node 1's: the install fails there, every time
    seen = []
    while not seen or seen[-1].kind not in ("done", "failed"):
        seen.append(nodes.events.get(timeout=120))
    ends = [e for e in seen if e.kind not in ("profile", "started")]
    assert [e.kind for e in ends] == ["restarted"] * 3 + ["failed"], ends
    assert "could not start" in ends[-1].data["reason"]
    assert "x" not in nodes.jobs


@pytest.mark.slow  # a node lost or added: CI runs it after the suite
def test_a_lost_node_s_jobs_finish_elsewhere_from_their_checkpoints(own_nodes, cluster,
                                                                    references):
    nodes = own_nodes()
    ref = references("cnn.py", *CNN)
    backend = Driver(make_policy("fifo"), nodes.workdir, nodes=nodes, feedback_steps=20)
    # fifo fills node 0 with the 2-device bystander, and puts the victim on node 1
    backend.submit(JobSpec("bystander", 0.0, 2, "unknown"),
                   Launch(["{python}", str(EXAMPLES / "elastic_mlp.py"), "--steps", "800"]))
    backend.submit(JobSpec("victim", 0.0, 1, "unknown"), cnn(*CNN, *PACE))
    out = {}
    loop = threading.Thread(target=lambda: out.update(result=backend.run(timeout=400)))
    loop.start()
    replicas = nodes.workdir / "replicas" / "victim"
    wait(lambda: "victim" in nodes.jobs and checkpoint.steps(replicas), what="a replica")
    (lost,) = nodes.jobs["victim"]
    assert nodes.jobs["bystander"] != (lost,)
    cluster.remove_node(next(n for n in cluster.list_all_nodes()
                             if n.node_id == nodes.infos[lost]["node_id"]))
    loop.join(timeout=450)
    recs = {r.spec.id: r for r in out["result"].jobs}
    assert recs["victim"].status == "done" and recs["victim"].restarts == 1
    assert recs["bystander"].status == "done" and recs["bystander"].restarts == 0  # undisturbed
    now = nodes.where[recs["victim"].devices[0]][0]
    assert now != lost
    assert "restored from checkpoint at step" in (
        node_checkpoints(nodes, now, "victim").parent / "rank0.log").read_text()
    assert_identical(checkpoint.latest(node_checkpoints(nodes, now, "victim"))[1], ref)


@pytest.mark.slow  # a node lost or added: CI runs it after the suite
def test_a_silent_agent_s_node_is_lost_its_job_ended_there_and_finished_elsewhere(
        own_nodes, references):
    """A node agent stopped (SIGSTOP: its process and connections stay, it answers nothing)
    is given ``silent_s``, then ended: its job's process there ends with it (no second copy
    trains on), and the job finishes on another node from its checkpoint, bit-identical."""
    nodes = own_nodes(silent_s=5.0)
    ref = references("cnn.py", *CNN)
    backend = Driver(make_policy("fifo"), nodes.workdir, nodes=nodes, feedback_steps=20)
    backend.submit(JobSpec("victim", 0.0, 1, "unknown"), cnn(*CNN, *PACE))
    out = {}
    loop = threading.Thread(target=lambda: out.update(result=backend.run(timeout=400)))
    loop.start()
    wait(lambda: "victim" in nodes.jobs
         and checkpoint.steps(nodes.workdir / "replicas" / "victim"), what="a replica")
    (silent,) = nodes.jobs["victim"]
    pids = node_checkpoints(nodes, silent, "victim").parent / "pids"
    job_pid = int(pids.read_text().split()[0])
    agent_pid = nodes.infos[silent]["pid"]
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        wait(lambda: not nodes.alive[silent], timeout=60, what="the silent node lost")
        wait(lambda: not _running(job_pid), timeout=30, what="the job's old process gone")
    finally:
        try:
            os.kill(agent_pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # ended, as it should be
    loop.join(timeout=450)
    (rec,) = out["result"].jobs
    assert rec.status == "done" and rec.restarts == 1
    now = nodes.where[rec.devices[0]][0]
    assert now != silent
    assert_identical(checkpoint.latest(node_checkpoints(nodes, now, "victim"))[1], ref)


def _running(pid: int) -> bool:
    """Is ``pid`` a live process (not a zombie waiting to be reaped)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.slow  # a node lost or added: CI runs it after the suite
def test_the_logs_of_a_job_and_of_a_gang_s_rank_outlive_the_node_they_ran_on(own_nodes,
                                                                             cluster):
    """A job, and rank 1 of a gang over two nodes, finish on a node that then dies: both
    logs read through the backend (as the API reads them) whole, from the head's copy."""
    nodes = own_nodes()
    lost = len(nodes.infos) - 1
    there = [d for d, (node, _) in enumerate(nodes.where) if node == lost]
    nodes.start("solo", cnn("--steps", "100", *SMALL), (there[0],))
    nodes.start("gang", Launch(["{python}", str(EXAMPLES / "elastic_mlp.py"), "--steps", "100"]),
                (0, there[1]))  # rank 0 on node 0, rank 1 on the node that dies
    done: set[str] = set()
    while done != {"solo", "gang"}:
        ev = nodes.events.get(timeout=180)
        assert ev.kind not in ("failed", "restarted"), ev
        done |= {ev.job_id} if ev.kind == "done" else set()
    jobs = node_checkpoints(nodes, lost, "solo").parent.parent  # the lost node's own files
    written = {(job, rank): (jobs / job / f"rank{rank}.log").read_bytes()
               for job, rank in (("solo", 0), ("gang", 1))}
    assert b"done: 100 steps," in written["solo", 0]
    assert b"done: 100 steps on 2 rank(s)" in written["gang", 1]
    for (job, rank), log in written.items():  # read as logs?tail= and -f read: by size, in pieces
        assert nodes.log_size(job, rank) == len(log)
        assert nodes.read_log(job, rank, 10, 25) == log[10:35]
    cluster.remove_node(next(n for n in cluster.list_all_nodes()
                             if n.node_id == nodes.infos[lost]["node_id"]))
    wait(lambda: not nodes.alive[lost], what="the node's loss to be noticed")
    for (job, rank), log in written.items():
        assert nodes.read_log(job, rank) == log
        assert nodes.log_size(job, rank) == len(log)
        assert nodes.read_log(job, rank, len(log) - 30, 20) == log[-30:-10]
    assert nodes.read_log("solo", 0, offset=10) == written["solo", 0][10:]  # as logs -f reads


BUSY = """
import time
import gandiva.job as gj
job = gj.init()
for step in job.steps(100000):
    time.sleep(0.2)
    job.report(samples=1)
"""


@pytest.mark.slow  # a node lost or added: CI runs it after the suite
def test_a_node_that_joins_takes_queued_work(own_nodes, cluster, tmp_path):
    """Runs last: it adds a node to the module's cluster."""
    nodes = own_nodes()
    script = tmp_path / "busy.py"  # a gang that holds its devices, and sleeps: the CPUs are
    script.write_text(BUSY)        # the new node's start's
    backend = Driver(make_policy("fifo"), nodes.workdir, nodes=nodes, feedback_steps=20)
    before = len(nodes.infos)
    # a gang on every device there is, and a job queued behind it for want of devices
    backend.submit(JobSpec("big", 0.0, len(nodes.devices), "unknown"),
                   Launch(["{python}", str(script)]))
    backend.submit(JobSpec("late", 0.0, 2, "unknown"),
                   Launch(["{python}", str(EXAMPLES / "elastic_mlp.py"), "--steps", "100"]))
    out = {}
    loop = threading.Thread(target=lambda: out.update(result=backend.run(timeout=400)))
    loop.start()
    try:
        wait(lambda: backend.records["big"].status == "running", what="the big gang to start")
        wait(lambda: backend.explain("late")["reason"].startswith("waiting for 2 free device"),
             timeout=10, what="late to wait for devices")
        cluster.add_node(num_cpus=1, num_gpus=2)
        wait(lambda: backend.records["late"].status == "done", timeout=180,
             what="late to finish on the new node")
        assert len(nodes.infos) == len(backend.cluster.nodes) == before + 1
        assert {nodes.where[d][0] for d in backend.records["late"].devices} == {before}
        assert backend.records["big"].status == "running"  # undisturbed
        assert backend.view()["nodes"][-1]["up"]
        backend.cancel("big")
        loop.join(timeout=120)
        assert out["result"].jobs[0].status == "cancelled"
    finally:
        backend.stop()
        loop.join(timeout=120)
