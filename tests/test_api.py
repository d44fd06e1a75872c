"""The REST API against a real store (SQLite) and the local loop running real jobs."""

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
from fastapi.testclient import TestClient  # noqa: E402

from gandiva.policies import make_policy  # noqa: E402
from gandiva.runtime.local import LocalBackend  # noqa: E402
from gandiva.server.app import Service, create_app  # noqa: E402
from gandiva.server.store import Store  # noqa: E402

CNN = str(Path(__file__).resolve().parents[1] / "examples" / "cnn.py")


@pytest.fixture(params=["gandiva:quantum=1"])
def server(tmp_path, request):
    store = Store(str(tmp_path / "gandiva.db"))
    backend = LocalBackend(make_policy(request.param), tmp_path / "work", slots=2,
                           feedback_steps=20)
    service = Service(store, backend, tmp_path / "base")
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    tokens = {name: store.add_user(name, admin=(name == "root")) for name in ("ada", "bob",
                                                                              "root")}
    for who in ("ada", "bob"):
        service.user_dir(store.principal(tokens[who])).mkdir(parents=True)
    yield TestClient(create_app(service)), tokens, store
    backend.stop()
    loop.join(timeout=30)


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def submit_long(client, headers, n):
    """``n`` jobs long enough to outlast the test (it cancels them)."""
    return [client.post("/v1/jobs", json={"name": f"long{i}", "command":
                                          ["python", CNN, "--steps", "100000"]},
                        headers=headers).json()["id"] for i in range(n)]


def wait_state(client, job_id, token, states, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never reached {states}: {job}")


def test_unauthenticated_requests_get_401(server):
    client, _, _ = server
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=auth("not-a-token")).status_code == 401
    assert client.get("/v1/jobs", headers={"Authorization": "Basic x"}).status_code == 401


def test_invalid_specs_get_422_naming_the_field(server):
    client, tokens, store = server
    r = client.post("/v1/jobs", json={"name": "x", "command": ["a"], "gpus": 0},
                    headers=auth(tokens["ada"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "gpus"
    r = client.post("/v1/jobs", json={"name": "x", "command": ["a"], "workdir": "nowhere"},
                    headers=auth(tokens["ada"]))
    assert r.status_code == 422 and "does not exist" in r.json()["detail"][0]["msg"]
    r = client.post("/v1/jobs", json={"name": "x", "command": ["a"], "gpus": 3},
                    headers=auth(tokens["ada"]))
    assert r.status_code == 422 and "this cluster has 2" in r.json()["detail"][0]["msg"]
    assert store.jobs(store.principal(tokens["root"])) == []  # nothing was stored


def test_submitted_job_runs_and_only_its_owner_and_admins_see_it(server, tmp_path):
    client, tokens, _ = server
    r = client.post("/v1/jobs", json={"name": "cnn", "command": ["python", CNN, "--steps", "100"]},
                    headers=auth(tokens["ada"]))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert wait_state(client, job_id, tokens["ada"], ("done", "failed"))["state"] == "done"
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job_id}/events",
                                           headers=auth(tokens["ada"])).json()]
    assert kinds[0] == "submitted" and "running" in kinds and kinds[-1] == "done"
    log = client.get(f"/v1/jobs/{job_id}/logs?tail=5", headers=auth(tokens["ada"])).text
    assert "done: 100 steps" in log and len(log.splitlines()) <= 5
    assert client.get(f"/v1/jobs/{job_id}/logs", headers=auth(tokens["bob"])).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(tokens["bob"])).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/events",
                      headers=auth(tokens["bob"])).status_code == 404
    assert client.get("/v1/jobs", headers=auth(tokens["bob"])).json() == []
    assert [j["id"] for j in client.get("/v1/jobs?state=done",
                                        headers=auth(tokens["root"])).json()] == [job_id]
    reopened = Store(str(tmp_path / "gandiva.db"))  # what a restarted server reads
    assert reopened.job(reopened.principal(tokens["ada"]), job_id).state == "done"


def test_cancel_stops_a_running_job_and_only_its_owner_may(server):
    client, tokens, _ = server
    ada = auth(tokens["ada"])
    ids = submit_long(client, ada, 3)  # 3 jobs, 2 slots
    wait_state(client, ids[0], tokens["ada"], ("running",))
    assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(tokens["bob"])).status_code == 404
    for job_id in ids:
        r = client.post(f"/v1/jobs/{job_id}/cancel", headers=ada)
        assert r.status_code == 200, r.text
    for job_id in ids:
        job = wait_state(client, job_id, tokens["ada"], ("cancelled", "done", "failed"))
        assert job["state"] == "cancelled" and job["finished_at"] is not None
    assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=ada).status_code == 409
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{ids[0]}/events", headers=ada).json()]
    assert kinds[-2:] == ["cancel-requested", "cancelled"] or kinds[-1] == "cancelled"


@pytest.mark.parametrize("server", ["fifo", "gandiva:quantum=1"], indirect=True)
def test_explain_says_why_a_job_is_not_running(server):
    client, tokens, _ = server
    ada = auth(tokens["ada"])
    ids = submit_long(client, ada, 3)  # 3 jobs, 2 slots
    for job_id in ids[:2]:
        wait_state(client, job_id, tokens["ada"], ("running",))
    why = client.get(f"/v1/jobs/{ids[2]}/explain", headers=ada).json()
    if why["state"] == "queued" and why["queue_position"]:  # fifo: a queue
        assert why["reason"] == "waiting for 1 free device(s); 0 of 2 free now; 1 in line"
    else:  # gandiva: over-subscribed, it takes turns
        assert "time-sliced" in why["reason"] or why["reason"].startswith("running on")
    first = client.get(f"/v1/jobs/{ids[0]}/explain", headers=ada).json()["reason"]
    assert first.startswith("running on device") or "time-sliced" in first  # gandiva rotates
    assert client.get(f"/v1/jobs/{ids[2]}/explain",
                      headers=auth(tokens["bob"])).status_code == 404
    for job_id in ids:
        client.post(f"/v1/jobs/{job_id}/cancel", headers=ada)
    for job_id in ids:
        wait_state(client, job_id, tokens["ada"], ("cancelled",))
    assert client.get(f"/v1/jobs/{ids[2]}/explain", headers=ada).json()["reason"] == "cancelled"
