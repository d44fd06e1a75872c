"""Teams: an admin makes them, gives them tickets and a quota, and moves users into them;
a member may not; a bad spec is refused naming its field; databases made before teams are
migrated with every user in no team and one ticket."""

import os
import threading
from contextlib import contextmanager

import pytest
from serving import in_process
from sqlalchemy import create_engine, text

pytest.importorskip("torch")
from fastapi.testclient import TestClient  # noqa: E402

from gandiva.backends.driver import Driver  # noqa: E402
from gandiva.policies import make_policy  # noqa: E402
from gandiva.server.app import Service, create_app  # noqa: E402
from gandiva.server.store import Store  # noqa: E402


@pytest.fixture
def api(zygote, tmp_path):
    store = Store(str(tmp_path / "gandiva.db"))
    backend = Driver(make_policy("fifo"), tmp_path / "work", slots=1, zygote=zygote)
    service = Service(store, backend, tmp_path / "base")
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    tokens = {n: store.add_user(n, admin=(n == "root")) for n in ("ada", "bob", "root")}
    yield TestClient(create_app(service), raise_server_exceptions=False), tokens, service
    backend.stop()
    loop.join(timeout=30)


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def test_an_admin_makes_teams_and_moves_users_into_them(api):
    client, tokens, service = api
    root = auth(tokens["root"])
    r = client.post("/v1/teams", json={"name": "vision", "tickets": 3, "quota_gpus": 8},
                    headers=root)
    assert r.status_code == 201, r.text
    assert r.json() == {"name": "vision", "tickets": 3, "quota_gpus": 8, "members": []}
    client.post("/v1/teams", json={"name": "speech"}, headers=root)
    r = client.patch("/v1/users/ada", json={"team": "vision", "tickets": 2}, headers=root)
    assert r.status_code == 200 and (r.json()["team"], r.json()["tickets"]) == ("vision", 2)
    client.patch("/v1/users/bob", json={"team": "vision"}, headers=root)
    teams = {t["name"]: t for t in client.get("/v1/teams", headers=root).json()}
    assert teams["vision"]["members"] == ["ada", "bob"] and teams["speech"]["members"] == []
    assert teams["speech"]["tickets"] == 1 and teams["speech"]["quota_gpus"] is None
    # what a change leaves out stays; null takes the quota away; a user leaves with null
    r = client.patch("/v1/teams/vision", json={"quota_gpus": None}, headers=root)
    assert (r.json()["tickets"], r.json()["quota_gpus"]) == (3, None)
    r = client.patch("/v1/users/bob", json={"team": None}, headers=root)
    assert r.json()["team"] is None and r.json()["tickets"] == 1
    users = {u["name"]: u for u in client.get("/v1/users", headers=root).json()}
    assert users["ada"]["team"] == "vision" and users["bob"]["team"] is None


def test_the_scheduler_sees_each_change_of_tickets_at_once(api):
    client, tokens, service = api
    root = auth(tokens["root"])
    client.post("/v1/teams", json={"name": "vision", "tickets": 3}, headers=root)
    client.patch("/v1/users/ada", json={"team": "vision", "tickets": 2}, headers=root)
    shares = service.backend.cluster.shares
    assert shares.of("ada") == ("vision", 3.0, 2.0)
    assert shares.of("bob") == ("bob", 1.0, 1.0)  # in no team: a team of its own
    client.patch("/v1/teams/vision", json={"tickets": 5}, headers=root)
    assert service.backend.cluster.shares.of("ada") == ("vision", 5.0, 2.0)


def test_a_member_may_not_manage_teams(api):
    client, tokens, service = api
    ada = auth(tokens["ada"])
    for method, path, body in (("GET", "/v1/teams", None),
                               ("POST", "/v1/teams", {"name": "mine"}),
                               ("PATCH", "/v1/teams/mine", {"tickets": 100}),
                               ("PATCH", "/v1/users/ada", {"tickets": 100})):
        r = client.request(method, path, json=body, headers=ada)
        assert r.status_code == 403, (method, path)
        assert "admin" in r.json()["detail"]


@pytest.mark.parametrize("path,body,field", [
    ("/v1/teams", {"name": "t", "tickets": 0}, "tickets"),
    ("/v1/teams", {"name": "t", "tickets": 10**7}, "tickets"),
    ("/v1/teams", {"name": "t", "quota_gpus": -1}, "quota_gpus"),
    ("/v1/teams", {"name": "t", "quota_gpus": "eight"}, "quota_gpus"),
    ("/v1/teams", {"name": "a/../b"}, "name"),
    ("/v1/teams", {"name": "t", "weight": 2}, "weight"),
])
def test_a_bad_team_spec_is_refused_naming_its_field(api, path, body, field):
    client, tokens, service = api
    r = client.post(path, json=body, headers=auth(tokens["root"]))
    assert r.status_code == 422, r.text
    assert any(e["loc"][:2] == ["body", field] for e in r.json()["detail"]), r.json()


def test_unknown_names_and_a_second_team_of_a_name_are_refused(api):
    client, tokens, service = api
    root = auth(tokens["root"])
    assert client.post("/v1/teams", json={"name": "nlp"}, headers=root).status_code == 201
    r = client.post("/v1/teams", json={"name": "nlp"}, headers=root)
    assert r.status_code == 409 and "exists" in r.json()["detail"]
    r = client.patch("/v1/users/ada", json={"team": "nope"}, headers=root)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "team"]
    assert "team add" in r.json()["detail"][0]["msg"]
    assert client.patch("/v1/teams/nope", json={"tickets": 2}, headers=root).status_code == 404
    assert client.patch("/v1/users/nobody", json={"tickets": 2},
                        headers=root).status_code == 404
    assert client.get("/v1/teams", headers=root).json()[0]["members"] == []


@contextmanager
def at_revision(db_url: str, revision: str):
    """A connection to a database migrated up to ``revision`` only (as an older server left
    it); what the test writes on it is committed, then ``Store`` migrates it to the head."""
    from alembic import command
    from alembic.config import Config

    from gandiva.server import store as store_module

    cfg = Config()
    cfg.set_main_option("script_location", os.path.join(os.path.dirname(
        store_module.__file__), "migrations"))
    engine = create_engine(db_url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        yield conn
    engine.dispose()


def test_a_database_made_before_teams_is_migrated_users_in_no_team(db_url):
    with at_revision(db_url, "0005") as conn:
        conn.execute(text("INSERT INTO users (name, token_hash, admin, created_at, uid) "
                          "VALUES ('old', 'h', false, 0, 61184)"))
    store = Store(db_url)
    old = next(u for u in store.users() if u.name == "old")
    assert (old.team, old.tickets) == (None, 1)
    store.add_team("vision")
    assert store.set_user("old", team="vision").team == "vision"


def test_the_migration_clamps_members_unfinished_jobs_to_the_ceiling_with_an_event(db_url):
    with at_revision(db_url, "0006") as conn:
        conn.execute(text("INSERT INTO users (id, name, token_hash, admin, created_at, uid) "
                          "VALUES (1, 'ada', 'h1', false, 0, 61184), "
                          "(2, 'root', 'h2', true, 0, 61185)"))
        for job, user, state, priority in (("high", 1, "queued", 90), ("low", 1, "held", 7),
                                           ("done", 1, "done", 90), ("admin", 2, "running", 90)):
            conn.execute(text(
                "INSERT INTO jobs (id, user_id, name, spec, state, reason, priority, "
                "submitted_at) VALUES (:id, :user, :id, '{}', :state, '', :priority, 0)"),
                {"id": job, "user": user, "state": state, "priority": priority})
        for sweep, user in (("s-ada", 1), ("s-root", 2)):
            conn.execute(text("INSERT INTO sweeps (id, user_id, name, spec, created_at) VALUES "
                              "(:id, :user, 's', :spec, 0)"),
                         {"id": sweep, "user": user, "spec": '{"name": "s", "priority": 80}'})
    store = Store(db_url)
    root = store.owner("admin")
    rows = {j: store.job(root, j) for j in ("high", "low", "done", "admin")}
    assert {j: r.priority for j, r in rows.items()} == \
        {"high": 50, "low": 7, "done": 90, "admin": 90}
    events = [(e.kind, e.data["from"], e.data["to"]) for e in store.events("high")]
    assert events == [("priority-clamped", 90, 50)]
    assert store.events("admin") == [] and store.events("done") == []
    # a member's sweep would raise its trials from its own priority again: it comes down too
    assert {r.id: r.spec["priority"] for r in store.sweeps(unfinished=False)} == \
        {"s-ada": 50, "s-root": 80}


def test_the_cli_makes_a_team_and_adds_a_user_to_it(zygote, tmp_path):
    from typer.testing import CliRunner

    from gandiva.cli import app as cli

    home = tmp_path / "home"
    with in_process(home, zygote, users=("ada",)) as server:
        def gandiva(*args: str):
            umask = os.umask(0o022)
            try:
                return CliRunner().invoke(cli, [*args, *(
                    ["--url", server.url, "--token", server.tokens["root"]]
                    if args[:2] != ("user", "add") else [])])
            finally:  # `user add` sets its process's umask (0o077): not this worker's, whose
                os.umask(umask)  # later tests make files for jobs run as other accounts

        assert gandiva("team", "add", "vision", "--tickets", "3",
                       "--quota-gpus", "4").exit_code == 0
        made = gandiva("user", "add", "cy", "--home", str(home), "--team", "vision",
                       "--tickets", "2")
        assert made.exit_code == 0, made.output
        assert gandiva("user", "set", "ada", "--team", "vision").exit_code == 0
        listed = gandiva("team", "list")
        assert listed.exit_code == 0
        assert "vision" in listed.output and "ada, cy" in listed.output
        bad = gandiva("team", "set", "vision", "--tickets", "0")
        assert bad.exit_code == 2 and "tickets" in bad.output
        missing = gandiva("user", "add", "dee", "--home", str(home), "--team", "nope")
        assert missing.exit_code != 0 and "no team 'nope'" in missing.output
