import os
import sys
from pathlib import Path

import pgcluster
import pytest

from gandiva import actions as A
from gandiva import events as E
from gandiva.events import Event
from gandiva.policies import make_policy
from gandiva.policies.gandiva.book import Book
from gandiva.scheduler import Scheduler
from gandiva.spec import JobSpec, Trace
from gandiva.state import Cluster


def job(jid: str, submit: float, gpus: int, duration: float, **kw) -> JobSpec:
    return JobSpec(id=jid, submit_time=submit, num_gpus=gpus, model=kw.pop("model", "resnet50"),
                   duration=duration, **kw)


def jcts(result) -> dict[str, float | None]:
    """Each job's completion time (None: it did not finish)."""
    return {r.spec.id: None if r.finish is None else r.finish - r.spec.submit_time
            for r in result.jobs}


def drive(cluster: str, policy: str, *events: Event) -> tuple[Scheduler, list]:
    """A scheduler on a fresh cluster that has handled ``events`` (checking the invariants
    after each), and the list of actions its backend is asked for, which grows as it goes on."""
    actions: list = []

    class Log:
        def execute(self, action, cluster) -> None:
            actions.append(action)

    sched = Scheduler(Cluster.build(cluster), make_policy(policy), Log())
    for event in events:
        sched.handle(event)
        sched.cluster.check_invariants()
    return sched, actions


@pytest.fixture
def make_trace():
    def make(*jobs: JobSpec, name: str = "hand") -> Trace:
        return Trace(name=name, jobs=list(jobs), reference_gpu="V100")
    return make


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """One warm zygote for the session's agents (``Agent(..., zygote=zygote)``): torch is
    imported once, not once per test, and no job starts cold while its agent's zygote
    imports. Tests of the zygote itself, and of cold starts, make their own."""
    from gandiva.node.agent import start_zygote

    z = start_zygote(tmp_path_factory.mktemp("zygote"))
    assert z.wait_ready(120), "the session's zygote did not get ready"
    yield z
    z.close()


@pytest.fixture(scope="session")
def postgres():
    """A throw-away PostgreSQL cluster for the whole session, started on first use.

    Skipped where PostgreSQL cannot run here, except under CI (``CI`` set), where that is a
    failure: ``.ci/run`` installs it, so the PostgreSQL variants must run there.
    """
    why = pgcluster.unavailable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    cluster = pgcluster.Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The URL of a fresh, empty database: a SQLite file, or a new database on the
    session's PostgreSQL cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gandiva.db'}"
    return request.getfixturevalue("postgres").create_database()


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: a worker per core and one more. The real-process tests wait on real time
    (a quantum, a hang limit, a job's slow mini-batch) as much as they compute, and the
    extra worker's tests fill those waits."""
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1) + 1


@pytest.fixture(autouse=True)
def umask_kept():
    """A test leaves its worker's umask as it found it: a CLI command run in-process sets its
    own (``gandiva user add``: 0o077), and later tests on the worker then make files the jobs
    they run as other accounts cannot read."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, f"the test left the umask at {after:#o} (it was {before:#o})"


@pytest.fixture(scope="session", autouse=True)
def passable_to_jobs():
    """Run as root, a server runs each user's jobs as that user's account: the interpreter
    and this checkout must be within any account's reach. The directories above them get
    search permission for others (o+x: pass, never list) where they lack it: a Python
    under /root (pyenv's) is otherwise out of every job's reach. (``serving.running`` does
    the same for a server's directory.)"""
    from serving import passable

    import gandiva

    for place in (Path(sys.executable).resolve(), Path(gandiva.__file__).resolve()):
        passable(place)


def needs_root(why: str) -> None:
    """Skip a test that only root can run; under ``GANDIVA_REQUIRE_ROOT_TESTS`` (which
    ``.ci/run`` sets as root) fail it instead: there it must run."""
    if os.environ.get("GANDIVA_REQUIRE_ROOT_TESTS"):
        pytest.fail(f"GANDIVA_REQUIRE_ROOT_TESTS is set, and {why}")
    pytest.skip(why)


@pytest.fixture
def root() -> None:
    """The test runs as root (a root server, OS accounts)."""
    if os.geteuid() != 0:
        needs_root("the test needs root")


@pytest.fixture
def os_accounts(root):
    """``make(role)``: a fresh OS account (and its group) for this test, removed after it."""
    import shutil
    import subprocess

    if shutil.which("useradd") is None:
        needs_root("useradd is missing")
    made: list[str] = []

    def make(role: str) -> str:
        name = f"gdv{role[:8]}{os.getpid() % 100000}"
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
        made.append(name)
        return name

    yield make
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)


def hand_state(spec: str, placed: dict[str, tuple[int, tuple[int, ...]]], policy=None):
    """A cluster and book (``policy``'s, if given) with jobs placed by hand:
    {job: (gpus requested, gpus)}."""
    c = Cluster.build(spec)
    book = policy.attach(c) if policy is not None else Book.of(c)
    for i, (jid, (n, gpus)) in enumerate(placed.items()):
        c.observe(E.Arrival(i, JobSpec(jid, i, n, "resnet50", duration=1e6)))
        if gpus:
            c.apply(A.Place(jid, gpus))
            book.assign(c.jobs[jid], tuple(sorted(c.servers_of(gpus))))
    return c, book


def arrive(c, jid: str, n: int, t: float = 0.0, **kw):
    c.observe(E.Arrival(t, JobSpec(jid, t, n, "resnet50", duration=1e6, **kw)))
    return c.jobs[jid]


def carried_out(c, decision) -> list:
    """The actions of ``decision``, each applied to the state before the next; then its
    result as the last item."""
    out = []
    while True:
        try:
            action = next(decision)
        except StopIteration as end:
            return [*out, end.value]
        c.apply(action)
        out.append(action)
