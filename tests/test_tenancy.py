"""What one user's job can reach of the server and of other users. This far: nothing of the
server's environment reaches a job, warm-forked or cold (the zygote starts with an
allow-listed environment, not the server's), each job has a TMPDIR of its own (removed
when it ends), and the server's
state is its account's alone (umask 077). Jobs still run as the server's OS account: the
per-user accounts of issue 53 are to come."""

import stat
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
from serving import running  # noqa: E402
from waiting import until  # noqa: E402

SECRET = "hunter2-not-for-jobs"
# a job that writes down all it can see of environments: its own, as Python and as the
# kernel hold it, and (PARENT set) its parent's: a warm job's parent is the zygote. (A cold
# job's is the server, which a job of the server's own OS account can read until jobs run
# as their users' accounts.)
SPY = """\
import os, tempfile
seen = [repr(dict(os.environ))]
for who, pid in (("self", "self"), ("parent", os.getppid()))[:2 if "PARENT" in os.environ else 1]:
    seen.append(f"environ of {who}: " + open(f"/proc/{pid}/environ", "rb").read().decode())
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
            for name, extra in (("warm", {"PARENT": "1"}), ("cold", {"PYTHONHASHSEED": "0"})):
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
    for job_id in ids.values():
        job_dir = home / "run" / "jobs" / job_id
        assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((job_dir / "rank0.log").stat().st_mode) == 0o600
