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
