"""The README's "Many machines (Ray)" run, as a user does it: a three-node Ray cluster on this
machine (``examples/ray_local_cluster.py``), ``gandiva server --backend ray``, the CLI
submitting the example workload (three CNN jobs and a 4-rank gang, shortened), and a fourth
node joining while they run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
import httpx2  # noqa: E402
from serving import GANDIVA, add_user, free_port, passable, stop  # noqa: E402
from waiting import until  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RAY_ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

# about a minute: outside the default run (-m "not slow"); run it with -m slow
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow,
              pytest.mark.xdist_group("ray")]  # never beside test_ray's cluster


def test_the_readme_workload_on_a_ray_cluster(tmp_path):
    """(Run as root, the node agents are too: each job runs as its user's account, and Ray's
    token, which the example makes in HOME, keeps jobs off the cluster.)"""
    env = {**RAY_ENV, "HOME": str(tmp_path)}  # the token's, for the cluster and the server
    ray_cluster = subprocess.Popen([sys.executable, str(EXAMPLES / "ray_local_cluster.py"),
                                    "--nodes", "3", "--gpus", "2"], env=env,
                                   stdout=subprocess.PIPE, text=True)
    server = None
    try:
        address = ray_cluster.stdout.readline().strip()
        assert address, "the Ray cluster did not start"
        home, port = tmp_path / "gandiva-home", free_port()
        token = add_user(home, "ada", admin=True)
        passable(home)  # (pytest's directories above it are 0700)
        assert (tmp_path / ".ray" / "auth_token").stat().st_mode & 0o077 == 0
        log = (tmp_path / "server.log").open("w")
        server = subprocess.Popen([*GANDIVA, "server", "--home", str(home), "--port", str(port),
                                   "--backend", "ray", "--ray-address", address,
                                   "--policy", "slicer:quantum=5", "--checkpoint-every", "5"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        api = httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                            timeout=10)

        def up() -> bool:
            try:
                return api.get("/v1/whoami").status_code == 200
            except httpx2.TransportError:
                return False
        until(up, 180, "the server", alive=lambda: server.poll() is None, every=0.2)
        tenancy = httpx2.get(f"{url}/readyz").json()["tenancy"]
        assert tenancy.startswith("root" if os.geteuid() == 0 else "shared"), tenancy
        for script in ("cnn.py", "elastic_mlp.py"):
            shutil.copy(EXAMPLES / script, home / "users" / "ada" / script)
        env = {**os.environ, "GANDIVA_CONFIG": str(tmp_path / "client.yaml")}
        cli = lambda *a: subprocess.run([*GANDIVA, *a], env=env, capture_output=True,  # noqa: E731
                                        text=True, check=True, timeout=60).stdout
        cli("login", "--url", url, "--token", token)
        short = {"cnn.yaml": ("--steps 40000", "--steps 300"),
                 "gang.yaml": ("--steps 20000", "--steps 1200")}
        ids = {}
        for name, copies in (("cnn.yaml", 3), ("gang.yaml", 1)):
            spec = tmp_path / name
            spec.write_text((EXAMPLES / name).read_text().replace(*short[name]))
            for i in range(copies):
                ids[f"{name}-{i}"] = cli("submit", str(spec)).strip()
        ray_cluster.send_signal(signal.SIGUSR1)  # a fourth node joins
        nodes_seen = [0]
        jobs: dict = {}

        def ended() -> bool:
            jobs.update((j["id"], j) for j in api.get("/v1/jobs").json())
            nodes_seen[0] = max(nodes_seen[0], len(api.get("/v1/cluster").json()["nodes"]))
            return {jobs[i]["state"] for i in ids.values()} <= {"done", "failed", "cancelled"}
        until(ended, 600, "every job to end", every=1.0)
        states = {jobs[i]["state"] for i in ids.values()}
        assert states == {"done"}, {k: (jobs[i]["state"], jobs[i].get("reason"))
                                    for k, i in ids.items()}
        assert nodes_seen[0] == 4, "the node that joined never showed up"
        node_of = {d["id"]: n["id"] for n in api.get("/v1/cluster").json()["nodes"]
                   for d in n["devices"]}
        runs = [e["data"]["devices"] for e in
                api.get(f"/v1/jobs/{ids['gang.yaml-0']}/events").json()
                if e["kind"] == "running"]
        assert runs and all(len({node_of[d] for d in r}) == 2 for r in runs), runs
        table = cli("cluster")
        assert "node3" in table
        out = cli("logs", ids["gang.yaml-0"], "--rank", "3")
        assert "done: 1200 steps on 4 rank(s)" in out
    finally:
        if server is not None:
            stop(server, timeout=60)
        stop(ray_cluster, timeout=60)
