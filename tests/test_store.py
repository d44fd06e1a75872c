"""The server's store on a real SQLite database: users and tokens, jobs and their events."""

import sqlite3
import threading

import pytest

from gandiva.server.jobspec import JobRequest
from gandiva.server.store import Store, StoreError


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "gandiva.db"))


def request(name="train", **kw):
    return JobRequest(name=name, command=["python", "train.py"], **kw)


def test_tokens_are_stored_hashed_and_identify_their_user(store, tmp_path):
    token = store.add_user("ada", admin=True)
    who = store.principal(token)
    assert who.name == "ada" and who.admin
    assert store.principal(token + "x") is None
    with pytest.raises(StoreError, match="exists already"):
        store.add_user("ada")
    rows = sqlite3.connect(tmp_path / "gandiva.db").execute(
        "select name, token_hash from users").fetchall()
    assert rows[0][0] == "ada" and token not in rows[0][1] and len(rows[0][1]) == 64


def test_jobs_and_events_persist_and_users_see_only_their_own(store, tmp_path):
    ada = store.principal(store.add_user("ada"))
    bob = store.principal(store.add_user("bob"))
    root = store.principal(store.add_user("root", admin=True))
    a = store.submit(ada, request("a", gpus=2))
    b = store.submit(bob, request("b"))
    store.record(a, "placed", {"gpus": [0, 1]}, state="running")
    store.record(a, "finished", state="done", reason="")
    with pytest.raises(StoreError, match="is done; it cannot become running"):
        store.record(a, "placed", state="running")
    reopened = Store(str(tmp_path / "gandiva.db"))  # a restart: everything is still there
    assert [j.id for j in reopened.jobs(ada)] == [a]
    assert {j.id for j in reopened.jobs(root)} == {a, b}
    assert reopened.job(bob, a) is None and reopened.job(root, a).state == "done"
    job = reopened.job(ada, a)
    assert job.spec["gpus"] == 2 and job.started_at <= job.finished_at
    assert [e.kind for e in reopened.events(a)] == ["submitted", "placed", "finished"]
    assert [j.id for j in reopened.unfinished()] == [b]
    assert [j.id for j in reopened.jobs(root, states=("queued",))] == [b]


def test_concurrent_submissions_lose_and_duplicate_nothing(store):
    ada = store.principal(store.add_user("ada"))
    ids: list[str] = []
    lock = threading.Lock()

    def submit_many():
        for _ in range(25):
            job_id = store.submit(ada, request())
            with lock:
                ids.append(job_id)

    threads = [threading.Thread(target=submit_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == len(set(ids)) == 200
    assert sorted(j.id for j in store.jobs(ada)) == sorted(ids)
