"""The server's writer: the scheduler's loop goes on deciding while its database is slow or
away, and what it decided is stored, in order, once the database takes writes again; a
clean shutdown stores what is queued. On real databases: a SQLite file another process holds
locked (slow), and a PostgreSQL database that refuses every connection (away)."""

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gandiva.backends.driver import Driver
from gandiva.backends.nodes import AgentEvent
from gandiva.policies import make_policy
from gandiva.server import store as store_module
from gandiva.server.app import create_app
from gandiva.server.jobspec import JobRequest
from gandiva.server.persistence import Batch, Writer
from gandiva.server.service import Service
from gandiva.server.store import JobChange, Store
from gandiva.spec import TERMINAL

WAIT_S = 60  # for what the loop does with real processes


@contextmanager
def database_away(db_url: str):
    """SQLite: another connection holds the write lock (writers wait, readers read).
    PostgreSQL: the database refuses connections, and the open ones are ended."""
    if db_url.startswith("sqlite"):
        import sqlite3

        holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    import psycopg

    server, name = db_url.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s", (name,))
        try:
            yield
        finally:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")


class Server:
    """A server's parts in this process: the store, a fifo loop on one slot, the service;
    ``reported`` is every job change in the order the loop reported it."""

    def __init__(self, tmp: Path, db_url: str, zygote) -> None:
        self.store = Store(db_url)
        self.backend = Driver(make_policy("fifo"), tmp / "work", slots=1, zygote=zygote)
        self.service = Service(self.store, self.backend, tmp / "base")
        self.reported: list[tuple[str, str]] = []
        stores = self.backend.on_change

        def report(rec, what: str) -> None:
            self.reported.append((rec.spec.id, what))
            stores(rec, what)

        self.backend.on_change = report
        self.ada = self.store.principal(self.store.add_user("ada"))
        self.root = self.store.principal(self.store.add_user("root", admin=True))
        self.service.user_dir(self.ada).mkdir(parents=True)
        self.loop = threading.Thread(target=self.backend.run, kwargs={"until_idle": False})
        self.loop.start()

    def client(self, user: str) -> tuple[TestClient, dict[str, str]]:
        """An API client and the headers of a new user whose token the server has seen."""
        token = self.store.add_user(user)
        self.service.user_dir(self.store.principal(token)).mkdir(parents=True)
        client = TestClient(create_app(self.service))
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/v1/whoami", headers=auth).status_code == 200  # token known
        return client, auth

    def submit(self, name: str, *command: str) -> str:
        return self.service.submit(self.ada, JobRequest(name=name, command=list(command))).id

    def waiting(self, n: int) -> tuple[str, list[str]]:
        """A job holding the only slot, and ``n`` quick ones queued behind it; everything
        so far stored."""
        blocker = self.submit("blocker", "sleep", "300")
        queued = [self.submit(f"quick{i}", "true") for i in range(n)]
        writer = self.service.writer
        assert writer.wait(lambda: self.backend.records[blocker].status == "running", WAIT_S)
        assert writer.flush(WAIT_S)
        return blocker, queued

    def decided(self, *job_ids: str) -> bool:
        """Has the loop seen every one of these jobs end?"""
        return all(self.backend.records[j].status in TERMINAL for j in job_ids)

    def stored(self) -> list[tuple[str, str]]:
        """Every job event the loop reported, as stored, in the order stored."""
        return [(e.job_id, e.kind) for e in self.store.all_events(self.root, 0, 10_000)
                if e.kind not in ("submitted", "cancel-requested")]

    def stop(self) -> None:
        self.backend.stop()
        self.loop.join(timeout=WAIT_S)


@pytest.fixture
def server(zygote, tmp_path, db_url):
    srv = Server(tmp_path, db_url, zygote)
    yield srv
    srv.stop()
    srv.service.close(timeout=10)


def test_the_loop_decides_while_the_database_is_away_and_its_changes_land_in_order(
        server, db_url):
    """Three jobs wait behind one that holds the only slot; with the database away, the
    first is cancelled: the loop starts and ends the other three, one after the other,
    with nothing stored meanwhile; once the database is back, every change it reported is
    stored, in the order reported."""
    blocker, queued = server.waiting(3)
    writer = server.service.writer
    with database_away(db_url):
        server.backend.cancel(blocker)
        assert writer.wait(lambda: server.decided(blocker, *queued), WAIT_S)
        assert [server.backend.records[j].status for j in queued] == ["done"] * 3
        assert writer.queued() > 0
        scraped = server.service.metrics.scrape().decode()
        assert "gandiva_store_writes_queued " in scraped
        assert "gandiva_store_writes_queued 0.0" not in scraped
        if db_url.startswith("sqlite"):  # readers still read: the last stored state
            assert server.store.job(server.ada, queued[0]).state == "queued"
        else:  # every try fails: not ready, and /readyz says why
            assert writer.wait(lambda: writer.retries > 0, WAIT_S)
            assert not writer.healthy()
            ready = TestClient(create_app(server.service)).get("/readyz")
            assert ready.status_code == 503
            assert any(p.startswith("store writes: ") for p in ready.json()["problems"])
    assert server.service.flush(WAIT_S)
    assert writer.queued() == 0 and writer.healthy()
    assert server.stored() == server.reported
    assert [server.store.job(server.ada, j).state for j in queued] == ["done"] * 3
    assert server.store.job(server.ada, blocker).state == "cancelled"


def test_a_request_the_database_cannot_take_is_answered_503_and_a_retry_makes_one_job(
        server, db_url):
    """With the database away a submission is not acknowledged: 503 with Retry-After, and
    nothing is stored; the client's retry, once the database is back, makes the job, and a
    second retry of the same submission_id finds it. Each 503 is counted."""
    client, auth = server.client("bea")
    body = {"name": "retried", "command": ["true"], "submission_id": "bea-1"}
    with database_away(db_url):
        away = client.post("/v1/jobs", json=body, headers=auth)
        assert away.status_code == 503, away.text
        assert away.headers["Retry-After"] == "5"
        assert "this request is not done" in away.json()["detail"]
    assert client.get("/v1/jobs", headers=auth).json() == []
    made = client.post("/v1/jobs", json=body, headers=auth)
    again = client.post("/v1/jobs", json=body, headers=auth)
    assert (made.status_code, again.status_code) == (201, 200)
    assert made.json()["id"] == again.json()["id"]
    assert [j["id"] for j in client.get("/v1/jobs", headers=auth).json()] == [made.json()["id"]]
    assert "gandiva_requests_store_unavailable_total 1.0" in (
        server.service.metrics.scrape().decode())


def test_a_hung_database_holds_no_request_and_no_decision_and_nothing_is_lost(
        zygote, postgres, tmp_path, monkeypatch):
    """PostgreSQL frozen (every process SIGSTOPped: connections open, nothing answers): the
    loop decides on, /readyz says the store does not answer within its probe time, a
    submission is answered 503 once its stuck connection is cut (STUCK_S) rather than
    waiting for the database; thawed, the retry makes the job and every change the loop
    reported is stored in order."""
    monkeypatch.setattr(store_module, "STUCK_S", 3.0)
    srv = Server(tmp_path, postgres.create_database(), zygote)
    try:
        client, auth = srv.client("bea")
        body = {"name": "during", "command": ["true"], "submission_id": "bea-frozen"}
        blocker, (quick,) = srv.waiting(1)
        with postgres.frozen():
            ready = client.get("/readyz")
            assert ready.status_code == 503 and "store: no answer" in ready.text, ready.text
            srv.backend.cancel(blocker)
            assert srv.service.writer.wait(lambda: srv.decided(blocker, quick), WAIT_S)
            started = time.monotonic()
            away = client.post("/v1/jobs", json=body, headers=auth)
            assert away.status_code == 503, away.text
            assert time.monotonic() - started < 3.0 + 10  # cut, not held until thawed
        made = client.post("/v1/jobs", json=body, headers=auth)
        assert made.status_code in (200, 201), made.text
        assert srv.service.writer.wait(lambda: srv.decided(made.json()["id"]), WAIT_S)
        assert srv.service.flush(WAIT_S)
        assert srv.stored() == srv.reported
        assert [j["state"] for j in client.get("/v1/jobs", headers=auth).json()] == ["done"]
        assert client.get("/readyz").status_code == 200
    finally:
        srv.stop()
        srv.service.close(timeout=10)


def test_a_submission_stored_by_a_commit_whose_answer_was_lost_is_queued_by_its_retry(
        server):
    """A commit cut off as it committed can land when the database thaws, after the client
    was answered 503: the job is stored, the scheduler never had it. The client's retry
    with the same submission_id gives the job to the scheduler (once), and it runs."""
    request = JobRequest(name="landed", command=["true"], submission_id="ada-cut")
    row = server.store.add_job(server.ada, request)  # stored; the answer never came back
    assert not server.backend.has(row.id)
    again = server.service.submit(server.ada, request)
    assert again.id == row.id and server.backend.has(row.id)
    assert server.service.submit(server.ada, request).id == row.id  # queued once
    assert server.service.writer.wait(lambda: server.decided(row.id), WAIT_S)
    assert server.backend.records[row.id].status == "done"


def test_a_lost_node_s_job_is_requeued_with_an_event_that_says_which_node_and_a_count(
        server):
    """As a node backend reports a machine gone (Ray's, for a dead node or a silent agent):
    the job goes back to the queue, its stored event names the node, Prometheus counts it."""
    job_id = server.submit("long", "sleep", "300")
    writer = server.service.writer
    assert writer.wait(lambda: server.backend.records[job_id].status == "running", WAIT_S)
    server.backend.agent.events.put(AgentEvent("node-lost", "", {"node": 0,
                                                                 "jobs": [job_id]}))
    assert writer.wait(lambda: (job_id, "node-lost") in server.stored(), WAIT_S)
    (lost,) = [e for e in server.store.all_events(server.root, 0, 10_000)
               if e.job_id == job_id and e.kind == "node-lost"]
    assert lost.data["reason"] == "node 0 was lost"
    assert server.store.job(server.ada, job_id).state == "queued"  # as the loop has it
    assert "gandiva_jobs_node_lost_total 1.0" in server.service.metrics.scrape().decode()


def test_a_checkpoint_the_disk_refuses_is_an_event_and_a_count_and_the_job_ends_done(
        server, tmp_path):
    """The job's disk refuses its final checkpoint (its file-size limit, lowered at start
    under the checkpoint's size and over its log's):
    the job ends done, the refusal is stored as an event of the job with its reason,
    Prometheus counts it and /readyz warns of it (still ready)."""
    script = server.service.user_dir(server.ada) / "full.py"
    script.write_text("import resource, signal, torch\n"
                      "import gandiva.job as gj\n"
                      "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                      "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.RLIM_INFINITY))\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(64, 64))  # 16 KB: over the limit\n"
                      "for step in job.steps(5):\n"
                      "    pass\n")
    job_id = server.submit("full", "{python}", "full.py")
    writer = server.service.writer
    assert writer.wait(lambda: server.decided(job_id), WAIT_S)
    assert server.service.flush(WAIT_S)
    assert server.store.job(server.ada, job_id).state == "done"
    refused = [e for e in server.store.all_events(server.root, 0, 10_000)
               if e.job_id == job_id and e.kind == "checkpoint-refused"]
    assert len(refused) == 1 and "training goes on" in refused[0].data["reason"]
    assert "gandiva_checkpoints_refused_total 1.0" in server.service.metrics.scrape().decode()
    ready = TestClient(create_app(server.service)).get("/readyz")
    assert ready.status_code == 200  # the server still takes and schedules work
    assert "1 refused by a disk" in ready.json()["warnings"][0]


def test_a_clean_shutdown_stores_what_is_queued_once_the_database_takes_it(server, db_url):
    """The loop stops while the database is away; closing, once it is back, stores every
    change queued."""
    blocker, jobs = server.waiting(2)
    writer = server.service.writer
    with database_away(db_url):
        server.backend.cancel(blocker)
        assert writer.wait(lambda: server.decided(blocker, *jobs), WAIT_S)
        server.stop()
        assert writer.queued() > 0
    # (the database is back now; the close below finds it)
    assert server.service.close(timeout=WAIT_S)
    assert writer.queued() == 0 and writer.dropped == 0
    assert server.stored() == server.reported
    assert {server.store.job(server.ada, j).state for j in jobs} == {"done"}


def test_a_close_the_database_never_comes_back_for_ends_in_time_and_says_what_was_lost(
        server, db_url, caplog):
    blocker, (job,) = server.waiting(1)
    writer = server.service.writer
    with database_away(db_url):
        server.backend.cancel(blocker)
        assert writer.wait(lambda: server.decided(blocker, job), WAIT_S)
        server.stop()
        left = writer.queued()
        assert left > 0
        assert not server.service.close(timeout=0.5)
    assert writer.dropped == left
    assert f"closed with {left} writes not stored" in caplog.text


def test_a_write_the_database_refuses_for_what_it_holds_is_dropped_and_the_rest_land(
        tmp_path, db_url):
    """A metric point of a job that does not exist breaks a foreign key: retrying it would
    never succeed, and must not hold back the writes queued behind it."""
    store = Store(db_url)
    ada = store.principal(store.add_user("ada"))
    job = store.add_job(ada, JobRequest(name="a", command=["true"])).id
    writer = Writer(store)
    try:
        writer.put(Batch(changes=[JobChange(job, "running", state="running")]))
        writer.put(Batch(points=[{"job_id": "no-such-job", "name": "loss", "step": 1,
                                  "value": 1.0, "at": 0.0}]))
        writer.put(Batch(changes=[JobChange(job, "done", state="done")],
                         points=[{"job_id": job, "name": "loss", "step": 1, "value": 0.5,
                                  "at": 0.0}]))
        assert writer.flush(WAIT_S)
        assert writer.dropped == 1
        assert [e.kind for e in store.events(job)] == ["submitted", "running", "done"]
        assert store.points(job) == {"loss": [(1, 0.5, 0.0)]}
    finally:
        writer.close(timeout=10)
