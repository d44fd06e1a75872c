"""The job library and the node agent, on real PyTorch training processes (CPU slots)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import alone  # noqa: E402
from waiting import Reports, node_event, trains, until  # noqa: E402

from gandiva.job import checkpoint  # noqa: E402
from gandiva.node.agent import Agent, AgentError, Launch  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = ("--width", "4", "--batch", "8")  # a cnn of 1.5 ms a step, not 3.4
# A job that must outlast what a test does to it waits between its mini-batches rather than
# computes: its wall time, a fraction of its CPU. Its reference runs without: the same math.
PACE = ("--pace-ms", "3")


def launch(script: str, *args: str) -> Launch:
    return Launch(["{python}", str(EXAMPLES / script), *args])


def reference(tmp: Path, script: str, *args: str) -> dict:
    """The final state of the same job run alone, uninterrupted."""
    ckpt = tmp / "reference"
    tmp.mkdir(parents=True, exist_ok=True)
    alone.run([str(EXAMPLES / script), *args], {
        **os.environ, "GANDIVA_CHECKPOINT_DIR": str(ckpt), "GANDIVA_CHECKPOINT_EVERY_S": "1e9"},
        tmp, tmp / "reference.log")
    return checkpoint.latest(ckpt)[1]


def final_state(agent: Agent, job_id: str) -> dict:
    return checkpoint.latest(agent.checkpoint_dir(job_id))[1]


def assert_identical(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for name in a["objects"]:
        flat_a, flat_b = flatten(a["objects"][name]), flatten(b["objects"][name])
        assert flat_a.keys() == flat_b.keys()
        for k in flat_a:
            if torch.is_tensor(flat_a[k]):
                assert torch.equal(flat_a[k], flat_b[k]), f"{name}.{k} differs"
            else:
                assert flat_a[k] == flat_b[k], f"{name}.{k} differs"


def flatten(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, (list, tuple)):
        return flatten(dict(enumerate(obj)), prefix)
    return {prefix: obj}


wait_for = node_event  # (the name the other runtime tests import)


@pytest.fixture
def agent(zygote, tmp_path):
    a = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9, zygote=zygote)
    yield a
    a.close()


def started(agent: Agent, job_id: str, **kw):
    ev = wait_for(agent, "started", job_id, **kw)
    return ev.data


def stopped(pid: int) -> bool:
    """Is the process stopped by a signal (state T in /proc)?"""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "tT"


# ---- checkpoints ---------------------------------------------------------------------------

def test_checkpoint_is_verified_and_a_corrupt_one_is_set_aside(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, step, {"w": torch.full((4,), float(step))})
    assert checkpoint.steps(tmp_path) == [30, 20]  # only the newest two are kept
    newest = tmp_path / "ckpt-000000000030.pt"
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0xFF  # one flipped bit in the payload
    newest.write_bytes(bytes(data))
    step, state = checkpoint.latest(tmp_path)
    assert step == 20 and torch.equal(state["w"], torch.full((4,), 20.0))
    assert (tmp_path / "ckpt-000000000030.pt.corrupt").exists()
    # a torn (truncated) file is refused too
    path = tmp_path / "ckpt-000000000020.pt"
    path.write_bytes(path.read_bytes()[:40])
    assert checkpoint.latest(tmp_path) is None


def test_checkpoint_is_a_plain_torch_file_with_its_digest_beside_it(tmp_path):
    path = checkpoint.save(tmp_path, 7, {"w": torch.arange(3.0)})
    assert torch.equal(torch.load(path)["w"], torch.arange(3.0))  # nothing of ours to strip
    check = subprocess.run(["sha256sum", "-c", path.name + ".sha256"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0 and ": OK" in check.stdout
    # a checkpoint without its digest (copied alone, say) is not taken: it cannot be checked
    (tmp_path / (path.name + ".sha256")).unlink()
    assert checkpoint.latest(tmp_path) is None


# ---- the agent and the library -------------------------------------------------------------

def test_suspended_resumed_moved_and_restarted_job_ends_bit_identical(agent, tmp_path):
    args = ("--steps", "2000", "--seed", "3", *SMALL)
    ref = reference(tmp_path, "cnn.py", *args)
    agent.start("j", launch("cnn.py", *args, *PACE), (0,))
    started(agent, "j")
    for i in range(6):  # suspend and resume, alternating slots
        trains(agent, "j")
        agent.suspend("j")
        assert agent.jobs["j"].suspended and not agent.jobs["j"].signalled  # by the library
        agent.resume("j", ((i + 1) % 2,))
    agent.restart("j", (0,))  # checkpoint, stop, start again: migration's path
    restored = started(agent, "j").restored
    assert restored is not None and restored > 0
    agent.suspend("j")
    agent.resume("j", (1,))
    wait_for(agent, "done", "j")
    assert_identical(final_state(agent, "j"), ref)


def test_elastic_job_shrunk_then_grown_ends_bit_identical(agent, tmp_path):
    args = ("--steps", "2000", "--seed", "1")  # seconds of work, even on a fast core
    ref = reference(tmp_path, "elastic_mlp.py", *args)  # 1 rank throughout
    agent.start("e", launch("elastic_mlp.py", *args), (0, 1))  # 2 ranks
    assert started(agent, "e").restored is None
    trains(agent, "e")
    agent.restart("e", (0,))  # shrink to one rank
    first = started(agent, "e").restored
    trains(agent, "e")
    agent.restart("e", (0, 1))  # grow back to two
    second = started(agent, "e").restored
    assert 0 < first <= second < 2000
    agent.suspend("e")  # a gang is suspended and resumed whole, both ranks at one boundary
    assert agent.jobs["e"].suspended and not agent.jobs["e"].signalled
    agent.resume("e", (1, 0))
    wait_for(agent, "done", "e")
    assert_identical(final_state(agent, "e"), ref)


def test_sigkill_loses_only_the_work_since_the_last_checkpoint(zygote, tmp_path):
    args = ("--steps", "2000", "--seed", "5", *SMALL)
    ref = reference(tmp_path, "cnn.py", *args)
    agent = Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=0.5, zygote=zygote)
    try:
        agent.start("k", launch("cnn.py", *args, *PACE), (0,))
        started(agent, "k")
        until(lambda: checkpoint.steps(agent.checkpoint_dir("k")), what="a checkpoint")
        pid = agent.jobs["k"].ranks[0].proc.pid
        os.kill(pid, signal.SIGSTOP)  # freeze it, so no checkpoint lands after we look
        last = checkpoint.steps(agent.checkpoint_dir("k"))[0]
        os.kill(pid, signal.SIGKILL)
        seen: list = []
        wait_for(agent, "restarted", "k", seen=seen)
        assert "signal 9" in seen[-1].data["reason"]
        assert started(agent, "k").restored == last
        wait_for(agent, "done", "k")
        assert_identical(final_state(agent, "k"), ref)
    finally:
        agent.close()


def test_crashing_script_fails_with_its_error_and_the_agent_survives(zygote, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import gandiva.job as gj\n"
                   "job = gj.init()\n"
                   "for step in job.steps(100):\n"
                   "    if step == 3:\n"
                   "        raise ZeroDivisionError('the script divided by zero')\n")
    agent = Agent(tmp_path / "agent", ["cpu:0"], max_restarts=1, zygote=zygote)
    try:
        agent.start("bad", Launch(["{python}", str(bad)]), (0,))
        seen: list = []
        with pytest.raises(AssertionError, match="the script divided by zero") as err:
            wait_for(agent, "done", "bad", seen=seen)
        assert "after 1 restarts" in str(err.value)
        assert [e.kind for e in seen if e.job_id == "bad"].count("restarted") == 1
        agent.start("missing", Launch(["/no/such/program"]), (0,))
        with pytest.raises(AssertionError, match="cannot start '/no/such/program'"):
            wait_for(agent, "done", "missing")
        with pytest.raises(AgentError, match="no job 'ghost'"):
            agent.suspend("ghost")
        agent.start("ok", launch("cnn.py", "--steps", "20"), (0,))  # the agent still works
        wait_for(agent, "done", "ok")
    finally:
        agent.close()


def test_warm_forks_draw_their_own_numpy_numbers_as_cold_starts_do(agent, tmp_path):
    """The zygote imported NumPy (torch does), which seeded its global generator once: each
    fork reseeds it, or every warm job would draw the same numbers."""
    script = tmp_path / "draw.py"
    script.write_text("import sys\n"
                      "preloaded = 'numpy' in sys.modules\n"
                      "import numpy as np\n"
                      "print('DRAW', preloaded, np.random.randint(1 << 30), flush=True)\n")
    drawn = []
    for job in ("a", "b"):
        agent.start(job, Launch(["{python}", str(script)]), (0,))
        wait_for(agent, "done", job)
        preloaded, number = agent.read_log(job).decode().split("DRAW ")[1].split()[:2]
        assert preloaded == "True"  # (else there is nothing to reseed)
        drawn.append(number)
    assert drawn[0] != drawn[1]


def test_a_warm_start_is_a_fork_of_the_zygote_that_runs_the_script_as_python_would(tmp_path):
    """A fork of the zygote (torch imported once per node) runs the job's script as
    ``__main__`` with its arguments, environment, directory and exit status; and when the
    zygote dies, the job that finds it dead starts cold. A start waits for a zygote that is
    still importing, rather than import the same beside it."""
    facts = tmp_path / "facts.txt"
    script = tmp_path / "facts.py"
    script.write_text(
        "import atexit, os, sys\n"
        "out = open(sys.argv[1], 'a')\n"
        "out.write(f'{__name__} {sys.argv[2]} {os.getcwd()} {os.environ[\"MINE\"]} '\n"
        "          f'{os.getppid()} {\"torch\" in sys.modules}\\n')\n"
        "atexit.register(lambda: out.write('atexit ran\\n') or out.close())\n"
        "sys.exit(int(sys.argv[3]))\n")
    agent = Agent(tmp_path / "agent", ["cpu:0"], max_restarts=0)
    try:
        assert not agent.warm_ready()  # its zygote imports torch: the first start waits

        def run(job: str, code: int, kind: str = "done", cwd: Path = tmp_path) -> list[str]:
            """The job's facts: its name, arguments, directory, environment, parent and
            whether torch was imported before it began."""
            agent.start(job, Launch(["{python}", str(script), str(facts), job, str(code)],
                                    cwd=cwd, env={"MINE": job.upper()}), (0,))
            if kind == "done":
                wait_for(agent, kind, job)
            return facts.read_text().splitlines()

        warm, end = run("warm", 0)
        zygote = int(warm.split()[4])  # its parent: the zygote, torch imported, not the agent
        assert zygote != os.getpid()
        assert (warm, end) == (f"__main__ warm {tmp_path} WARM {zygote} True", "atexit ran")
        run("three", 3, kind="")
        with pytest.raises(AssertionError, match="exited with status 3"):
            wait_for(agent, "done", "three")
        os.kill(zygote, signal.SIGKILL)  # a dead zygote: the next job starts cold, and works
        until(lambda: not agent.warm_ready(), what="the zygote's death to be seen")
        facts.unlink()
        line = run("cold", 0)[0].split()
        assert line[:4] == ["__main__", "cold", str(tmp_path), "COLD"]
        assert line[4] != str(zygote) and line[5] == "False"  # a fresh interpreter
        facts.unlink()  # ...and a new zygote takes over (the next start waits for it)
        again = run("again", 0)[0].split()
        assert again[4] not in (str(zygote), line[4]) and again[5] == "True"
    finally:
        agent.close()


def start_plain(agent: Agent, tmp_path: Path, source: str, until_text: str = "") -> Path:
    """Start a script that does not use the job library; it writes to the file returned.
    Return once that file holds ``until_text`` (or anything, if it is empty)."""
    out = tmp_path / "out.txt"
    plain = tmp_path / "plain.py"
    plain.write_text(source)
    agent.start("p", Launch(["{python}", str(plain), str(out)]), (0,))
    until(lambda: out.exists() and out.read_text() and until_text in out.read_text(),
          what="the script's output")
    return out


def test_unmodified_script_is_time_sliced_with_signals(agent, tmp_path):
    out = start_plain(agent, tmp_path, "import sys, time\n"
                                       "for i in range(200):\n"
                                       "    open(sys.argv[1], 'w').write(str(i))\n"
                                       "    time.sleep(0.01)\n")
    agent.suspend("p")
    assert agent.jobs["p"].signalled  # it never spoke the library's protocol
    until(lambda: stopped(agent.jobs["p"].ranks[0].proc.pid), what="SIGSTOP to land")
    frozen = out.read_text()
    time.sleep(0.5)  # what is tested: half a second suspended, in which it writes nothing
    assert out.read_text() == frozen
    agent.resume("p", (0,))
    wait_for(agent, "done", "p")
    assert out.read_text() == "199"


def test_unmodified_script_is_preempted_with_sigterm_and_restarted(agent, tmp_path):
    out = start_plain(agent, tmp_path, "import signal, sys, time\n"
                                       "log = open(sys.argv[1], 'a')\n"
                                       "def saved(*_):\n"
                                       "    log.write('saved on SIGTERM\\n'); log.flush()\n"
                                       "    sys.exit(0)\n"
                                       "signal.signal(signal.SIGTERM, saved)\n"
                                       "log.write('started\\n'); log.flush()\n"
                                       "time.sleep(1.0)\n", until_text="started")
    agent.restart("p", (1,))  # no library: preempted by SIGTERM, then started again
    wait_for(agent, "done", "p")
    assert out.read_text().splitlines() == ["started", "saved on SIGTERM", "started"]


# ---- the local backend: the scheduler core and a policy driving real jobs ------------------

def test_local_backend_time_slices_real_jobs_and_each_ends_as_if_alone(zygote, tmp_path):
    from gandiva import actions as A
    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    backend = Driver(make_policy("slicer:quantum=1"), tmp_path / "run", slots=2,
                     feedback_steps=50, zygote=zygote)
    # (1,000 small steps: a second and a half alone, three turns of a second on two slots)
    args = {f"j{i}": ("--steps", "1000", "--seed", str(i), "--lr", "0.02", *SMALL)
            for i in range(3)}
    for jid, a in args.items():
        backend.submit(JobSpec(jid, 0.0, 1, "cnn", mini_batches=1000), launch("cnn.py", *a))
    with pytest.raises(ValueError, match="num_gpus=3 but this machine has 2 devices"):
        backend.submit(JobSpec("wide", 0.0, 3, "cnn"), launch("cnn.py"))
    result = backend.run(timeout=300)
    assert [j.status for j in result.jobs] == ["done"] * 3
    kinds = {type(a) for _, a, _ in result.actions}
    assert A.Suspend in kinds and A.Resume in kinds  # 3 jobs on 2 slots: time-sliced
    assert all(j.first_feedback is not None and j.first_feedback <= j.finish for j in result.jobs)
    # no slot ever ran two jobs at once (the policy does not pack)
    for dev in (0, 1):
        segs = sorted((s, e) for d, _, s, e, _ in result.timeline if d == dev)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(segs, segs[1:], strict=False))
    for jid, a in args.items():
        ref = reference(tmp_path / jid, "cnn.py", *a)
        assert_identical(checkpoint.latest(backend.agent.checkpoint_dir(jid))[1], ref)


def test_policy_grows_an_elastic_job_into_an_idle_slot_then_shrinks_it_for_a_newcomer(
        zygote, tmp_path):
    import threading

    from gandiva import actions as A
    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    backend = Driver(make_policy("slicer:grow:quantum=1"), tmp_path / "run", slots=2,
                     feedback_steps=10, zygote=zygote)
    reports = Reports(backend)
    eargs = ("--steps", "1500", "--seed", "2")
    backend.submit(JobSpec("e", 0.0, 1, "mlp", min_gpus=1, max_gpus=2),
                   launch("elastic_mlp.py", *eargs))
    out = {}
    loop = threading.Thread(target=lambda: out.update(result=backend.run(timeout=300)))
    loop.start()
    reports.wait_for("e", "resized")  # c arrives once e has grown
    arrival = backend.now()
    backend.submit(JobSpec("c", arrival, 1, "cnn"), launch("cnn.py", "--steps", "300"))
    loop.join(timeout=300)
    result = out["result"]
    assert [j.status for j in result.jobs] == ["done", "done"]
    acts = [(t, a) for t, a, _ in result.actions if a.job_id in ("e", "c")]
    (t_grow, grow), *_ = [(t, a) for t, a in acts if isinstance(a, A.Grow)]
    (t_shrink, shrink), = [(t, a) for t, a in acts if isinstance(a, A.Shrink)]
    (t_c, _), = [(t, a) for t, a in acts if isinstance(a, A.Place) and a.job_id == "c"]
    assert len(grow.gpus) == 2 and len(shrink.gpus) == 1
    assert t_grow < arrival <= t_shrink <= t_c  # shrunk at once when c needed the slot
    # (after c leaves, e may grow again: the slot is idle once more)
    ref = reference(tmp_path, "elastic_mlp.py", *eargs)
    assert_identical(checkpoint.latest(backend.agent.checkpoint_dir("e"))[1], ref)


def test_local_backend_as_a_server_loop_takes_jobs_while_running(zygote, tmp_path):
    import threading

    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    backend = Driver(make_policy("slicer:quantum=1"), tmp_path / "run", slots=2,
                     feedback_steps=20, zygote=zygote)
    reports = Reports(backend)
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    try:
        until(backend.alive, what="the loop to go round")  # with no jobs: a server idling
        for jid in ("a", "b"):
            backend.submit(JobSpec(jid, 0.0, 1, "cnn"), launch("cnn.py", "--steps", "200"))
        reports.wait(lambda seen: {j for j, what in seen if what == "done"} == {"a", "b"},
                     what="both jobs done")
    finally:
        backend.stop()
        loop.join(timeout=30)
    assert not loop.is_alive()
    for jid in ("a", "b"):
        mine = reports.of(jid)
        assert mine[0] == "running" and mine[-1] == "done" and "feedback" in mine


def test_a_job_slow_to_stop_holds_up_neither_the_loop_nor_other_jobs(zygote, tmp_path):
    """The loop hands actions to the nodes and goes on: while a held job's checkpoint waits
    for its next mini-batch boundary (a mini-batch of 20 s), a newcomer is placed on the
    other device and runs to its end; the held job stops after, from its checkpoint. (The
    newcomer takes device 0, which a first job has left; the held job's device 1 is free
    only once it has stopped.)"""
    import threading

    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    slow = tmp_path / "slow.py"
    slow.write_text(
        "import sys, time\nimport gandiva.job as gj\njob = gj.init()\n"
        "for step in job.steps(3):\n"
        "    if step == 1:\n"
        "        open(sys.argv[1], 'w').write('in the long mini-batch')\n"
        "        time.sleep(20)\n")
    mark = tmp_path / "mark"
    backend = Driver(make_policy("fifo"), tmp_path / "run", slots=2, zygote=zygote)
    seen: list[tuple[str, str, bool]] = []  # (job, what, the slow job's hold still under way)
    backend.on_change = lambda rec, what: seen.append(
        (rec.spec.id, what, "slow" in backend.inflight and not backend.inflight["slow"].ended))
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    try:
        backend.submit(JobSpec("first", 0.0, 1, "cnn"), launch("cnn.py", "--steps", "20"))
        backend.submit(JobSpec("slow", 0.0, 1, "cnn"), Launch(["{python}", str(slow), str(mark)]))
        until(lambda: mark.exists() and backend.records["first"].status == "done",
              alive=loop.is_alive, what="first done and slow in its long mini-batch")
        backend.hold("slow")  # checkpoint at the next boundary: some 20 s away
        backend.submit(JobSpec("quick", 0.0, 1, "cnn"), launch("cnn.py", "--steps", "40"))
        until(lambda: backend.records["quick"].status == "done"
              and "slow" not in backend.inflight, alive=loop.is_alive,
              what="quick done and slow stopped")
    finally:
        backend.stop()
        loop.join(timeout=60)
    quick = [(what, pending) for j, what, pending in seen if j == "quick"]
    assert quick[0] == ("running", True) and quick[-1] == ("done", True), quick
    assert backend.records["quick"].devices == (0,) and backend.records["slow"].devices == (1,)
    assert backend.records["slow"].status == "held"
    assert checkpoint.steps(backend.agent.checkpoint_dir("slow")) == [2]


def test_a_gang_whose_rank_hangs_after_the_others_ended_fails_within_the_grace(zygote, tmp_path):
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9,
                  exit_grace_s=2.0, zygote=zygote)
    script = tmp_path / "hang.py"
    script.write_text("import os, time\n"
                      "import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "dist.barrier()\n"
                      "if dist.get_rank() == 1:\n"
                      "    print('rank 1 hangs', flush=True)\n"
                      "    time.sleep(600)\n")
    try:
        agent.start("h", Launch(["{python}", str(script)]), (0, 1))
        t0 = time.monotonic()
        ev = agent.events.get(timeout=90)
        while ev.job_id != "h" or ev.kind not in ("failed", "done"):
            ev = agent.events.get(timeout=90)
        assert ev.kind == "failed"
        assert "rank(s) [1] still running 2 s after the others ended" in ev.data["reason"]
        assert "rank 1 hangs" in ev.data["reason"]  # the end of the hung rank's log
        assert time.monotonic() - t0 < 60
        assert "h" not in agent.jobs  # its devices are free again
    finally:
        agent.close()


def test_a_gang_whose_finished_rank_sits_in_teardown_ends_done_and_the_straggler_is_counted(
        zygote, tmp_path):
    """Rank 1 said its training was over (the library's Done), then stays in the
    interpreter's teardown (a gloo group's destructor waiting on a thread that waits for the
    GIL): 10 s after rank 0 ended well, it is killed and the job is done, well within the
    60 s a rank that never finished gets."""
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9,
                  zygote=zygote)
    script = tmp_path / "teardown.py"
    script.write_text("import time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(5):\n"
                      "    pass\n"
                      "if job.rank == 1:\n"
                      "    print('rank 1 sits in teardown', flush=True)\n"
                      "    time.sleep(600)\n")
    try:
        agent.start("t", Launch(["{python}", str(script)]), (0, 1))
        ev = wait_for(agent, "done", "t", timeout=90)
        assert ev.data["stragglers"] == 1, ev
        assert "rank 1 sits in teardown" in agent.read_log("t", 1).decode()
        said = "rank(s) [1] still running 10 s after the others ended: killed"
        assert said in agent.read_log("t", 0).decode()  # (the agent's lines: rank 0's log)
        assert "t" not in agent.jobs  # its devices are free again
    finally:
        agent.close()


@pytest.mark.parametrize("how", ["warm", "cold"])
def test_a_backward_puts_no_python_object_in_the_threads_state_without_a_compiled_one(
        agent, tmp_path, how):
    """(The cause of the DDP gangs that hung at their end: the collectives a backward starts
    capture the thread's state, and a Python object in it must be dropped under the GIL.)"""
    script = tmp_path / "backward.py"
    script.write_text("import torch\n"
                      "seen = []\n"
                      "w = torch.ones(2, requires_grad=True)\n"
                      "y = w * 2\n"
                      "y.register_hook(lambda g: seen.append(torch._C._is_key_in_tls('context')))\n"
                      "y.sum().backward()\n"
                      "print('IN STATE', seen, flush=True)\n")
    env = {"PYTHONHASHSEED": "0"} if how == "cold" else {}  # (acts at start-up: cold)
    agent.start("b", Launch(["{python}", str(script)], env=env), (0,))
    wait_for(agent, "done", "b")
    assert "IN STATE [False]" in agent.read_log("b").decode()


def test_a_gangs_rank_0_idle_after_the_others_ended_well_is_hung_at_exit_and_the_job_done(
        zygote, tmp_path):
    """A plain script's rank 0 (no library: it says nothing of its end) printed its result,
    its gang ended well, and it sits in its teardown computing nothing (the deadlock of a
    gloo group's destructor): after the grace of no CPU it is killed and the job is done.
    (Rank 0 may still be saving: a rank that computes is waited for.)"""
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9,
                  exit_grace_s=2.0, zygote=zygote)
    script = tmp_path / "stuck.py"
    script.write_text("import threading\n"
                      "import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "dist.barrier()\n"
                      "if dist.get_rank() == 0:\n"
                      "    print('result 42', flush=True)\n"
                      "    threading.Event().wait()  # (blocked for good, no CPU)\n")
    try:
        agent.start("s", Launch(["{python}", str(script)]), (0, 1))
        ev = wait_for(agent, "done", "s", timeout=90)
        assert ev.data["stragglers"] == 1, ev
        log = agent.read_log("s", 0).decode()
        assert "result 42" in log and "rank(s) [0] idle 2 s after the others ended well" in log
    finally:
        agent.close()


@pytest.mark.parametrize("how", ["warm", "cold"])
def test_what_a_job_left_running_in_a_session_of_its_own_is_gone_when_the_job_ends(
        zygote, tmp_path, how):
    """A daemon started in a new session (out of the job's process group) is found in the
    run's cgroup and killed with the run."""
    from gandiva.node import cgroups

    if cgroups.hierarchy() is None:
        pytest.skip("this machine has no cgroup v2 hierarchy this process may write")
    agent = Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=1e9, zygote=zygote)
    pidfile, script = tmp_path / "left.pid", tmp_path / "leave.py"
    script.write_text("import subprocess, sys\n"
                      "left = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                      f"open({str(pidfile)!r}, 'w').write(str(left.pid))\n")
    env = {"PYTHONHASHSEED": "0"} if how == "cold" else {}  # (acts at start-up: cold)
    try:
        agent.start("j", Launch(["{python}", str(script)], env=env), (0,))
        ev = agent.events.get(timeout=90)
        while ev.job_id != "j" or ev.kind not in ("failed", "done"):
            ev = agent.events.get(timeout=90)
        assert ev.kind == "done", ev.data
        left = int(pidfile.read_text())
        until(lambda: not Path(f"/proc/{left}").exists() or "Z" in stat_state(left), 10,
              f"{how}: the job's daemon {left} to be gone")
        assert "starts cold" in agent.read_log("j").decode() or how == "warm"
    finally:
        agent.close()


def test_a_run_is_bounded_in_processes_and_memory_where_the_controllers_are_delegated(
        zygote, tmp_path):
    """(Only where the agent's cgroup may hand the pids and memory controllers on: not on
    machines whose v2 hierarchy lacks them.) The job reads its own cgroup's bounds."""
    from gandiva.node import cgroups
    from gandiva.node.accounts import processes_allowed

    probe = cgroups.Runs(tmp_path / "agent")  # (what the agent's will get)
    probe.close()
    if probe.limits != cgroups.LIMITED:
        pytest.skip("this machine's cgroup v2 hierarchy delegates no pids and memory "
                    f"controllers here (only {sorted(probe.limits)})")
    agent = Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=1e9, zygote=zygote)
    try:
        script = tmp_path / "bounds.py"
        script.write_text("import pathlib\n"
                          "mine = open('/proc/self/cgroup').read().split('::')[1].strip()\n"
                          "mount = [l.split()[1] for l in open('/proc/self/mounts')\n"
                          "         if l.split()[2] == 'cgroup2'][0]\n"
                          "here = pathlib.Path(mount + mine)\n"
                          "print('BOUNDS', (here / 'pids.max').read_text().strip(),\n"
                          "      (here / 'memory.max').read_text().strip())\n")
        agent.start("b", Launch(["{python}", str(script)]), (0,))
        ev = agent.events.get(timeout=90)
        while ev.job_id != "b" or ev.kind not in ("failed", "done"):
            ev = agent.events.get(timeout=90)
        assert ev.kind == "done", ev.data
        pids, memory = agent.read_log("b").decode().split("BOUNDS ")[1].split()[:2]
        assert int(pids) == processes_allowed()
        assert int(memory) < cgroups.memory_bytes()
    finally:
        agent.close()


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_ranks_of_a_job_on_one_machine_meet_at_a_file_only_its_account_can_reach(
        zygote, tmp_path):
    """init_process_group's env:// (unmodified scripts, Lightning, HF) meets at a FileStore
    in the job's own TMPDIR, not at a TCP store listening on every interface."""
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9,
                  zygote=zygote)
    script = tmp_path / "meet.py"
    script.write_text("import os, tempfile, torch\n"
                      "import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "t = torch.ones(1) * (dist.get_rank() + 1)\n"
                      "dist.all_reduce(t)\n"
                      "store = dist.distributed_c10d._get_default_store()\n"
                      "while hasattr(store, 'underlying_store'):  # (prefixes)\n"
                      "    store = store.underlying_store\n"
                      "print('MEET', type(store).__name__, int(t.item()),\n"
                      "      os.environ['GANDIVA_RENDEZVOUS_FILE'].startswith(\n"
                      "          tempfile.gettempdir()), flush=True)\n")
    try:
        agent.start("m", Launch(["{python}", str(script)]), (0, 1))
        ev = agent.events.get(timeout=90)
        while ev.job_id != "m" or ev.kind not in ("failed", "done"):
            ev = agent.events.get(timeout=90)
        assert ev.kind == "done", ev.data
        assert agent.jobs.get("m") is None
        for rank in (0, 1):
            assert "MEET FileStore 3 True" in agent.read_log("m", rank).decode(), rank
    finally:
        agent.close()


@pytest.mark.parametrize("devices", [(0,), (0, 1)], ids=["alone", "gang"])
def test_a_job_silent_past_the_hang_limit_is_killed_and_restarted_from_its_checkpoint(
        zygote, tmp_path, devices):
    """Rank 0 hangs at step 8 of its first run (in a gang, its partner waits for it in the
    next collective): nothing is reported, and after ``hang_s`` the whole job is killed and
    started again from its checkpoint, which ends it; its log says why. (A gang over several
    nodes is restarted whole by the scheduler, from the "crashed" the agent reports.)"""
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=0.0,
                  hang_s=3.0, zygote=zygote)
    marker, script = tmp_path / "hung-once", tmp_path / "hangs.py"
    script.write_text("import os, sys, time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(12):\n"
                      "    if step == 8 and job.rank == 0 and not os.path.exists(sys.argv[1]):\n"
                      "        open(sys.argv[1], 'w').close()\n"
                      "        time.sleep(600)  # hung\n"
                      "    if job.world_size > 1:  # a collective each step\n"
                      "        torch.distributed.all_reduce(torch.ones(1))\n")
    try:
        agent.start("h", Launch(["{python}", str(script), str(marker)]), devices)
        t0 = time.monotonic()
        kinds = []
        ev = agent.events.get(timeout=90)
        while ev.job_id != "h" or ev.kind not in ("failed", "done", "crashed"):
            kinds.append((ev.kind, ev.data if ev.kind == "restarted" else None))
            ev = agent.events.get(timeout=90)
        assert ev.kind == "done", ev.data
        restarts = [d for k, d in kinds if k == "restarted"]
        assert len(restarts) == 1 and "hung: no report from any rank for 3 s" in (
            restarts[0]["reason"])
        assert "restored from checkpoint at step" in agent.read_log("h").decode()
        assert time.monotonic() - t0 < 60
    finally:
        agent.close()


def test_an_evaluation_longer_than_the_hang_limit_is_not_taken_for_a_hang(zygote, tmp_path):
    """An evaluation of 6 s between two boundaries, with a pause point at each batch, under
    a 2 s hang limit: the job says it is alive there and is not restarted."""
    agent = Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=1e9, hang_s=2.0, zygote=zygote)
    script = tmp_path / "evaluates.py"
    script.write_text("import time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(6):\n"
                      "    if step == 3:\n"
                      "        for _ in range(120):\n"
                      "            time.sleep(0.05)\n"
                      "            job.pause_point()\n")
    try:
        agent.start("e", Launch(["{python}", str(script)]), (0,))
        kinds = []
        ev = agent.events.get(timeout=90)
        while ev.job_id != "e" or ev.kind not in ("failed", "done", "crashed"):
            kinds.append(ev.kind)
            ev = agent.events.get(timeout=90)
        assert ev.kind == "done" and "restarted" not in kinds
    finally:
        agent.close()


def test_a_first_mini_batch_longer_than_the_hang_limit_is_not_taken_for_a_hang(
        zygote, tmp_path):
    """Loading, compiling and autotuning before the first boundary (here 5 s) under a 2 s
    hang limit: the job says it is alive from a thread until that boundary."""
    agent = Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=1e9, hang_s=2.0,
                  zygote=zygote)
    script = tmp_path / "compiles.py"
    script.write_text("import time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(4):\n"
                      "    if step == 0:\n"
                      "        time.sleep(5)  # the first mini-batch: compiled\n")
    try:
        agent.start("c", Launch(["{python}", str(script)]), (0,))
        seen: list = []
        wait_for(agent, "done", "c", timeout=90, seen=seen)
        assert "restarted" not in [e.kind for e in seen], seen
    finally:
        agent.close()


@pytest.mark.parametrize("devices", [(0,), (0, 1)], ids=["alone", "gang"])
def test_a_suspend_during_an_evaluation_is_obeyed_there_and_a_checkpoint_waits_for_a_step(
        agent, tmp_path, devices):
    out, script = tmp_path / "phase.txt", tmp_path / "evaluates.py"
    script.write_text("import os, sys, time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(40):\n"
                      "    if step == 20:  # an evaluation of 300 batches on every rank, 3 s\n"
                      "        if job.rank == 0:\n"
                      "            open(sys.argv[1], 'w').write('evaluating')\n"
                      "        for _ in range(300):\n"
                      "            time.sleep(0.01)\n"
                      "            job.pause_point(collective=True)\n"
                      "        if job.rank == 0:\n"
                      "            open(sys.argv[1], 'w').write('training')\n")
    agent.start("e", Launch(["{python}", str(script), str(out)]), devices)
    started(agent, "e")
    until(lambda: out.exists() and out.read_text() == "evaluating", what="the evaluation")
    agent.suspend("e")
    assert agent.jobs["e"].suspended and not agent.jobs["e"].signalled  # by the library
    assert out.read_text() == "evaluating"  # in the evaluation, not after it
    agent.resume("e", devices)
    agent.restart("e", devices)  # its checkpoint is taken at the step after the evaluation
    assert started(agent, "e").restored == 21
    wait_for(agent, "done", "e")
