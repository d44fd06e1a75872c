"""The server's store on real databases, SQLite and PostgreSQL: users and tokens, jobs and
their events."""

import threading

import pytest
from sqlalchemy import create_engine, event, text

from gandiva.server.jobspec import JobRequest
from gandiva.server.store import Store, StoreError, database_url


@pytest.fixture
def store(db_url):
    return Store(db_url)


def job_request(name="train", **kw):
    return JobRequest(name=name, command=["python", "train.py"], **kw)


def rows(db_url, sql):
    """Read the database behind the store's back, on a connection of our own."""
    engine = create_engine(database_url(db_url))
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).fetchall()
    finally:
        engine.dispose()


def test_tokens_are_stored_hashed_and_identify_their_user(store, db_url):
    token = store.add_user("ada", admin=True)
    who = store.principal(token)
    assert who.name == "ada" and who.admin
    assert store.principal(token + "x") is None
    with pytest.raises(StoreError, match="exists already"):
        store.add_user("ada")
    for bad in ("..", "", "a/b", "../home", ".hidden", "x" * 64, "a b"):  # a directory each
        with pytest.raises(StoreError, match="user name .*: use 1-63 letters"):
            store.add_user(bad)
    [(name, token_hash)] = rows(db_url, "select name, token_hash from users")
    assert name == "ada" and token not in token_hash and len(token_hash) == 64


def test_a_lookup_that_read_a_token_before_its_revoke_does_not_cache_it(store):
    """The race: a lookup reads the user's row, the revoke commits and clears the cache,
    then the lookup would cache what it read (the token working 10 s more)."""
    token = store.add_user("ada")
    read, revoked = threading.Event(), threading.Event()

    def after(conn, cursor, statement, *args):  # the lookup's SELECT has its row
        if "FROM users" in statement and threading.current_thread().name == "lookup":
            read.set()
            revoked.wait(10)

    event.listen(store.engine, "after_cursor_execute", after)
    found = []
    lookup = threading.Thread(target=lambda: found.append(store.principal(token)),
                              name="lookup")
    lookup.start()
    assert read.wait(10)
    store.revoke("ada")
    revoked.set()
    lookup.join(10)
    event.remove(store.engine, "after_cursor_execute", after)
    assert found[0] is not None and found[0].name == "ada"  # it began before the revoke
    assert store.known(token) is None and store.principal(token) is None


def test_jobs_and_events_persist_and_users_see_only_their_own(store, db_url):
    ada = store.principal(store.add_user("ada"))
    bob = store.principal(store.add_user("bob"))
    root = store.principal(store.add_user("root", admin=True))
    a = store.submit(ada, job_request("a", gpus=2))
    b = store.submit(bob, job_request("b"))
    store.record(a, "placed", {"gpus": [0, 1]}, state="running")
    store.record(a, "finished", state="done", reason="")
    with pytest.raises(StoreError, match="is done; it cannot become running"):
        store.record(a, "placed", state="running")
    store.engine.dispose()
    reopened = Store(db_url)  # a restart: everything is still there
    assert [j.id for j in reopened.jobs(ada)] == [a]
    assert {j.id for j in reopened.jobs(root)} == {a, b}
    assert reopened.job(bob, a) is None and reopened.job(root, a).state == "done"
    job = reopened.job(ada, a)
    assert job.spec["gpus"] == 2 and job.started_at <= job.finished_at
    events = reopened.events(a)
    assert [e.kind for e in events] == ["submitted", "placed", "finished"]
    assert events[1].data == {"gpus": [0, 1]} and events[0].data == {"by": "ada"}
    assert [e.kind for e in reopened.events(a, after=events[0].id)] == ["placed", "finished"]
    assert [j.id for j in reopened.unfinished()] == [b]
    assert [j.id for j in reopened.jobs(root, states=("queued",))] == [b]


def test_a_page_of_jobs_carries_every_column_exactly_in_order(store, db_url):
    """Pages read as one row on SQLite (``Store.jobs`` there): every column as the ORM reads
    it, timestamps to the last bit, NULLs as None, newest first, with filters and cursors."""
    from sqlalchemy import select, update
    from sqlalchemy.orm import Session

    from gandiva.server.store import JobRow

    ada = store.principal(store.add_user("ada"))
    ids = [store.submit(ada, job_request(f"j{i}", gpus=1 + i % 2,
                                         labels={"team": "a" if i % 2 else "b"},
                                         submission_id=f"s{i}" if i % 3 else None))
           for i in range(7)]
    store.record(ids[1], "placed", state="running")
    store.record(ids[1], "finished", state="done", reason="ok")
    with store.engine.begin() as conn:  # two jobs in one instant: the id breaks the tie
        for i, jid in enumerate(ids):
            at = 1764779321.1234567 + (i // 2) * 5e-7
            conn.execute(update(JobRow).where(JobRow.id == jid).values(submitted_at=at))

    def orm(**where) -> list[tuple]:
        with Session(store.engine) as s:
            q = select(JobRow).where(JobRow.user_id == ada.id).order_by(
                JobRow.submitted_at.desc(), JobRow.id.desc())
            if "state" in where:
                q = q.where(JobRow.state == where["state"])
            return [cols(r) for r in s.scalars(q)]

    def cols(r) -> tuple:
        return (r.id, r.user_id, r.name, r.spec, r.state, r.reason, r.priority,
                r.submitted_at, r.started_at, r.finished_at, r.submission_id)

    every = orm()
    assert [cols(r) for r in store.jobs(ada)] == every
    assert len({c[7] for c in every}) == 4  # sub-microsecond apart: equal in 15 digits
    assert [cols(r) for r in store.jobs(ada, limit=3)] == every[:3]
    assert [cols(r) for r in store.jobs(ada, limit=3, after=every[2][0])] == every[3:6]
    assert [cols(r) for r in store.jobs(ada, states=("done",))] == orm(state="done")
    assert {r.id for r in store.jobs(ada, labels={"team": "a"})} == set(ids[1::2])
    done = store.jobs(ada, states=("done",))[0]
    assert done.started_at <= done.finished_at and done.reason == "ok"


def test_a_job_may_have_the_longest_name_a_spec_allows(store, db_url):
    ada = store.principal(store.add_user("ada"))
    name = "n" * 63
    job_id = store.submit(ada, job_request(name))
    assert store.job(ada, job_id).name == name


def test_concurrent_submissions_lose_and_duplicate_nothing(store):
    ada = store.principal(store.add_user("ada"))
    ids: list[str] = []
    lock = threading.Lock()

    def submit_many():
        for _ in range(25):
            job_id = store.submit(ada, job_request())
            with lock:
                ids.append(job_id)

    threads = [threading.Thread(target=submit_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == len(set(ids)) == 200
    assert sorted(j.id for j in store.jobs(ada)) == sorted(ids)


def test_a_reader_following_a_jobs_events_misses_none_while_they_are_written(
        store, db_url):
    """The API's ``after`` cursor: whoever polls the events after the last id it saw must
    see every event once, in order, even while the scheduler and the API both write."""
    ada = store.principal(store.add_user("ada"))
    job_id = store.submit(ada, job_request())
    writers, each = 8, 25
    seen: list[int] = []

    def write(w):
        for i in range(each):
            store.record(job_id, "progress", {"writer": w, "i": i})

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    while True:
        done = not any(t.is_alive() for t in threads)  # then one last read sees the rest
        seen += [e.id for e in store.events(job_id, after=seen[-1] if seen else 0)]
        if done:
            break
    everything = [e.id for e in store.events(job_id)]
    assert len(everything) == 1 + writers * each
    assert seen == everything


def test_acknowledged_jobs_survive_a_crash_of_postgresql_and_the_store_carries_on(postgres):
    """A database server restarts (a crash, an upgrade): what was committed is there, and
    the running server's store goes on without a failed call."""
    url = postgres.create_database()
    store = Store(url)
    ada = store.principal(store.add_user("ada"))
    ids = [store.submit(ada, job_request()) for _ in range(3)]
    store.record(ids[0], "placed", {"gpus": [0]}, state="running")
    postgres.crash_and_restart()
    after = Store(url)
    assert [j.id for j in after.jobs(ada)] == ids[::-1]  # newest first
    assert after.job(ada, ids[0]).state == "running"
    assert [e.kind for e in after.events(ids[0])] == ["submitted", "placed"]
    store.record(ids[0], "finished", state="done")  # the store that was open all along
    assert [j.id for j in store.unfinished()] == ids[1:]
