"""What a platform team needs of the server: limits, listing that scales, labels, safe retries,
users they can revoke and rotate, health endpoints. A real store (SQLite) and a real loop; the
jobs queued here never need to run (no devices are free for them, or they are cancelled)."""

import gc
import shutil
import socket
import threading
from pathlib import Path

import pytest
import uvicorn
from waiting import first_ok, until

pytest.importorskip("torch")
from fastapi.testclient import TestClient  # noqa: E402

from gandiva.backends.driver import Driver  # noqa: E402
from gandiva.policies import make_policy  # noqa: E402
from gandiva.server.app import Service, create_app  # noqa: E402
from gandiva.server.jobspec import MAX_ENV, SpecError, duration_s, parse  # noqa: E402
from gandiva.server.store import Store  # noqa: E402

CNN = str(Path(__file__).resolve().parents[1] / "examples" / "cnn.py")
BODY_LIMIT = 64 * 1024


@pytest.fixture
def api(zygote, tmp_path):
    store = Store(str(tmp_path / "gandiva.db"))
    # every device held by a job that never ends: what the tests submit stays queued
    backend = Driver(make_policy("fifo"), tmp_path / "work", slots=1, zygote=zygote)
    service = Service(store, backend, tmp_path / "base", max_unfinished_per_user=30)
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    tokens = {n: store.add_user(n, admin=(n == "root")) for n in ("ada", "bob", "root")}
    for who in ("ada", "bob"):
        home = service.user_dir(store.principal(tokens[who]))
        home.mkdir(parents=True)
        shutil.copy(CNN, home / "cnn.py")
    client = TestClient(create_app(service, max_body_bytes=BODY_LIMIT),
                        raise_server_exceptions=False)
    yield client, tokens, store, service
    backend.stop()
    loop.join(timeout=30)


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def job(name, **extra):
    return {"name": name, "command": ["python", "cnn.py", "--steps", "1000000"], **extra}


# ---- limits: each a clear 4xx naming the limit, before the body is read whole --------------

def test_a_body_over_the_limit_is_refused_with_413_by_its_length(api):
    client, tokens, store, _ = api
    r = client.post("/v1/jobs", content=b"x" * (BODY_LIMIT + 1), headers={
        **auth(tokens["ada"]), "Content-Type": "application/json"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]
    assert store.jobs(store.principal(tokens["root"])) == []


def test_a_chunked_body_is_answered_413_as_it_passes_the_limit_not_read_to_its_end(api):
    """Over a real socket to a real uvicorn: the answer comes while the client is still
    sending, after about the limit, not after the 100 MB it offers."""
    _, tokens, _, service = api
    server = uvicorn.Server(uvicorn.Config(create_app(service, max_body_bytes=BODY_LIMIT),
                                           port=0, log_level="warning"))  # a free port
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started, 60, "uvicorn to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         b"\r\nTransfer-Encoding: chunked\r\nAuthorization: Bearer "
                         + tokens["ada"].encode() + b"\r\n\r\n")
            chunk = b" " * (16 * 1024)
            answer, sent = b"", 0
            conn.settimeout(0.05)
            while sent < 100 * 1024 * 1024 and not answer:
                try:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
                    answer = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:  # the server closed the connection after answering
                    break
            conn.settimeout(5)
            answer = answer or conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < 16 * BODY_LIMIT  # it answered after about the limit, not 100 MB
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"env": {f"V{i}": "x" for i in range(MAX_ENV + 1)}}, "env", "at most 256"),
    ({"env": {"BIG": "x" * 17_000}}, "env", "the limit is 16384"),
    ({"command": ["python"] + ["a"] * 1100}, "command", "the limit is 1024"),
    ({"command": ["python", "x" * 70_000]}, "command", "the limit is 65536"),
    ({"labels": {"bad key!": "x"}}, "labels", "use 1-63 letters"),
    ({"time_limit": "1h30"}, "time_limit", "HH:MM:SS"),
])
def test_oversized_or_bad_spec_parts_are_refused_naming_the_field_and_limit(api, spec, field,
                                                                            words):
    client, tokens, _, _ = api
    r = client.post("/v1/jobs", json={**job("x"), **spec}, headers=auth(tokens["ada"]))
    assert r.status_code in (413, 422), r.text
    if r.status_code == 422:
        problems = r.json()["detail"]
        assert any(p["loc"][:2] == ["body", field] and words in p["msg"] for p in problems), \
            problems


def test_a_lone_surrogate_is_refused_with_422_not_500(api):
    client, tokens, _, _ = api
    body = '{"name": "\\udc80", "command": ["python", "cnn.py"]}'  # valid JSON, bad UTF-16
    r = client.post("/v1/jobs", content=body.encode(), headers={
        **auth(tokens["ada"]), "Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"].startswith("Value error, name: holds a lone surrogate")


def test_a_user_with_too_many_unfinished_jobs_gets_429_and_others_do_not(api):
    client, tokens, _, service = api
    for i in range(service.max_unfinished_per_user):
        assert client.post("/v1/jobs", json=job(f"j{i}"), headers=auth(tokens["ada"])
                           ).status_code == 201
    r = client.post("/v1/jobs", json=job("one-more"), headers=auth(tokens["ada"]))
    assert r.status_code == 429 and "--max-unfinished-per-user" in r.json()["detail"]
    assert client.post("/v1/jobs", json=job("bobs"), headers=auth(tokens["bob"])
                       ).status_code == 201
    # cancelling one makes room again
    first = client.get("/v1/jobs", params={"limit": 1000}, headers=auth(tokens["ada"])
                       ).json()[-1]
    assert client.post(f"/v1/jobs/{first['id']}/cancel", headers=auth(tokens["ada"])
                       ).status_code == 200
    until(lambda: client.post("/v1/jobs", json=job("again"), headers=auth(tokens["ada"])
                              ).status_code == 201, 30, "room for one more job", every=0.1)


# ---- listing ---------------------------------------------------------------------------

def test_jobs_are_listed_newest_first_a_page_at_a_time_with_a_next_link(api):
    client, tokens, _, _ = api
    ids = [client.post("/v1/jobs", json=job(f"p{i}"), headers=auth(tokens["ada"])).json()["id"]
           for i in range(7)]
    seen, url, pages = [], "/v1/jobs?limit=3", 0
    while url:
        r = client.get(url, headers=auth(tokens["ada"]))
        assert r.status_code == 200
        seen += [j["id"] for j in r.json()]
        url = r.links.get("next", {}).get("url")
        pages += 1
    assert seen == ids[::-1] and pages == 3
    bad = client.get("/v1/jobs", params={"after": "no-such-job"}, headers=auth(tokens["ada"]))
    assert bad.status_code == 404 and "no-such-job" in bad.json()["detail"]


def test_jobs_are_filtered_by_label_state_and_for_admins_by_user(api):
    client, tokens, _, _ = api
    lr = [client.post("/v1/jobs", json=job(f"lr{i}", labels={"sweep": "lr", "i": str(i)}),
                      headers=auth(tokens["ada"])).json()["id"] for i in range(3)]
    client.post("/v1/jobs", json=job("other", labels={"sweep": "wd"}),
                headers=auth(tokens["ada"]))
    client.post("/v1/jobs", json=job("bobs", labels={"sweep": "lr"}),
                headers=auth(tokens["bob"]))
    mine = client.get("/v1/jobs", params={"label": "sweep=lr"}, headers=auth(tokens["ada"]))
    assert [j["id"] for j in mine.json()] == lr[::-1]
    assert mine.json()[0]["labels"] == {"sweep": "lr", "i": "2"}
    both = client.get("/v1/jobs", params=[("label", "sweep=lr"), ("label", "i=1")],
                      headers=auth(tokens["ada"]))
    assert [j["id"] for j in both.json()] == [lr[1]]
    keyed = client.get("/v1/jobs", params={"label": "i"}, headers=auth(tokens["ada"]))
    assert [j["id"] for j in keyed.json()] == lr[::-1]  # the key with any value
    everyone = client.get("/v1/jobs", params={"label": "sweep=lr"}, headers=auth(tokens["root"]))
    assert len(everyone.json()) == 4
    bobs = client.get("/v1/jobs", params={"label": "sweep=lr", "user": "bob"},
                      headers=auth(tokens["root"]))
    assert [j["name"] for j in bobs.json()] == ["bobs"]
    queued = client.get("/v1/jobs", params={"state": "done"}, headers=auth(tokens["ada"]))
    assert queued.json() == []


# ---- safe retries ------------------------------------------------------------------------

def test_a_retried_submission_with_the_same_submission_id_makes_no_second_job(api):
    client, tokens, store, _ = api
    first = client.post("/v1/jobs", json=job("r", submission_id="try-7"),
                        headers=auth(tokens["ada"]))
    again = client.post("/v1/jobs", json=job("r", submission_id="try-7"),
                        headers=auth(tokens["ada"]))
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    # concurrent retries too
    results = []
    threads = [threading.Thread(target=lambda: results.append(client.post(
        "/v1/jobs", json=job("c", submission_id="burst"), headers=auth(tokens["ada"])).json()))
        for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r["id"] for r in results}) == 1
    # another user's id space is their own
    bobs = client.post("/v1/jobs", json=job("r", submission_id="try-7"),
                       headers=auth(tokens["bob"]))
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"]
    assert len(store.jobs(store.principal(tokens["root"]))) == 3
    # the same id for another spec is a mistake, not a retry
    other = client.post("/v1/jobs", json=job("r", submission_id="try-7", priority=5),
                        headers=auth(tokens["ada"]))
    assert other.status_code == 409 and "another spec" in other.json()["detail"]


# ---- users, tokens, health ---------------------------------------------------------------

def test_a_revoked_token_stops_at_once_and_a_rotated_one_replaces_it(api):
    client, tokens, _, _ = api
    assert client.get("/v1/jobs", headers=auth(tokens["bob"])).status_code == 200  # cached
    assert client.get("/v1/users", headers=auth(tokens["bob"])).status_code == 403
    assert client.post("/v1/users/bob/revoke", headers=auth(tokens["root"])).status_code == 200
    assert client.get("/v1/jobs", headers=auth(tokens["bob"])).status_code == 401
    listed = {u["name"]: u for u in client.get("/v1/users", headers=auth(tokens["root"])).json()}
    assert listed["bob"]["revoked_at"] is not None and listed["ada"]["revoked_at"] is None
    new = client.post("/v1/users/bob/rotate", headers=auth(tokens["root"])).json()["token"]
    assert client.get("/v1/jobs", headers=auth(new)).status_code == 200
    assert client.get("/v1/jobs", headers=auth(tokens["bob"])).status_code == 401
    assert client.post("/v1/users/nobody/revoke", headers=auth(tokens["root"])
                       ).status_code == 404


def test_health_and_readiness_need_no_token_and_readiness_checks_the_loop(api):
    client, _, _, service = api
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["problems"] == []
    service.backend.stop()
    until(lambda: client.get("/readyz").status_code == 503, 30, "not ready", every=0.05)
    assert "scheduler loop" in client.get("/readyz").json()["problems"][0]


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90m", 5400), ("1h30m", 5400), ("1.5h", 5400), ("2d", 172_800),
    ("05:30", 330), ("01:30:00", 5400), ("1-12", 129_600), ("1-00:00:10", 86_410)])
def test_time_limits_read_as_slurm_users_write_them(text, seconds):
    assert duration_s(text) == seconds
    assert parse(f"name: x\ncommand: [a]\ntime_limit: '{text}'").time_limit == seconds


def test_an_unreadable_time_limit_names_the_forms():
    with pytest.raises(SpecError, match="HH:MM:SS"):
        parse("name: x\ncommand: [a]\ntime_limit: soon")


def test_metrics_follow_prometheus_naming_with_counters_process_and_build_info(api):
    client, tokens, _, _ = api
    first = client.post("/v1/jobs", json=job("m", submission_id="once"),
                        headers=auth(tokens["ada"])).json()
    client.post("/v1/jobs", json=job("m", submission_id="once"), headers=auth(tokens["ada"]))
    client.post(f"/v1/jobs/{first['id']}/cancel", headers=auth(tokens["ada"]))
    text = first_ok(lambda: client.get("/metrics").text,
                    lambda t: 'gandiva_jobs_finished_total{state="cancelled"} 1.0' in t,
                    30, "the cancel counted", every=0.05)
    assert "gandiva_jobs_submitted_total 1.0" in text  # the retry made no second job
    assert "# TYPE gandiva_job_restarts_total counter" in text
    assert "# TYPE gandiva_device_utilisation_ratio gauge" in text
    assert 'gandiva_build_info{python="' in text
    assert "process_resident_memory_bytes" in text and "python_info" in text


def test_metrics_count_the_garbage_collectors_pauses_by_generation(api):
    """Every thread waits while Python collects garbage, so the pauses are the server's."""
    client, _, _, _ = api

    def full_collections() -> float:
        line = next((line for line in client.get("/metrics").text.splitlines()
                     if line.startswith('gandiva_gc_pause_seconds_count{generation="2"}')),
                    "0 0")
        return float(line.split()[-1])

    before = full_collections()
    gc.collect()
    gc.collect()
    assert full_collections() >= before + 2  # (and any the test itself set off)
