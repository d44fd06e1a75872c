"""The REST API against a real store (SQLite) and the local loop running real jobs."""

import contextlib
import json
import shutil
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
from fastapi.testclient import TestClient  # noqa: E402
from held import Held  # noqa: E402
from serving import PACED  # noqa: E402
from waiting import first_ok, until  # noqa: E402

from gandiva.backends.driver import Driver  # noqa: E402
from gandiva.policies import make_policy  # noqa: E402
from gandiva.server.app import STREAMS_PER_USER, Service, create_app  # noqa: E402
from gandiva.server.store import Store  # noqa: E402

CNN = str(Path(__file__).resolve().parents[1] / "examples" / "cnn.py")
LOUD = """\
import os, sys, time
print("start", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
sys.stdout.buffer.write((b"x" * 1023 + b"\\n") * 65536)  # 64 MiB
print("THE END", flush=True)
"""  # a job that writes a log too big to hold, once the test has a follower on it


# round robin, a second a turn: every turn changes who runs, and the tests count turns
SLICING = "slicer:quantum=1"


@pytest.fixture(params=[SLICING])
def server(zygote, tmp_path, request):
    store = Store(str(tmp_path / "gandiva.db"))
    backend = Driver(make_policy(request.param), tmp_path / "work", slots=2,
                           feedback_steps=20, zygote=zygote)
    service = Service(store, backend, tmp_path / "base")
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    tokens = {name: store.add_user(name, admin=(name == "root")) for name in ("ada", "bob",
                                                                              "root")}
    for who in ("ada", "bob"):
        home = service.user_dir(store.principal(tokens[who]))
        home.mkdir(parents=True)
        shutil.copy(CNN, home / "cnn.py")  # jobs may only use files in their user's directory
        (home / "paced.py").write_text(PACED)
        (home / "loud.py").write_text(LOUD)
    yield TestClient(create_app(service)), tokens, store
    backend.stop()
    loop.join(timeout=30)


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def submit_cnn(client, headers, name, steps, **spec):
    """A job of the example CNN (copied into each user's directory); its id."""
    r = client.post("/v1/jobs", json={"name": name, "command": ["python", "cnn.py", "--steps",
                                                                str(steps)], **spec},
                    headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def submit_long(client, headers, n):
    """``n`` jobs long enough to outlast the test (it cancels them)."""
    return [submit_cnn(client, headers, f"long{i}", 100_000) for i in range(n)]


def wait_state(client, job_id, token, states, timeout=120):
    def reached():
        job = client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()
        return job if job["state"] in states else None
    return until(reached, timeout, f"{job_id} to reach {states}", every=0.1)


def poll(get, ok, timeout=60):
    return first_ok(get, ok, timeout, every=0.1)


def test_unauthenticated_requests_get_401(server):
    client, _, _ = server
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=auth("not-a-token")).status_code == 401
    assert client.get("/v1/jobs", headers={"Authorization": "Basic x"}).status_code == 401


def test_every_answer_forbids_foreign_scripts_and_framing(server):
    """The dashboard and every answer: only the server's own scripts, no frames; no /docs
    page (FastAPI's loads a CDN's script), the schema still at /openapi.json."""
    client, tokens, _ = server
    for r in (client.get("/ui/"), client.get("/v1/jobs"), client.get("/healthz"),
              client.post("/v1/jobs", content=b"x" * (2 << 20), headers=auth(tokens["ada"]))):
        assert r.headers["content-security-policy"] == \
            "default-src 'self'; frame-ancestors 'none'", r
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert "/v1/jobs" in client.get("/openapi.json").json()["paths"]


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
    r = client.post("/v1/jobs", json={"name": "x", "command": ["torchrun", "--help"]},
                    headers=auth(tokens["ada"]))  # (argparse would print and exit)
    assert r.status_code == 422 and "would have torchrun exit" in r.text
    many = "&".join(f"label=k{i}=v" for i in range(990))  # (a query clause each)
    r = client.get(f"/v1/jobs?{many}", headers=auth(tokens["ada"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "label"
    assert client.get("/readyz").status_code == 200  # no outage counted


def test_submitted_job_runs_and_only_its_owner_and_admins_see_it(server, tmp_path):
    client, tokens, _ = server
    r = client.post("/v1/jobs", json={"name": "cnn", "command": "python cnn.py --steps 100"},
                    headers=auth(tokens["ada"]))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert wait_state(client, job_id, tokens["ada"], ("done", "failed"))["state"] == "done"
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job_id}/events",
                                           headers=auth(tokens["ada"])).json()]
    assert kinds[0] == "submitted" and "running" in kinds and kinds[-1] == "done"
    events = client.get(f"/v1/jobs/{job_id}/events", headers=auth(tokens["ada"])).json()
    profile = next(e["data"] for e in events if e["kind"] == "profile")  # stored as it ran
    assert profile["mini_batch_time"] > 0 and profile["memory_gb"] > 0
    assert next(e for e in events if e["kind"] == "running")["data"]["devices"] in ([0], [1])
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


@pytest.mark.parametrize("server", ["fifo", SLICING], indirect=True)
def test_explain_says_why_a_job_is_not_running(server):
    client, tokens, _ = server
    ada = auth(tokens["ada"])
    ids = submit_long(client, ada, 3)  # 3 jobs, 2 slots
    for job_id in ids[:2]:
        wait_state(client, job_id, tokens["ada"], ("running",))
    why = poll(lambda: client.get(f"/v1/jobs/{ids[2]}/explain", headers=ada).json(),
               lambda w: not w["reason"].startswith("submitted;"))  # the view lags
    if why["state"] == "queued" and why["queue_position"]:  # fifo: a queue
        assert why["reason"] == "waiting for 1 free device(s); 0 of 2 free now; 1 in line"
    else:  # slicer: over-subscribed, it takes turns
        assert "time-sliced" in why["reason"] or why["reason"].startswith("running on")
    first = client.get(f"/v1/jobs/{ids[0]}/explain", headers=ada).json()["reason"]
    assert first.startswith("running on device") or "time-sliced" in first  # turns rotate
    assert client.get(f"/v1/jobs/{ids[2]}/explain",
                      headers=auth(tokens["bob"])).status_code == 404
    for job_id in ids:
        client.post(f"/v1/jobs/{job_id}/cancel", headers=ada)
    for job_id in ids:
        wait_state(client, job_id, tokens["ada"], ("cancelled",))
    assert client.get(f"/v1/jobs/{ids[2]}/explain", headers=ada).json()["reason"] == "cancelled"


@pytest.mark.parametrize("server", ["slicer:quantum=3:pack"], indirect=True)
def test_explain_names_no_other_users_job(server):
    """A job's id carries its name: ada's job packed with bob's is "packed with another
    user's job", to ada and in her job list; bob's job keeps its own name to him."""
    client, tokens, _ = server
    ada, bob = auth(tokens["ada"]), auth(tokens["bob"])
    def paced(headers, name):  # (they wait rather than compute: they pack)
        r = client.post("/v1/jobs", json={"name": name, "command": ["python", "paced.py"]},
                        headers=headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]
    mine = paced(ada, "mine")
    theirs = [paced(bob, f"secret-plan{i}") for i in range(3)]
    why = poll(lambda: client.get(f"/v1/jobs/{mine}/explain", headers=ada).json(),
               lambda w: "packed with" in w["reason"], timeout=120)
    assert "another user's job" in why["reason"] and "secret" not in why["reason"], why
    listed = client.get("/v1/jobs", headers=ada).json()
    assert not any("secret" in (j["why"] or "") for j in listed)
    for job_id, headers in [(mine, ada), *((t, bob) for t in theirs)]:
        client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)


def events_of(client, job_id, headers):
    return [e["kind"] for e in client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()]


def test_paths_and_commands_cannot_leave_the_users_directory(server, tmp_path):
    client, tokens, store = server
    ada = auth(tokens["ada"])
    bob_dir = tmp_path / "base" / "users" / "bob"
    (tmp_path / "base" / "users" / "ada" / "sneaky").symlink_to(bob_dir)
    cases = [({"workdir": "../bob"}, "workdir"), ({"workdir": "/tmp"}, "workdir"),
             ({"workdir": "sneaky"}, "workdir"),  # a symlink out of ada's directory
             ({"command": ["python", str(bob_dir / "cnn.py")]}, "command"),
             ({"command": ["python", "../bob/cnn.py"]}, "command")]
    for extra, field in cases:
        r = client.post("/v1/jobs", json={"name": "x", "command": ["python", "cnn.py"], **extra},
                        headers=ada)
        assert r.status_code == 422, (extra, r.text)
        assert r.json()["detail"][0]["loc"][-1] == field, (extra, r.text)
    assert store.jobs(store.principal(tokens["root"])) == []


def test_suspend_frees_the_devices_and_resume_continues_from_the_checkpoint(server):
    client, tokens, _ = server
    ada = auth(tokens["ada"])
    job_id = submit_cnn(client, ada, "held", 1500)
    poll(lambda: client.get(f"/v1/jobs/{job_id}", headers=ada).json(),
         lambda job: job["steps"] >= 100)  # it has trained a while
    assert client.post(f"/v1/jobs/{job_id}/suspend", headers=auth(tokens["bob"])
                       ).status_code == 404
    assert client.post(f"/v1/jobs/{job_id}/resume", headers=ada).status_code == 409
    assert client.post(f"/v1/jobs/{job_id}/suspend", headers=ada).status_code == 200
    held = wait_state(client, job_id, tokens["ada"], ("held",))
    assert "resume it" in held["why"]
    cluster = client.get("/v1/cluster", headers=ada).json()
    assert cluster["free"] == 2 and all(not d["jobs"] for d in cluster["nodes"][0]["devices"])
    assert client.post(f"/v1/jobs/{job_id}/suspend", headers=ada).status_code == 409
    assert client.post(f"/v1/jobs/{job_id}/resume", headers=ada).status_code == 200
    assert wait_state(client, job_id, tokens["ada"], ("done", "failed"))["state"] == "done"
    log = client.get(f"/v1/jobs/{job_id}/logs?tail=1000", headers=ada).text
    assert "restored from checkpoint at step" in log and "done: 1500 steps" in log
    assert int(log.split("restored from checkpoint at step ")[1].split()[0]) >= 100
    kinds = events_of(client, job_id, ada)
    assert kinds.index("held") < kinds.index("released") < len(kinds) - 1


def test_priority_change_is_stored_and_validated_and_a_member_stays_under_the_ceiling(server):
    client, tokens, _ = server
    ada = auth(tokens["ada"])
    job_id = submit_long(client, ada, 1)[0]
    r = client.patch(f"/v1/jobs/{job_id}", json={"priority": 7}, headers=ada)
    assert r.status_code == 200 and r.json()["priority"] == 7
    # above the ceiling (50) is the admins' class: a member gets a 403 naming it, an admin not
    r = client.patch(f"/v1/jobs/{job_id}", json={"priority": 51}, headers=ada)
    assert r.status_code == 403 and "priority: 51 is above 50" in r.json()["detail"]
    r = client.post("/v1/jobs", json={"name": "x", "command": ["python", "cnn.py"],
                                      "priority": 90}, headers=ada)
    assert r.status_code == 403 and "priority: 90" in r.json()["detail"]
    assert client.get("/v1/jobs", headers=ada).json()[0]["id"] == job_id  # none stored
    r = client.patch(f"/v1/jobs/{job_id}", json={"priority": 60}, headers=auth(tokens["root"]))
    assert r.status_code == 200 and r.json()["priority"] == 60
    r = client.patch(f"/v1/jobs/{job_id}", json={"priority": 7}, headers=ada)
    assert r.status_code == 200
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": 1000}, headers=ada
                        ).status_code == 422
    assert client.patch(f"/v1/jobs/{job_id}", json={"gpus": 2}, headers=ada).status_code == 422
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": 1},
                        headers=auth(tokens["bob"])).status_code == 404
    client.post(f"/v1/jobs/{job_id}/cancel", headers=ada)
    wait_state(client, job_id, tokens["ada"], ("cancelled",))
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": 1}, headers=ada
                        ).status_code == 409
    ev = client.get(f"/v1/jobs/{job_id}/events", headers=ada).json()
    assert {"kind": "priority", "data": {"by": "ada", "from": 0, "to": 7}}.items() <= \
        next(e for e in ev if e["kind"] == "priority").items()


def test_cluster_view_metrics_and_event_stream_while_jobs_time_slice(server):
    client, tokens, _ = server
    ada, bob = auth(tokens["ada"]), auth(tokens["bob"])
    ids = submit_long(client, ada, 2) + submit_long(client, bob, 1)  # 3 jobs, 2 slots
    # over-subscribed: two run, one waits its turn on the node; they rotate
    view = poll(lambda: client.get("/v1/cluster", headers=ada).json(),
                lambda v: all(len(d["jobs"]) == 1 for d in v["nodes"][0]["devices"])
                and len(v["nodes"][0]["time_sliced"]) == 1)
    seen = [j for d in view["nodes"][0]["devices"] for j in d["jobs"]] + \
        view["nodes"][0]["time_sliced"]
    assert sorted(j["id"] for j in seen if j["id"]) == sorted(ids[:2])  # ada's, named
    assert [j["name"] for j in seen if j["id"] is None] == ["(another user)"]  # bob's
    assert sum(j["mine"] for j in seen) == 2
    # the same jobs as an admin sees them (all named, none theirs), and as bob does
    for who, named, mine in ((auth(tokens["root"]), set(ids), set()),
                             (bob, {ids[2]}, {ids[2]})):
        def jobs(view: dict) -> list[dict]:
            return [j for n in view["nodes"] for j in n["time_sliced"] +
                    [j for d in n["devices"] for j in d["jobs"]]]

        other = poll(lambda who=who: client.get("/v1/cluster", headers=who).json(),
                     lambda v: len(jobs(v)) == 3)  # (none between two places)
        assert {j["id"] for j in jobs(other)} - {None} == named
        assert {j["id"] for j in jobs(other) if j["mine"]} == mine
    for job_id in ids:
        poll(lambda job_id=job_id: events_of(client, job_id, ada if job_id in ids[:2] else bob),
             lambda kinds: "suspended" in kinds, timeout=60)

    def suspends(text: str) -> float:  # carried out by the node (counted once it confirms)
        return float(text.split('gandiva_action_seconds_count{action="suspend"} ')[1].split()[0])

    text = poll(lambda: client.get("/metrics").text,  # read between two turns' changes
                lambda t: 'gandiva_jobs{state="running"} 2.0' in t
                and "gandiva_jobs_time_sliced 1.0" in t and suspends(t) >= 3)
    assert "gandiva_devices 2.0" in text
    assert 'gandiva_decision_seconds_count{event="arrival"} 3.0' in text
    # the event stream: ada's events only, in order, as server-sent events
    with client.stream("GET", "/v1/events/stream", headers=ada) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        got = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                got.append(json.loads(line[6:]))
            if len(got) == 6:
                break
    assert {e["job_id"] for e in got} <= set(ids[:2])
    assert [e["id"] for e in got] == sorted(e["id"] for e in got)
    listed = client.get("/v1/events?limit=6", headers=ada).json()
    assert [e["id"] for e in listed] == [e["id"] for e in got]
    util = poll(lambda: client.get("/v1/utilisation", headers=ada).json(),
                lambda u: u["samples"] and u["samples"][-1]["allocated"] == 2
                and u["samples"][-1]["busy"] > 0)  # the jobs report what they use
    assert util["total"] == 2 and util["samples"][-1]["busy"] <= 1
    since = util["samples"][-1]["at"]
    assert all(s["at"] >= since for s in client.get(f"/v1/utilisation?since={since}",
                                                    headers=ada).json()["samples"])
    for job_id, who in zip(ids, (ada, ada, bob), strict=True):
        client.post(f"/v1/jobs/{job_id}/cancel", headers=who)


def test_logs_follow_until_the_job_ends_and_time_limits_stop_jobs(server):
    client, tokens, _ = server
    ada = auth(tokens["ada"])
    job_id = submit_cnn(client, ada, "f", 300)
    with client.stream("GET", f"/v1/jobs/{job_id}/logs?follow=true", headers=ada) as r:
        text = "".join(r.iter_text())  # returns only once the job has ended
    assert "done: 300 steps" in text
    assert client.get(f"/v1/jobs/{job_id}", headers=ada).json()["state"] == "done"
    job_id = submit_cnn(client, ada, "t", 100_000, time_limit="3s")
    job = wait_state(client, job_id, tokens["ada"], ("done", "failed"))
    assert job["state"] == "failed" and "time limit" in job["reason"]
    assert job["finished_at"] - job["started_at"] < 30


def test_a_huge_log_is_tailed_from_its_end_and_followed_in_bounded_pieces(server, tmp_path):
    """64 MiB of output: ``tail`` reads only the end, ``follow`` sends it in pieces; the
    server never holds the log (the whole of it read at once: over 128 MiB)."""
    client, tokens, store = server
    ada = auth(tokens["ada"])
    r = client.post("/v1/jobs", json={"name": "loud", "command": ["python", "loud.py"]},
                    headers=ada)
    job_id = r.json()["id"]
    poll(lambda: client.get(f"/v1/jobs/{job_id}/logs", headers=ada).text,
         lambda text: "start" in text)
    got = 0
    with Held() as following, client.stream(
            "GET", f"/v1/jobs/{job_id}/logs?follow=true&tail=1", headers=ada) as r:
        (tmp_path / "base" / "users" / "ada" / "go").touch()
        for chunk in r.iter_bytes():
            got += len(chunk)
            assert len(chunk) <= 2**20 + 64
            last = chunk
    assert last.endswith(b"THE END\n")
    assert following.mib < 32
    assert got > 64 * 2**20
    with Held() as tailing:
        tail = client.get(f"/v1/jobs/{job_id}/logs?tail=3", headers=ada).text
    assert tailing.mib < 32
    assert tail.splitlines() == ["x" * 1023, "x" * 1023, "THE END"]


def test_streams_are_capped_per_user_and_end_when_the_token_is_revoked(server):
    client, tokens, store = server
    ada, bob = auth(tokens["ada"]), auth(tokens["bob"])
    job_id = submit_cnn(client, ada, "long", 100_000)
    with contextlib.ExitStack() as open_:
        for i in range(STREAMS_PER_USER):
            path = "/v1/events/stream" if i % 2 else f"/v1/jobs/{job_id}/logs?follow=true"
            assert open_.enter_context(client.stream("GET", path, headers=ada)
                                       ).status_code == 200
        r = client.get("/v1/events/stream", headers=ada)
        assert r.status_code == 429 and "close one" in r.json()["detail"]
        assert client.get(f"/v1/jobs/{job_id}/logs?follow=true", headers=ada
                          ).status_code == 429
        assert client.get(f"/v1/jobs/{job_id}/logs", headers=ada).status_code == 200
        with client.stream("GET", "/v1/events/stream", headers=bob) as r:
            assert r.status_code == 200  # another user's streams are theirs
    # closed: the slots are free again; a revoke ends the open ones
    opened, ended = [], []

    def read(path: str) -> None:
        with client.stream("GET", path, headers=ada) as r:
            assert r.status_code == 200
            opened.append(path)
            for _ in r.iter_bytes():
                pass
        ended.append(path)

    readers = [threading.Thread(target=read, args=(path,), daemon=True)
               for path in ("/v1/events/stream", f"/v1/jobs/{job_id}/logs?follow=true")]
    for t in readers:
        t.start()
    until(lambda: len(opened) == 2, 30, "both streams open")
    assert client.post("/v1/users/ada/revoke", headers=auth(tokens["root"])).status_code == 200
    for t in readers:
        t.join(timeout=10)
    assert len(ended) == 2
    store.rotate("ada")  # (its job is cancelled as the server closes)
