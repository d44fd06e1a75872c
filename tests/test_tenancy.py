"""What one user's job can reach of the server and of other users: nothing of the server's
environment reaches a job, warm-forked or cold (the zygote starts with an allow-listed
environment, not the server's); each job has a TMPDIR of its own (removed when it ends); the
server's state is its account's alone (umask 077). On a root server each job runs as its
user's account (a mapped OS account, else a dynamic uid of the user's), and reaches nothing
of another user's, of the server's or of the agent's."""

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
from serving import running  # noqa: E402
from waiting import until  # noqa: E402

from gandiva.node.accounts import DYNAMIC_UIDS, SERVICE_UID, processes_allowed  # noqa: E402

SECRET = "hunter2-not-for-jobs"
# a job that writes down all it can see of environments: its own, as Python and as the
# kernel hold it, and its parent's: a warm job's parent is the zygote, a cold job's the
# server (which a job of another account than the parent's may not read at all)
SPY = """\
import os, tempfile
seen = [repr(dict(os.environ))]
for who, pid in (("self", "self"), ("parent", os.getppid())):
    try:
        seen.append(f"environ of {who}: " + open(f"/proc/{pid}/environ", "rb").read().decode())
    except PermissionError:
        seen.append(f"environ of {who}: refused")
print("TMPDIR", tempfile.gettempdir(), oct(os.stat(tempfile.gettempdir()).st_mode & 0o777))
print("\\n".join(seen))
"""


def test_nothing_of_the_servers_environment_reaches_a_warm_or_a_cold_job(tmp_path):
    home = tmp_path / "home"
    env = {"GANDIVA_DB_PASSWORD": SECRET, "GANDIVA_TOKEN": SECRET, "RAY_ADDRESS": SECRET,
           "AWS_SECRET_ACCESS_KEY": SECRET, "LC_ALL": "C.UTF-8"}
    with running(home, env=env) as srv:
        import httpx2

        (srv.user_dir("alice") / "spy.py").write_text(SPY)
        ids = {}
        with httpx2.Client(base_url=srv.url, timeout=10,
                           headers={"Authorization": f"Bearer {srv.tokens['alice']}"}) as http:
            # PYTHONHASHSEED acts at start-up: the same script starts cold
            for name, extra in (("warm", {}), ("cold", {"PYTHONHASHSEED": "0"})):
                ids[name] = http.post("/v1/jobs", json={
                    "name": name, "command": ["python", "spy.py"],
                    "env": {"MINE": "kept", **extra}}).raise_for_status().json()["id"]
            for job_id in ids.values():
                until(lambda job_id=job_id: http.get(f"/v1/jobs/{job_id}").json()["state"]
                      in ("done", "failed"), 120, f"{job_id} to end")
            logs = {name: http.get(f"/v1/jobs/{job_id}/logs", params={"tail": 100}).text
                    for name, job_id in ids.items()}
            states = {name: http.get(f"/v1/jobs/{job_id}").json()["state"]
                      for name, job_id in ids.items()}
    assert states == {"warm": "done", "cold": "done"}, logs
    assert "environ of parent" in logs["warm"]  # the zygote's
    tmpdirs = set()
    for name, log in logs.items():
        assert SECRET not in log, (name, log)
        assert "'MINE': 'kept'" in log  # its own
        assert "'LC_ALL': 'C.UTF-8'" in log  # the node's locale
        tmpdir, mode = next(line.split()[1:] for line in log.splitlines()
                            if line.startswith("TMPDIR"))
        tmpdirs.add(tmpdir)
        assert Path(tmpdir).parent == Path(tempfile.gettempdir()) and mode == "0o700"
        assert not Path(tmpdir).exists()  # removed as the job ended
    assert len(tmpdirs) == 2  # each its own
    # the server's state: its account's alone
    assert stat.S_IMODE((home / "gandiva.db").stat().st_mode) == 0o600
    for job_id in ids.values():  # (a root server's jobs may pass through theirs)
        job_dir = home / "run" / "jobs" / job_id
        assert stat.S_IMODE(job_dir.stat().st_mode) == (0o711 if os.geteuid() == 0 else 0o700)
        assert stat.S_IMODE((job_dir / "rank0.log").stat().st_mode) == 0o600


# ---- a root server: every job runs as its user's account ------------------------------------
# A job of the library that trains until its user's base directory has a file "stop": it
# keeps a private file there and a checkpoint of its own, and reports its pid and ids
KEEPER = """\
import json, os, time
import torch
import gandiva.job as gj

open("private.txt", "w").write("alice's own")
print("KEEPER", json.dumps({"pid": os.getpid(), "uid": os.getuid(),
                            "tmp": os.environ["TMPDIR"]}), flush=True)
job = gj.init()
job.register(model=torch.nn.Linear(2, 2))
for step in job.steps(1_000_000):
    if os.path.exists("stop"):
        job.save()
        break
    time.sleep(0.01)
"""
# What another user's job tries: each attempt's outcome ("reached" or the error it met), and
# what the kernel says of the job itself
SPY_ON = """\
import json, os, resource
aim = json.loads(os.environ["AIM"])
own = aim["jobs"] + "/" + os.environ["GANDIVA_JOB_ID"]  # its own job's directory, the agent's


def raise_limit():
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY,) * 2)
    except ValueError as e:  # (how Python says EPERM here)
        raise PermissionError(e)

tries = {
    "read their file": lambda: open(aim["base"] + "/private.txt").read(),
    "list their base": lambda: os.listdir(aim["base"]),
    "write in their base": lambda: open(aim["base"] + "/planted.txt", "w").write("x"),
    "list their job's directory": lambda: os.listdir(aim["job_dir"]),
    "read their job's log": lambda: open(aim["job_dir"] + "/rank0.log").read(),
    "list their checkpoints": lambda: os.listdir(aim["job_dir"] + "/checkpoints"),
    "read the database": lambda: open(aim["db"], "rb").read(1),
    "write the database": lambda: open(aim["db"], "ab"),
    "read the server's environment": lambda: open(f"/proc/{aim['server']}/environ").read(),
    "signal the server": lambda: os.kill(aim["server"], 0),  # (0: asks only whether it may)
    "signal the node daemon": lambda: os.kill(aim["daemon"], 0),
    "read the node daemon's environment": lambda: open(f"/proc/{aim['daemon']}/environ").read(),
    "signal their job": lambda: os.kill(aim["pid"], 0),
    "open their job's channel": lambda: os.listdir(f"/proc/{aim['pid']}/fd"),
    "enter their TMPDIR, where their ranks meet": lambda: os.listdir(aim["tmp"]),
    "replace its own log": lambda: os.symlink("/etc/shadow", own + "/rank9.log"),
    "replace its own pid file": lambda: os.replace(own + "/pids", own + "/pids.old"),
    "raise its process limit": raise_limit,
}
seen = {}
for name, attempt in tries.items():
    try:
        attempt()
        seen[name] = "reached"
    except OSError as e:
        seen[name] = type(e).__name__
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
seen["status"] = {k: status[k].split() for k in ("Uid", "Gid", "Groups", "CapPrm", "CapEff")}
seen["status"]["oom_score_adj"] = open("/proc/self/oom_score_adj").read().split()
seen["status"]["processes"] = list(resource.getrlimit(resource.RLIMIT_NPROC))
seen["secret in environment"] = any(aim["secret"] in v for k, v in os.environ.items()
                                    if k != "AIM")  # (where the test told it the secret)
print("SPY", json.dumps(seen), flush=True)
"""
REFUSED = ("PermissionError",)


def proc_status(pid: int) -> dict[str, list[str]]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.split() for k, _, v in (line.partition(":") for line in lines)}


def daemon_of(server: int) -> int:
    """The node daemon a root server started: its child running ``gandiva.node.daemon``."""
    for child in Path(f"/proc/{server}/task/{server}/children").read_text().split():
        if b"gandiva.node.daemon" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError(f"server {server} has no node daemon")


SELF = """\
import json, os
open("mine.txt", "w").write("mine")
try:
    open(os.environ["OTHERS"]).read()
    reached = True
except OSError:
    reached = False
print("SELF", json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                          "reached": reached}), flush=True)
"""


def test_a_root_server_runs_each_job_as_its_users_account_and_nothing_else_is_reached(
        tmp_path, os_accounts):
    """alice and bob are mapped to OS accounts, carol and dave have none (dynamic uids)."""
    import pwd

    import httpx2

    ada, bob = os_accounts("ada"), os_accounts("bob")
    home = tmp_path / "home"
    with running(home, users=("alice", "bob", "carol", "dave"), slots=3,
                 os_users={"alice": ada, "bob": bob},
                 env={"GANDIVA_DB_PASSWORD": SECRET}) as srv:
        def client(user):
            return httpx2.Client(base_url=srv.url, timeout=10,
                                 headers={"Authorization": f"Bearer {srv.tokens[user]}"})

        (srv.user_dir("alice") / "keeper.py").write_text(KEEPER)
        (srv.user_dir("bob") / "spy.py").write_text(SPY_ON)
        with client("alice") as alice:
            kept = alice.post("/v1/jobs", json={"name": "keeper", "command": [
                "python", "keeper.py"]}).raise_for_status().json()["id"]
            log = until(lambda: (text := alice.get(f"/v1/jobs/{kept}/logs").text)
                        and "KEEPER" in text and text, 120, "alice's job to run")
        keeper = json.loads(log.split("KEEPER ", 1)[1].splitlines()[0])
        server, daemon = proc_status(srv.proc.pid), proc_status(daemon_of(srv.proc.pid))
        oom = {name: Path(f"/proc/{pid}/oom_score_adj").read_text().strip() for name, pid in
               (("server", srv.proc.pid), ("daemon", daemon_of(srv.proc.pid)))}
        jobs = {}  # (user, what) -> job id
        with client("bob") as http:
            for how, env in (("warm", {}), ("cold", {"PYTHONHASHSEED": "0"})):
                jobs["bob", how] = http.post("/v1/jobs", json={
                    "name": f"spy-{how}", "command": ["python", "spy.py"], "env": {**env,
                    "AIM": json.dumps({
                        "base": str(srv.user_dir("alice")), "pid": keeper["pid"],
                        "tmp": keeper["tmp"],
                        "job_dir": str(home / "run" / "jobs" / kept),
                        "jobs": str(home / "run" / "jobs"),
                        "db": str(home / "gandiva.db"), "server": srv.proc.pid,
                        "daemon": daemon_of(srv.proc.pid),
                        "secret": SECRET})}}).raise_for_status().json()["id"]
        for user, other in (("carol", "dave"), ("dave", "carol")):
            (srv.user_dir(user) / "self.py").write_text(SELF)
            with client(user) as http:
                jobs[user, "self"] = http.post("/v1/jobs", json={  # (not an argument: a
                    "name": "self", "command": ["python", "self.py"],  # path outside)
                    "env": {"OTHERS": str(srv.user_dir(other) / "mine.txt")}}
                ).raise_for_status().json()["id"]
        logs = {}
        for (user, what), job_id in jobs.items():
            with client(user) as http:
                until(lambda job_id=job_id: http.get(f"/v1/jobs/{job_id}").json()["state"]
                      in ("done", "failed"), 120, f"{job_id} to end")
                logs[user, what] = http.get(f"/v1/jobs/{job_id}/logs").text
        (srv.user_dir("alice") / "stop").touch()
        with client("alice") as alice:
            until(lambda: alice.get(f"/v1/jobs/{kept}").json()["state"] in ("done", "failed"),
                  120, "alice's job to end")
            assert alice.get(f"/v1/jobs/{kept}").json()["state"] == "done"
    # privilege separation: the API, scheduler and store off root for good; the node daemon
    # (the agent) root
    assert server["Uid"] == [str(SERVICE_UID)] * 4 and server["Gid"] == [str(SERVICE_UID)] * 4
    assert server["CapEff"] == ["0000000000000000"] and server["Groups"] == []
    assert daemon["Uid"] == ["0"] * 4
    assert int(oom["server"]) <= 0 and int(oom["daemon"]) <= 0  # (-500 where it may)
    bob_entry = pwd.getpwnam(bob)
    for how in ("warm", "cold"):
        log = logs["bob", how]
        assert "SPY " in log, (how, log)
        spied = json.loads(log.split("SPY ", 1)[1].splitlines()[0])
        status = spied.pop("status")
        assert spied.pop("secret in environment") is False, how
        reached = {name: outcome for name, outcome in spied.items() if outcome not in REFUSED}
        assert not reached, (how, reached)
        assert status["Uid"] == [str(bob_entry.pw_uid)] * 4, (how, status)
        assert status["Gid"] == [str(bob_entry.pw_gid)] * 4, (how, status)
        assert status["Groups"] == [str(g) for g in os.getgrouplist(bob, bob_entry.pw_gid)]
        assert status["CapPrm"] == status["CapEff"] == ["0000000000000000"], (how, status)
        assert status["oom_score_adj"] == ["500"], (how, status)  # killed first
        assert status["processes"] == [processes_allowed()] * 2, (how, status)  # its account's
    ada_uid = pwd.getpwnam(ada).pw_uid
    assert keeper["uid"] == ada_uid
    assert (srv.user_dir("alice") / "private.txt").stat().st_uid == ada_uid
    assert not (srv.user_dir("alice") / "planted.txt").exists()
    checkpoints = home / "run" / "jobs" / kept / "checkpoints"
    assert {p.stat().st_uid for p in checkpoints.iterdir()} == {ada_uid}
    assert (home / "run" / "jobs" / kept / "rank0.log").stat().st_uid == 0  # the agent's
    # carol and dave: each a dynamic uid of their own (not root, not the server's, no
    # groups), and neither read the other's file, whichever wrote first
    said = {user: json.loads(logs[user, "self"].split("SELF ", 1)[1].splitlines()[0])
            for user in ("carol", "dave")}
    assert said["carol"]["uid"] != said["dave"]["uid"], said
    for user, it in said.items():
        assert it["uid"] in DYNAMIC_UIDS and it["gid"] == it["uid"], said
        assert it["groups"] == [] and not it["reached"], said
        assert (srv.user_dir(user) / "mine.txt").stat().st_uid == it["uid"]
        assert stat.S_IMODE(srv.user_dir(user).stat().st_mode) == 0o700


def test_a_mapped_account_this_machine_lacks_or_that_is_root_is_refused_naming_it(tmp_path):
    from fastapi import HTTPException

    from gandiva.server.store import Principal
    from gandiva.server.tenancy import ROOT, Tenancy

    tenancy = Tenancy(ROOT, "a root server")
    for os_user, said in (("gdv-nosuch", "does not exist on this machine"),
                          ("root", "gandiva runs no job as root")):
        with pytest.raises(HTTPException) as refused:
            tenancy.account(Principal(7, "ada", False, os_user, 61190), tmp_path)
        assert refused.value.status_code == 422
        [detail] = refused.value.detail
        assert detail["loc"] == ["body", "os_user"] and os_user in detail["msg"], detail
        assert said in detail["msg"]
    # taken up again after a restart, a job of a missing account is refused on the node
    account = tenancy.account(Principal(7, "ada", False, "gdv-nosuch", 61190), tmp_path,
                              check=False)
    from gandiva.node.accounts import problem

    assert account is not None and "does not exist on this node" in (problem(account) or "")


def test_a_server_not_run_as_root_with_two_non_admin_users_needs_shared_account(tmp_path,
                                                                                 root):
    """Run as nobody: every job would run as the server's account, so each user could reach
    the others' files; the server says so and names the flag that accepts it."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    nobody = {"user": 65534, "group": 65534, "extra_groups": [], "cwd": "/",
              "capture_output": True, "text": True, "timeout": 60}
    from serving import passable

    passable(home)
    os.chown(home, 65534, 65534)
    gandiva = [sys.executable, "-m", "gandiva.cli"]
    for user in ("erin", "frank"):
        subprocess.run([*gandiva, "user", "add", user, "--home", str(home)], check=True,
                       **nobody)
    refused = subprocess.run([*gandiva, "server", "--home", str(home), "--port", "0"],
                             **nobody)
    assert refused.returncode != 0
    assert "--shared-account" in refused.stderr and "erin, frank" in refused.stderr, \
        refused.stderr



def test_the_node_daemon_imports_nothing_of_the_server_the_policies_or_the_simulator():
    """What runs as root is the agent and what it needs: a fresh interpreter that imports the
    daemon (and the agent it starts) has nothing of gandiva.server, policies, sim, the
    scheduler or the backends' loop."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", (
        "import sys, gandiva.node.daemon, gandiva.node.agent\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gandiva.server', "
        "'gandiva.policies', 'gandiva.sim', 'gandiva.scheduler', 'gandiva.backends.driver', "
        "'gandiva.sweep', 'fastapi', 'sqlalchemy'))))")],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("call", [
    {"op": "read_log", "job_id": "../../../etc/shadow"},  # a path, not a job
    {"op": "read_log", "job_id": ".hidden"},
    {"op": "kill", "job_id": "a/b"},
    {"op": "read_log", "job_id": "j", "rank": -1},
    {"op": "start", "job_id": "j", "devices": [0], "launch": {  # never root
        "command": ["sh"], "account": {"uid": 0, "gid": 1000}}},
    {"op": "start", "job_id": "j", "devices": [0], "launch": {  # nor root's group
        "command": ["sh"], "account": {"uid": 1000, "gid": 1000, "groups": [0]}}},
    {"op": "start", "job_id": "j", "devices": [0], "launch": {"command": []}},
    {"op": "settle", "name": "../x", "account": {"uid": 1000, "gid": 1000}},
    {"op": "shutdown"},  # not a call of the daemon's
    {"op": "kill", "job_id": "j", "also": 1},  # nothing more than the call's fields
    {"op": "resume", "job_id": "j", "devices": ["0"]},  # types as they are: no coercion
])
def test_the_node_daemon_refuses_any_call_outside_its_types(call):
    from pydantic import ValidationError

    from gandiva.node.daemon import CALL

    with pytest.raises(ValidationError):
        CALL.validate_python(call)


class Planted:
    """What a pickle can do when loaded: here, write a file."""

    def __init__(self, proof: Path) -> None:
        self.proof = proof

    def __reduce__(self):
        return (Path.write_text, (self.proof, "code ran"))


def test_a_checkpoint_is_loaded_as_data_never_as_code_and_the_librarys_own_state_loads(
        tmp_path):
    import random

    import numpy as np
    import torch

    from gandiva.job import checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    checkpoint.save(tmp_path, 3, {"step": 3, "rng": {
        "torch": torch.get_rng_state(), "python": random.getstate(),
        "numpy": np.random.get_state()}, "objects": {"model": model.state_dict(),
                                                     "opt": opt.state_dict()}})
    step, state = checkpoint.latest(tmp_path)
    assert step == 3 and state["rng"]["numpy"][0] == "MT19937"
    assert torch.equal(state["objects"]["model"]["weight"], model.weight.detach())
    proof = tmp_path / "proof.txt"
    checkpoint.save(tmp_path, 4, {"step": 4, "objects": {"x": Planted(proof)}})
    with pytest.raises(ValueError) as refused:
        checkpoint.latest(tmp_path)
    assert "builtins.getattr, pathlib" in str(refused.value)  # (how it names Path.write_text)
    assert "add_safe_globals" in str(refused.value)  # what to do, if it is meant
    assert not proof.exists()


# ---- a job's checkpoints, read and written by a privileged agent (a root Ray node's) ---------
def test_a_privileged_reader_of_a_jobs_checkpoints_follows_no_link_and_takes_only_its_files(
        tmp_path):
    """What a root agent hands on of a job's checkpoints (to the head, to another node):
    never a file a link in the job's directory points at, one of another owner, or a FIFO
    it would wait on."""
    from gandiva.job import checkpoint

    directory, secret = tmp_path / "checkpoints", tmp_path / "secret"
    secret.write_bytes(b"root's own")
    mine = os.geteuid()
    for step in (1, 2):
        data = f"step {step}".encode()
        checkpoint.install(directory, step, data, checkpoint.sha256(data))
    newest = checkpoint.path(directory, 2)
    newest.unlink()
    newest.symlink_to(secret)  # the job put a link in place of its newest checkpoint
    digest = newest.with_name(newest.name + checkpoint.DIGEST)
    digest.write_text(checkpoint.sha256(b"root's own") + "\n")  # (a digest it could know)
    fifo = checkpoint.path(directory, 3)
    os.mkfifo(fifo)  # and one that would hold a reader that waits
    fifo.with_name(fifo.name + checkpoint.DIGEST).write_text(checkpoint.sha256(b"") + "\n")
    assert checkpoint.newest_file(directory, mine)[:2] == (1, b"step 1")
    step, data, _ = checkpoint.mapped(directory, mine)
    assert (step, bytes(data)) == (1, b"step 1")
    assert checkpoint.newest_file(directory, mine + 1) is None  # none of them is uid+1's
    assert checkpoint.newest_file(directory, mine, max_bytes=5) is None  # "step 1": 6 bytes
    assert checkpoint.mapped(directory, mine + 1) is None


def test_a_checkpoint_installed_in_a_jobs_directory_writes_through_no_link_planted_there(
        tmp_path):
    from gandiva.job import checkpoint

    directory, victim = tmp_path / "checkpoints", tmp_path / "victim"
    directory.mkdir()
    victim.write_text("untouched")
    scratch = directory / f".ckpt-{5:012d}.pt.{os.getpid()}.in"  # (its name while written)
    for name in (scratch, scratch.with_name(scratch.name + checkpoint.DIGEST)):
        name.symlink_to(victim)  # the names the agent writes under, first
    checkpoint.install(directory, 5, b"five", checkpoint.sha256(b"five"))
    assert victim.read_text() == "untouched"
    assert not any(name.is_symlink() for name in (  # (they were the names it wrote under)
        scratch, scratch.with_name(scratch.name + checkpoint.DIGEST)))
    assert checkpoint.newest_file(directory, os.geteuid())[:2] == (5, b"five")


def test_on_ray_the_agents_account_decides_and_root_agents_need_token_authentication(tmp_path):
    """Root node agents (their raylets root) run each job as its user's account, but only
    with Ray's token authentication on: without it any process that reaches the cluster
    could call them. Non-root agents run every job as their own account: shared, and said."""
    from types import SimpleNamespace

    from gandiva.server.store import Store
    from gandiva.server.tenancy import ROOT, SHARED, Tenancy

    store = Store(str(tmp_path / "g.db"))
    open_cluster = SimpleNamespace(token_auth=False, infos=[{"uid": 0}])
    with pytest.raises(SystemExit, match="RAY_AUTH_MODE=token"):
        Tenancy.for_server(store, "ray", False, True, open_cluster)
    closed = SimpleNamespace(token_auth=True, infos=[{"uid": 0}])
    assert Tenancy.for_server(store, "ray", False, True, closed).mode == ROOT
    theirs = SimpleNamespace(token_auth=True, infos=[{"uid": 65534}])
    shared = Tenancy.for_server(store, "ray", False, False, theirs)
    assert shared.mode == SHARED and "not root" in shared.why
    for user in ("erin", "frank"):
        store.add_user(user, admin=False)
    with pytest.raises(SystemExit, match="--shared-account"):
        Tenancy.for_server(store, "ray", False, False, theirs)
    assert Tenancy.for_server(store, "ray", True, False, theirs).mode == SHARED
