"""The REST API under schema-driven fuzzing (schemathesis), and the security properties it
must keep whatever it is sent.

The scheduler's loop is never started, and the agent keeps no warm processes: fuzzed
submissions are stored and queued, and no command ever runs on this machine.

What the fuzzing found (each fixed, and pinned by a test at the end of this file): event
ids past 32 bits, a Last-Event-ID that is no number, NUL in arguments and ids, over-long
and looping workdirs, NaN in bodies (all 500s); paths hidden in --flag=value; names ending
in a newline; and places where the document did not say what the API does.
"""

import collections
import functools
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest
import requests
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from gandiva.backends import driver as local
from gandiva.node.agent import Agent
from gandiva.policies import make_policy
from gandiva.server import app as app_module
from gandiva.server.app import Service, create_app
from gandiva.server.store import Principal, Store

USERS = ("ada", "bob", "root")  # root is the admin
STREAM_WAIT_S = 0.2  # how long a fuzzed call waits on a stream that does not end by itself
CALL_TIMEOUT_S = 60.0
NAME_MAX, PATH_MAX = 255, 4096  # bytes in a path's component, and in a path (Linux)
EVENT_ID_MAX = 2**31 - 1  # events.id is a 32-bit INTEGER on PostgreSQL
FUZZ = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

# ---- the server under test -------------------------------------------------------------


@dataclass
class World:
    """A server over a fresh database, its users (each with a base directory holding
    ``sub/`` and ``train.py``), and jobs seeded for ada and bob (queued, held, cancelled).
    ``fuzzer`` is the user the fuzzed calls are made as."""

    service: Service
    client: TestClient
    tokens: dict[str, str]
    fuzzer: str
    db: str
    jobs: dict[str, list[str]] = field(default_factory=dict)  # user -> seeded job ids

    def auth(self, who: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who or self.fuzzer]}"}

    def principal(self, who: str) -> Principal:
        return self.service.store.principal(self.tokens[who])

    def home(self, who: str) -> Path:
        return self.service.user_dir(self.principal(who))

    @property
    def seeded(self) -> set[str]:
        return {j for ids in self.jobs.values() for j in ids}


def build_world(tmp: Path, db_url: str, fuzzer: str, db: str) -> World:
    store = Store(db_url)
    backend = local.Driver(make_policy("gandiva"), tmp / "work", slots=2)
    service = Service(store, backend, tmp / "base")
    tokens = {name: store.add_user(name, admin=(name == "root")) for name in USERS}
    world = World(service, TestClient(create_app(service), raise_server_exceptions=False),
                  tokens, fuzzer, db)
    for name in USERS:
        home = world.home(name)
        (home / "sub").mkdir(parents=True)
        (home / "train.py").write_text("raise SystemExit('never run')\n")
        (home / "out").symlink_to(home.parent)  # a way out of it, to be refused
    for name in ("ada", "bob"):
        ids = []
        for i in range(3):
            r = world.client.post("/v1/jobs", headers=world.auth(name), json={
                "name": f"{name}{i}", "command": ["python", "../train.py"], "workdir": "sub"})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        for p in range(10):  # more events than a fuzzed event stream waits for
            world.client.patch(f"/v1/jobs/{ids[0]}", json={"priority": p},
                               headers=world.auth(name))
        # what the loop would have stored: one job held by its user, one cancelled
        store.record(ids[1], "held", state="held")
        store.record(ids[2], "cancelled", state="cancelled", reason="cancelled")
        log = backend.agent.job_dir(ids[0]) / "rank0.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"step 1\nstep 2\n\xff\xfe not UTF-8\n")
        world.jobs[name] = ids
    return world


pytestmark = pytest.mark.xdist_group("fuzz")  # its three servers made once, on one worker


@pytest.fixture(scope="module", params=[("ada", "sqlite"), ("root", "sqlite"),
                                        ("ada", "postgresql")],
                ids=lambda p: "-".join(p))
def world(request, tmp_path_factory):
    fuzzer, db = request.param
    tmp = tmp_path_factory.mktemp(f"{fuzzer}-{db}")
    url = (f"sqlite:///{tmp / 'gandiva.db'}" if db == "sqlite"
           else request.getfixturevalue("postgres").create_database())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_module, "FOLLOW_POLL_S", 0.05)
        mp.setattr(local, "Agent", functools.partial(Agent, warm=False))
        w = build_world(tmp, url, fuzzer, db)
        yield w
        w.service.backend.agent.close()
        w.service.store.engine.dispose()


def path_values(arg: str) -> list[str]:
    """What in a command argument may name a path: the argument, and the value of a
    ``--flag=value``."""
    return [arg, arg.partition("=")[2]] if "=" in arg else [arg]


def climbs(value: str) -> bool:
    """Whether a path is absolute or has a ``..``: the paths that are checked."""
    return PurePosixPath(value).is_absolute() or ".." in PurePosixPath(value).parts


def confined(spec: dict, home: Path) -> bool:
    """Whether a stored job's directory, and every path in its command that is absolute or
    has a ``..``, resolve inside ``home``."""
    base = home.resolve()
    cwd = (base / spec["workdir"]).resolve()
    return cwd.is_relative_to(base) and all(
        (cwd / value).resolve().is_relative_to(base)
        for arg in spec["command"] for value in path_values(arg) if value and climbs(value))


def climbs_in_a_flag(arg) -> bool:
    """``--data=/elsewhere``, ``--data=../..``: test_paths_in_flag_values_are_checked_too."""
    return isinstance(arg, str) and "=" in arg and climbs(arg.partition("=")[2])


# ---- schema-driven fuzzing -------------------------------------------------------------

# The OpenAPI document depends on the routes only, not on the service behind them.
schema = schemathesis.openapi.from_dict(create_app(SimpleNamespace(store=None)).openapi())

# Checks not run, by operation ("*": all). A submission that fits the schema may still be
# refused (422) for what no schema can state: its workdir must exist in the user's base
# directory, it may not ask for more GPUs than the cluster has or set a reserved variable;
# a sweep's command may name only parameters of its space, and each trial must be a job;
# a usage question's times are durations or ISO dates, reach back at most 400 days and come in
# at most 2,000 windows.
EXCLUDED_CHECKS = {"POST /v1/jobs": [checks.positive_data_acceptance],
                   "POST /v1/sweeps": [checks.positive_data_acceptance],
                   "GET /v1/usage": [checks.positive_data_acceptance]}


def checks_not_run(case) -> list:
    """The checks ``case`` is not validated with: excluded, or failing on a known bug."""
    label = f"{case.method.upper()} {case.path}"
    return [c for table in (EXCLUDED_CHECKS,)
            for c in table.get("*", []) + table.get(label, [])]


def strings(value) -> Iterator[str]:
    """Every string in a generated value, keys too."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings(v)


def number(value) -> float:
    """A query value as the API reads it (5, "5", "5.0"); 0 if it is no number."""
    for kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError, OverflowError):
            pass
    return 0


def steer(case, world: World) -> None:
    """Past the first gate: point half of the generated job ids at seeded jobs (the
    fuzzer's, another user's, held, cancelled), and give half of the submissions a valid
    name and an existing workdir. Chosen by the generated case itself, so runs repeat; and
    only where the case fits the schema (a part the fuzzer broke on purpose stays broken)."""
    seed = zlib.crc32(repr((case.path_parameters, case.query, case.body)).encode())

    def pick(value, choices):
        i = seed % (2 * len(choices))
        return choices[i] if i < len(choices) else value

    def fits(location: str) -> bool:
        info = case.meta.components.get(location) if case.meta else None
        return info is None or info.mode.is_positive

    if case.path_parameters and "job_id" in case.path_parameters and fits("path"):
        job_id = case.path_parameters["job_id"]
        case.path_parameters["job_id"] = pick(job_id, sorted(world.seeded))
    if isinstance(case.body, dict) and isinstance(case.body.get("name"), str) and fits("body"):
        case.body["name"] = pick(case.body["name"], ["fuzzed"])
        if "workdir" in case.body:
            case.body["workdir"] = pick(case.body["workdir"], [".", "sub", "sub/", "./sub"])


def fill(path: str, job_id: str) -> str:
    """An operation's path with its parameters: the job, the user bob, a sweep of nobody's."""
    return path.format(job_id=job_id, name="bob", sweep_id="nobody-1234")


def follows_a_live_log(case, world: World) -> bool:
    """Whether the call follows the log of a job the fuzzer may see that has not ended:
    its answer goes on until the job ends, which it never will (nothing runs)."""
    follow = str((case.query or {}).get("follow", "")).lower() in ("true", "1", "yes", "on")
    if not (case.path.endswith("/logs") and follow):
        return False
    row = world.service.store.job(world.principal(world.fuzzer),
                                  str(case.path_parameters["job_id"]))
    return row is not None and row.state not in ("done", "failed", "cancelled")


@schema.parametrize()
@FUZZ
def test_every_operation_answers_within_its_schema(case, world):
    """No 5xx, no crash; statuses, content types, headers and bodies as documented; and
    every accepted submission is confined to the fuzzer's base directory."""
    steer(case, world)
    # an event stream is cut at the timeout and what came is checked; a followed log is not
    endless = follows_a_live_log(case, world)
    streams = endless or case.path == "/v1/events/stream"
    try:
        response = case.call_and_validate(
            headers=world.auth(), app=world.client.app, excluded_checks=checks_not_run(case),
            timeout=STREAM_WAIT_S if streams else CALL_TIMEOUT_S)
    except requests.exceptions.ReadTimeout:
        assert endless
        return
    if case.method == "POST" and case.path == "/v1/jobs" and response.status_code == 201:
        row = world.service.store.job(world.principal(world.fuzzer), response.json()["id"])
        assert confined(row.spec, world.home(world.fuzzer)), row.spec
    if case.method == "POST" and case.path == "/v1/sweeps" and response.status_code == 201:
        for trial in response.json()["trials"]:  # every trial is a job, confined as one
            row = world.service.store.job(world.principal(world.fuzzer), trial["job_id"])
            assert confined(row.spec, world.home(world.fuzzer)), row.spec


# ---- security properties ---------------------------------------------------------------

OPERATIONS = [(method.upper(), path) for path, ops in schema.raw_schema["paths"].items()
              for method in ops]
PER_JOB = [(m, p) for m, p in OPERATIONS if "{job_id}" in p]
# what a path is made of when someone tries to leave their directory
PIECES = st.sampled_from(["..", ".", "...", "sub", "train.py", "out", "out/bob", "~", "",
                          "ada", "bob", "users", "%2e%2e", "..\\..", " ..", "../"])
PATHS = st.tuples(st.sampled_from(["", "/", "./", "//", "~/"]),
                  st.lists(PIECES | st.text(max_size=4), max_size=6).map("/".join)
                  ).map("".join)
WORKDIRS = st.sampled_from([".", "sub", "./sub/", "out", "out/bob", "out/ada/sub"]) | PATHS
ARGUMENTS = (st.sampled_from([
    "python", "../train.py", "sub/../train.py", "../../bob/train.py", "out/../train.py",
    "/etc/passwd", "../out/bob/train.py", "--data=x", "--data=sub/../x"]) | PATHS).filter(
    lambda a: "\x00" not in a and not climbs_in_a_flag(a))  # known bugs, tested below


def test_a_submission_is_refused_or_confined_to_its_users_directory(world):
    """Whatever its workdir and arguments: refused (422), or stored with its directory,
    and every argument that is a path, inside the user's base directory (symlinks
    followed)."""
    outcomes = collections.Counter()

    @given(workdir=WORKDIRS, command=st.lists(ARGUMENTS, min_size=1, max_size=4))
    @settings(FUZZ, max_examples=80)
    def submit_anything(workdir, command):
        r = world.client.post("/v1/jobs", headers=world.auth(), json={
            "name": "probe", "command": command, "workdir": workdir})
        outcomes[r.status_code] += 1
        assert r.status_code in (201, 422), r.text
        if r.status_code == 201:
            row = world.service.store.job(world.principal(world.fuzzer), r.json()["id"])
            assert row.spec["command"] == command  # what will run is what was checked
            assert confined(row.spec, world.home(world.fuzzer)), row.spec

    submit_anything()
    assert outcomes[201] >= 10 and outcomes[422] >= 10, outcomes  # both were tried


def test_another_users_jobs_are_not_found_on_any_per_job_endpoint(world):
    """As if they did not exist: the same answer as for an id nobody has, and no change."""
    assert len(PER_JOB) >= 8  # GET/PATCH job, cancel, suspend, resume, logs, events, explain
    store = world.service.store
    bob = world.principal("bob")

    def call(method, path, job_id):
        return world.client.request(method, fill(path, job_id), headers=world.auth("ada"),
                                    json={"priority": 1} if method == "PATCH" else None)

    for job_id in world.jobs["bob"]:
        before = (store.job(bob, job_id).state, [e.id for e in store.events(job_id)])
        for method, path in PER_JOB:
            theirs, nobodys = call(method, path, job_id), call(method, path, "nobody-1234")
            assert theirs.status_code == 404, (method, path, theirs.text)
            assert theirs.text == nobodys.text.replace("nobody-1234", job_id)
        assert (store.job(bob, job_id).state, [e.id for e in store.events(job_id)]) == before


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer ", "Bearer not-a-token", "Basic YWRhOmFkYQ==", "Token {ada}",
    "Bearer {ada}x", "Bearer  {ada}", "{ada}", "Bearer {ada} {ada}"])
def test_every_operation_refuses_a_request_without_a_valid_token(world, authorization):
    """401, before anything else is looked at: valid or invalid parameters and bodies."""
    store = world.service.store
    events = len(store.all_events(world.principal("root"), limit=100_000))
    headers = {} if authorization is None else {
        "Authorization": authorization.format(ada=world.tokens["ada"])}
    job_id = world.jobs["ada"][0]
    bodies = {"POST": [{"name": "x", "command": ["python", "train.py"]}, {"name": []}],
              "PATCH": [{"priority": 1}, {"priority": "high"}]}
    invalid = {"limit": -1, "tail": 0, "after": "x", "since": "y"}
    for method, path in OPERATIONS:
        valid, wrong = bodies.get(method, [None, None])
        for body, query in ((valid, {}), (wrong, invalid)):
            r = world.client.request(method, fill(path, job_id), params=query, json=body,
                                     headers=headers)
            assert r.status_code == 401, (method, path, query, body, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    assert len(store.all_events(world.principal("root"), limit=100_000)) == events


def test_after_fuzzing_the_store_is_consistent_and_a_restart_takes_every_job_up(world):
    """Runs after the tests above (file order): every job the fuzzing made is the fuzzer's,
    every job's history starts with its submission, no one acted on a job who may not, and
    nothing ran."""
    store = world.service.store
    jobs = store.jobs(world.principal("root"), limit=100_000)
    if not {j.id for j in jobs} - world.seeded:
        pytest.skip("nothing was fuzzed in this run")
    fuzzer = world.principal(world.fuzzer)
    admins = {name for name in USERS if world.principal(name).admin}
    for job in jobs:
        owner = store.owner(job.id)
        assert job.id in world.seeded or owner == fuzzer, (job.id, owner)
        events = store.events(job.id)
        assert [e.kind for e in events][:1] == ["submitted"], job.id
        assert events[0].data == {"by": owner.name}
        assert "submitted" not in [e.kind for e in events[1:]]
        assert {e.data["by"] for e in events if "by" in e.data} <= {owner.name} | admins
    listed, url = [], "/v1/jobs?limit=1000"
    while url:  # every page
        r = world.client.get(url, headers=world.auth())
        listed += r.json()
        url = r.links.get("next", {}).get("url")
    assert {j["id"] for j in listed} == {j.id for j in jobs if fuzzer.admin
                                         or j.user_id == fuzzer.id}
    assert not world.service.backend.agent.jobs  # no process was ever started
    backend = local.Driver(make_policy("gandiva"), world.service.base_dir.parent / "w2",
                                 slots=2)
    try:
        unfinished = [j for j in jobs if j.state not in ("done", "failed", "cancelled")]
        assert Service(store, backend, world.service.base_dir).resume_unfinished() == \
            len(unfinished)
    finally:
        backend.agent.close()


# ---- what the fuzzing found, fixed ----------------------------------------------------

def submit(world: World, **spec):
    return world.client.post("/v1/jobs", headers=world.auth(), json={
        "name": "probe", "command": ["python", "train.py"], **spec})


def test_event_ids_beyond_32_bits_are_refused(world):
    own = world.jobs["ada"][0]
    for after in (EVENT_ID_MAX + 1, 2**63, -(2**63) - 1):
        for path in ("/v1/events", f"/v1/jobs/{own}/events"):
            r = world.client.get(path, params={"after": after}, headers=world.auth("ada"))
            assert r.status_code == 422, (path, after, r.status_code)
        with world.client.stream("GET", "/v1/events/stream", params={"after": after},
                                 headers=world.auth("ada")) as r:
            assert r.status_code == 422, ("stream", after, r.status_code)


def test_a_last_event_id_that_is_not_an_event_id_is_not_a_server_error(world):
    for last in ("abc", "1.5", str(2**64)):
        with world.client.stream("GET", "/v1/events/stream", headers={
                **world.auth(), "Last-Event-ID": last}) as r:
            assert r.status_code < 500, (last, r.status_code)


def test_nul_in_commands_and_environments_is_refused(world):
    for spec in ({"command": ["/\x00"]}, {"command": ["python", "../\x00"]},
                 {"command": ["python\x00"]}, {"env": {"A": "\x00"}}):
        assert submit(world, **spec).status_code == 422, spec


def test_paths_in_flag_values_are_checked_too(world):
    for arg in ("--data=/etc/passwd", "--data=../../bob/train.py", "-o=../../../x"):
        r = submit(world, command=["python", "../train.py", arg], workdir="sub")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "command", arg


def test_an_over_long_workdir_is_refused(world):
    for workdir in ("a" * (NAME_MAX + 1), "sub/" + "é" * 200, "/".join(["a" * 200] * 21)):
        r = submit(world, workdir=workdir)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "workdir"


def test_a_symlink_loop_in_the_base_directory_is_refused(world):
    loop = world.home(world.fuzzer) / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    for workdir in ("loop", "loop/x"):
        r = submit(world, workdir=workdir)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "workdir"


def test_names_and_variables_ending_in_a_newline_are_refused(world):
    assert submit(world, name="x\n").status_code == 422
    assert submit(world, env={"A\n": "1"}).status_code == 422


def test_nul_in_ids_and_filters_is_not_a_server_error(world, request):
    for method, path in PER_JOB:
        r = world.client.request(method, path.format(job_id="x%00"), headers=world.auth(),
                                 json={"priority": 1} if method == "PATCH" else None)
        assert r.status_code == 404, (method, path, r.status_code)
    r = world.client.get("/v1/jobs", params={"state": "queued,\x00"}, headers=world.auth())
    assert r.status_code == 200


def test_numbers_json_cannot_write_are_refused(world):
    job_id = world.jobs["ada"][0]
    for literal in ("NaN", "Infinity", "-Infinity"):
        for method, path, body in (
                ("POST", "/v1/jobs", '{"name": "probe", "command": ["python", "train.py"], '
                                     f'"time_limit": {literal}}}'),
                ("POST", "/v1/jobs", f'{{"name": "probe", "command": ["x"], "gpus": {literal}}}'),
                ("PATCH", f"/v1/jobs/{job_id}", f'{{"priority": {literal}}}')):
            r = world.client.request(method, path, content=body, headers={
                **world.auth("ada"), "Content-Type": "application/json"})
            assert r.status_code == 422, (method, path, body, r.status_code)


def test_booleans_and_strings_are_not_taken_for_numbers(world):
    job_id = world.jobs["ada"][0]
    for priority in (True, "5"):
        r = world.client.patch(f"/v1/jobs/{job_id}", json={"priority": priority},
                               headers=world.auth("ada"))
        assert r.status_code == 422, (priority, r.text)
    for spec in ({"gpus": True}, {"priority": "1"}, {"elastic": {"min": True, "max": 2}}):
        assert submit(world, **spec).status_code == 422, spec


def test_the_document_says_what_a_job_spec_may_be():
    spec = schema.raw_schema["components"]["schemas"]["JobRequest"]["properties"]
    for name in ("command", "time_limit"):  # "python train.py", "90m"
        kinds = [spec[name]] + spec[name].get("anyOf", [])
        assert any(kind.get("type") == "string" for kind in kinds), (name, spec[name])
    assert "pattern" in spec["name"]
    assert "propertyNames" in spec["env"]


def test_the_document_names_every_status_the_api_answers():
    for method, path in OPERATIONS:
        operation = schema.raw_schema["paths"][path][method.lower()]
        per_job = "{job_id}" in path
        expected = {"401"}
        if per_job:
            expected |= {"404", "409"} if method in ("PATCH", "POST") else {"404"}
        if "requestBody" in operation:
            expected.add("400")
        assert expected <= set(operation["responses"]), (method, path)


def test_the_document_says_the_event_stream_is_server_sent_events():
    ok = schema.raw_schema["paths"]["/v1/events/stream"]["get"]["responses"]["200"]
    assert list(ok["content"]) == ["text/event-stream"]


def test_a_405_names_every_method_of_its_path(world):
    for path in ("/v1/jobs", "/v1/jobs/{job_id}"):
        documented = {m for m, p in OPERATIONS if p == path}
        r = world.client.request("DELETE", path.format(job_id=world.jobs["ada"][0]),
                                 headers=world.auth())
        assert r.status_code == 405
        assert set(r.headers["allow"].replace(" ", "").split(",")) - {"HEAD"} == documented


SPEC_FIELDS = ("name", "command", "workdir", "model", "env", "labels", "submission_id",
               "time_limit")


# one surrogate between text without any: always unpaired, so never a valid character
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=2)
LONE = st.tuples(TEXT, st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), TEXT).map(
    "".join)


@FUZZ
@given(field=st.sampled_from(SPEC_FIELDS), junk=LONE, where=st.sampled_from(["value", "key"]))
def test_a_lone_surrogate_anywhere_in_a_spec_is_a_422_never_a_500(world, field, junk, where):
    spec = {"name": "probe", "command": ["python", "train.py"]}
    if field in ("env", "labels"):
        spec[field] = {junk: "x"} if where == "key" else {"OK": junk}
    elif field == "command":
        spec[field] = ["python", junk]
    else:
        spec[field] = junk
    body = json.dumps(spec)  # ASCII JSON with \ud8xx escapes: valid JSON, no valid text
    r = world.client.post("/v1/jobs", content=body, headers={
        **world.auth(), "Content-Type": "application/json"})
    assert r.status_code == 422, (spec, r.status_code, r.text[:200])
    r.json()  # the answer itself is valid JSON


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/x/cancel", "/v1/users/x/rotate"])
def test_an_oversized_body_is_a_413_on_every_operation_that_takes_one(world, path):
    r = world.client.post(path, content=b"{" + b" " * (2 * 1024 * 1024) + b"}", headers={
        **world.auth(), "Content-Type": "application/json"})
    assert r.status_code == 413


@FUZZ
@given(junk=st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                    max_size=3))
def test_a_lone_surrogate_in_a_path_or_query_is_never_a_500(world, junk):
    quoted = junk.encode("utf-8", "surrogatepass")  # as raw bytes on the wire
    for url in (b"/v1/jobs/" + quoted, b"/v1/jobs?label=a%3D" + quoted,
                b"/v1/jobs?after=" + quoted, b"/v1/users/" + quoted + b"/revoke"):
        r = world.client.get(url.decode("latin-1"), headers=world.auth())
        assert r.status_code < 500, (url, r.status_code)
