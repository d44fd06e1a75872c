import os

import pgcluster
import pytest

from gandiva.spec import JobSpec, Trace


def job(jid: str, submit: float, gpus: int, duration: float, **kw) -> JobSpec:
    return JobSpec(id=jid, submit_time=submit, num_gpus=gpus, model=kw.pop("model", "resnet50"),
                   duration=duration, **kw)


@pytest.fixture
def make_trace():
    def make(*jobs: JobSpec, name: str = "hand") -> Trace:
        return Trace(name=name, jobs=list(jobs), reference_gpu="V100")
    return make


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
