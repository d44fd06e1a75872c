"""Gangs of unmodified scripts on the node agent, and what a warm start must honour: the end
of a script that leaves its process group to the interpreter, and an environment that acts
when Python or torch starts."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from test_runtime import stopped, wait_for  # noqa: E402
from waiting import until  # noqa: E402

from gandiva.job import wire  # noqa: E402
from gandiva.node.agent import Agent, Launch  # noqa: E402
from gandiva.node.zygote import Forked, Zygote, warm_compatible  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOB_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # what the agent gives every job


def warm_agent(zygote: Zygote, tmp_path: Path, devices: int) -> Agent:
    return Agent(tmp_path / "agent", [f"cpu:{d}" for d in range(devices)],
                 checkpoint_every_s=1e9, max_restarts=0, zygote=zygote)


def halted(pid: int) -> bool:
    """Stopped by a signal; False once it has exited (a zombie, or gone)."""
    try:
        return stopped(pid)
    except OSError:
        return False


def test_an_unmodified_ddp_gang_time_sliced_by_signals_ends_done(zygote, tmp_path):
    """Both ranks of a warm-started torchrun script that never calls destroy_process_group
    exit 0 after several SIGSTOP/SIGCONT turns."""
    agent = warm_agent(zygote, tmp_path, 2)
    try:
        agent.start("g", Launch(["{python}", str(EXAMPLES / "ddp_plain.py"), "--steps", "400"]),
                    (0, 1))
        assert all(isinstance(r.proc, Forked) for r in agent.jobs["g"].ranks)
        for _ in range(4):
            # what is tested: turns while it trains (a script that never speaks the
            # library's protocol says nothing of its progress, so it runs a set time)
            time.sleep(0.15)
            agent.suspend("g")
            if "g" not in agent.jobs:
                break  # it ended between turns
            assert agent.jobs["g"].signalled
            ranks = agent.jobs["g"].ranks
            until(lambda ranks=ranks: "g" not in agent.jobs or all(
                halted(r.proc.pid) for r in ranks), 30,
                "both ranks stopped, or the job ended as they were signalled")
            if "g" not in agent.jobs:
                break  # (it ended as it was suspended: SIGSTOP came after its last step)
            agent.resume("g", (0, 1))
        wait_for(agent, "done", "g", timeout=60)
        for rank in (0, 1):
            assert f"rank {rank} of 2" in agent.read_log("g", rank).decode()
    finally:
        agent.close()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_script_s_groups_are_destroyed_after_atexit_before_shutdown(zygote, tmp_path, warm):
    """What the script leaves, its process (a fork of the zygote, or a cold start through
    ``gandiva.job.warm --cold``) destroys after the script's atexit handlers and before the
    interpreter finalizes (when gloo's threads could no longer take the GIL)."""
    out = tmp_path / "out.txt"
    script = tmp_path / "leaves_its_group.py"
    script.write_text(
        "import atexit, sys\n"
        "import torch, torch.distributed as dist\n"
        "out = open(sys.argv[1], 'w', buffering=1)\n"
        "destroy = dist.destroy_process_group\n"
        "def traced(*a):\n"
        "    out.write(f'destroy finalizing={sys.is_finalizing()}\\n')\n"
        "    destroy(*a)\n"
        "dist.destroy_process_group = traced\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "t = torch.ones(3)\n"
        "dist.all_reduce(t)  # a collective from Python, left behind\n"
        "atexit.register(lambda: out.write(f'atexit {dist.is_initialized()}\\n'))\n"
        "sys.exit(0)\n")
    agent = (warm_agent(zygote, tmp_path, 1) if warm else
             Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=1e9, max_restarts=0,
                   warm=False))
    try:
        agent.start("s", Launch(["{python}", str(script), str(out)]), (0,))
        wait_for(agent, "done", "s", timeout=60)
        assert out.read_text().splitlines() == ["atexit True", "destroy finalizing=False"]
    finally:
        agent.close()


# ---- the environment a warm start honours ---------------------------------------------------

def test_warm_compatible_compares_only_what_acts_at_start_up():
    zygote = {"PATH": "/bin", "HOME": "/root", **JOB_ENV}
    job = {**zygote, "RANK": "1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "1,0",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_RUN_ID": "j",
           "GANDIVA_JOB_ID": "j", "HOME": "/home/other"}
    assert warm_compatible(zygote, job) is None  # read after the fork, or not torch's
    for name, value in [("OMP_NUM_THREADS", "2"), ("MKL_NUM_THREADS", "4"),
                        ("LD_PRELOAD", "/lib/libjemalloc.so"), ("PYTHONHASHSEED", "0"),
                        ("TORCH_LOGS", "+dynamo"), ("TORCHINDUCTOR_CACHE_DIR", "/tmp/x"),
                        ("OPENBLAS_NUM_THREADS", "1"), ("KMP_AFFINITY", "compact")]:
        assert warm_compatible(zygote, {**job, name: value}) == name
    assert warm_compatible({**zygote, "LD_LIBRARY_PATH": "/opt"}, job) == "LD_LIBRARY_PATH"
    assert warm_compatible(zygote, {**job, "OMP_NUM_THREADS": "2", "LD_PRELOAD": "x"}) \
        == "LD_PRELOAD"  # the first by name


def become(zygote: Zygote, tmp_path: Path, script: Path, env: dict[str, str]) -> int:
    """Fork a warm process, make it run ``script``, and return its exit status."""
    forked = zygote.fork()
    assert forked is not None
    proc, ours = forked
    with ours:
        log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        socket.send_fds(ours, [wire.encode(wire.Become([str(script)], env, str(tmp_path)))],
                        [log])
        os.close(log)
        return proc.wait(timeout=60)


def test_the_zygote_starts_with_the_jobs_environment_and_a_fork_sizes_torch_s_pool(tmp_path):
    zygote = Zygote(sys.executable, tmp_path, env=JOB_ENV)
    try:
        until(lambda: zygote.ready, 60, "the zygote to be ready")
        assert {k: zygote.env[k] for k in JOB_ENV} == JOB_ENV
        environ = Path(f"/proc/{zygote.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"OMP_NUM_THREADS=1" in environ and b"PYTHONUNBUFFERED=1" in environ
        out = tmp_path / "threads.txt"
        script = tmp_path / "threads.py"
        script.write_text("import torch\n"
                          f"open({str(out)!r}, 'w').write(str(torch.get_num_threads()))\n")
        assert become(zygote, tmp_path, script, {**zygote.env, "OMP_NUM_THREADS": "2"}) == 0
        assert out.read_text() == "2"
    finally:
        zygote.close()


def test_a_job_whose_environment_acts_at_start_up_starts_cold(zygote, tmp_path):
    out = tmp_path / "facts.txt"
    script = tmp_path / "facts.py"
    script.write_text("import os, sys\n"
                      "facts = f'{os.getppid()} {\"torch\" in sys.modules}'\n"
                      "open(sys.argv[1], 'a').write(facts + '\\n')\n")
    agent = warm_agent(zygote, tmp_path, 1)
    try:
        agent.start("warm", Launch(["{python}", str(script), str(out)]), (0,))
        wait_for(agent, "done", "warm")
        agent.start("cold", Launch(["{python}", str(script), str(out)],
                                   env={"TORCH_SHOW_CPP_STACKTRACES": "1"}), (0,))
        wait_for(agent, "done", "cold")
        warm, cold = (line.split() for line in out.read_text().splitlines())
        zygote = warm[0]  # a warm job's parent: the zygote, which imported torch
        assert zygote != str(os.getpid()) and warm[1] == "True"
        assert cold[0] != zygote and cold[1] == "False"
    finally:
        agent.close()

