"""A job is untrusted: whatever it writes on its control channel fails that job alone, with a
reason naming what it sent; the agent's reader, the loop and every other job go on."""

import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
from held import Held  # noqa: E402
from waiting import node_event  # noqa: E402

from gandiva.backends.nodes import AgentEvent, Launch  # noqa: E402
from gandiva.job import wire  # noqa: E402
from gandiva.node.agent import Agent, rank_logs  # noqa: E402

# The job says hello through the library, then writes what argv[1] names on its channel
# itself, and waits: only the agent can end it.
HOSTILE = """\
import json, os, sys, time
import gandiva.job as gj

job = gj.init()
fd = int(os.environ["GANDIVA_CONTROL_FD"])
profile = {"ev": "profile", "step": 1, "mini_batch_time": 0.1, "memory_gb": 0.1,
           "utilization": 0.5}


def send(data):  # (the library keeps the channel non-blocking)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            time.sleep(0.001)


what = sys.argv[1]
if what == "endless line":  # no newline, ever
    send(b'{"ev": "alive", "step": 1, "pad": "')
    while True:
        send(b"x" * 65536)
lines = {
    "wrong types": json.dumps({**profile, "metrics": [1]}),
    "memory as text": json.dumps({**profile, "memory_gb": "x"}),
    "NaN": json.dumps({**profile, "mini_batch_time": float("nan")}),
    "a 10 MiB line": json.dumps({"ev": "alive", "step": 1, "pad": "x" * (10 << 20)}),
    "20,000 series points": json.dumps(
        {**profile, "series": {"loss": [[i, 0.5] for i in range(20_000)]}}),
    "a point that is not [step, value]": json.dumps({**profile, "series": {"loss": [[1]]}}),
    "an unknown kind": json.dumps({"ev": "takeover", "step": 1}),
    "binary noise": os.urandom(2048).replace(b"\\n", b"").decode("latin-1"),
}
send(lines[what].encode("latin-1") + b"\\n")
time.sleep(600)
"""
PACED = """\
import time
import gandiva.job as gj

job = gj.init()
for step in job.steps(30):
    time.sleep(0.01)
"""
CASES = {  # what it sends -> what the reason says of it
    "wrong types": "field metrics: Input should be a valid dictionary",
    "memory as text": "field memory_gb: Input should be a valid number",
    "NaN": "field mini_batch_time: Input should be a finite number",
    "a 10 MiB line": f"more than {wire.LINE_BYTES}",
    "endless line": f"more than {wire.LINE_BYTES}",
    "20,000 series points": f"more than {wire.SERIES_POINTS} in one report",
    "a point that is not [step, value]": "a point is not [step, value]",
    "an unknown kind": "not a gandiva 'ev' message",
    "binary noise": "not JSON",
}


def scripts(tmp_path: Path) -> tuple[Path, Path]:
    hostile, good = tmp_path / "hostile.py", tmp_path / "good.py"
    hostile.write_text(HOSTILE)
    good.write_text(PACED)
    return hostile, good


def ends(agent: Agent, jobs: set[str], timeout: float = 120.0) -> dict:
    """The done or failed event of each of ``jobs``."""
    out: dict = {}
    deadline = time.monotonic() + timeout
    while set(out) != jobs:
        ev = agent.events.get(timeout=max(0.1, deadline - time.monotonic()))
        if ev.job_id in jobs and ev.kind in ("done", "failed"):
            out[ev.job_id] = ev
    return out


def python(script: Path, *args: str) -> Launch:
    return Launch(["{python}", str(script), *args])


def test_each_bad_report_fails_its_sender_alone_naming_it(zygote, tmp_path):
    """Every kind of bad report at once, from jobs beside a good one on one agent."""
    hostile, good = scripts(tmp_path)
    slots = [f"cpu:{i}" for i in range(len(CASES) + 2)]
    agent = Agent(tmp_path / "agent", slots, zygote=zygote)
    try:
        bad = {f"bad{i}": what for i, what in enumerate(CASES)}
        with Held() as held:  # what the agent's reader held of it all (an endless line: no end)
            for i, (job, what) in enumerate(bad.items()):
                agent.start(job, python(hostile, what), (i,))
            agent.start("good", python(good), (len(CASES),))
            ended = ends(agent, {*bad, "good"})
        print(f"the agent held at most {held.mib:.1f} MiB")
        assert held.mib < 24  # a line over LINE_BYTES (1 MiB) is dropped, not held
        assert ended.pop("good").kind == "done"  # the other job ends well
        for job, what in bad.items():
            assert ended[job].kind == "failed", ended[job]
            reason = ended[job].data["reason"]
            assert reason.startswith("bad report: rank 0 sent") and CASES[what] in reason, what
            assert job not in agent.jobs
            log = (agent.job_dir(job) / "rank0.log").read_text(errors="replace")
            assert "bad report: rank 0 sent" in log  # said in the job's log, for its user
        agent.start("after", python(good), (len(CASES) + 1,))  # the reader and reaper go on
        node_event(agent, "done", "after")
    finally:
        agent.close()


@pytest.mark.parametrize("what", ["wrong types", "endless line"])
def test_a_cold_job_s_bad_report_fails_it_alone_too(what, tmp_path):
    hostile, good = scripts(tmp_path)
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], warm=False)
    try:
        agent.start("bad", python(hostile, what), (0,))
        with pytest.raises(AssertionError, match="bad report: rank 0 sent") as failed:
            node_event(agent, "done", "bad", timeout=120)
        assert CASES[what] in str(failed.value)
        assert "bad" not in agent.jobs
    finally:
        agent.close()


def test_a_report_line_is_checked_field_by_field():
    profile = {"step": 1, "mini_batch_time": 0.1, "memory_gb": 0.5, "utilization": 0.5}

    def line(**fields) -> bytes:
        import json

        return json.dumps({"ev": "profile", **profile, **fields}).encode()

    assert wire.report(line(metrics={"loss": 2})).metrics == {"loss": 2.0}
    for bad, said in [({"metrics": {"loss": "high"}}, "metrics.loss"),
                      ({"step": 1.5}, "field step"), ({"memory_gb": float("inf")}, "finite"),
                      ({"series": {"loss": [[1, 2, 3]]}}, "[step, value]")]:
        with pytest.raises(wire.BadReport, match=said.replace("[", r"\[").replace("]", r"\]")):
            wire.report(line(**bad))
    for junk in (b"[1, 2]", b'{"ev": ["profile"]}', b"\xff\xfe", b"null"):
        with pytest.raises(wire.BadReport):
            wire.report(junk)


def test_an_event_the_loop_cannot_handle_fails_its_job_not_the_loop(tmp_path):
    """(Past the wire's checks: a node whose event about a job is of the wrong shape.)"""
    from test_hollow import MODEL, hollow, in_background, steps_for, stop

    from gandiva.backends.hollow import hollow_launch
    from gandiva.spec import JobSpec

    backend, nodes, clock = hollow("fifo", tmp_path, servers=1, gpus=2)
    work = steps_for(nodes, 2.0)
    for job in ("odd", "fine"):
        backend.submit(JobSpec(job, 0.0, 1, MODEL, mini_batches=work), hollow_launch(MODEL, work))
    loop, out = in_background(lambda: backend.run(until_idle=False))
    clock.run_until(lambda: all(r.status == "running" for r in backend.records.values()))
    nodes.events.put(AgentEvent("profile", "odd", {"step": "not a profile"}))
    clock.run_until(lambda: backend.records["fine"].status == "done")
    odd = backend.records["odd"]
    assert odd.status == "failed" and odd.reason.startswith("bad report: its profile event")
    assert loop.is_alive() and "error" not in out
    stop(backend, clock, loop)
    assert "odd" not in nodes.jobs  # killed on its node



def test_a_file_a_job_names_like_a_log_is_not_taken_for_a_rank_s_log(tmp_path):
    for name in ("rank0.log", "rank12.log", "rankX.log", "rank.log", "rank1.log.bak",
                 "rank-1.log", "rank\u0663.log", "rank1234567.log"):
        (tmp_path / name).write_text("")
    assert [rank for rank, _ in rank_logs(tmp_path)] == [0, 12]
