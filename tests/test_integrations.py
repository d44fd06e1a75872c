"""Scripts people already have, on real training processes (CPU slots): a Lightning script
that never imports gandiva, a Hugging Face Trainer script with one changed line, and a
torchrun DDP script that makes its own process group. Each is time-sliced, moved, restarted
from a checkpoint, and ends as if it had run alone."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import alone as alone_env  # noqa: E402
from test_runtime import (  # noqa: E402
    EXAMPLES,
    assert_identical,
    flatten,
    started,
    wait_for,
)
from waiting import trains, until  # noqa: E402

from gandiva.job import checkpoint  # noqa: E402
from gandiva.node.agent import Agent, Launch  # noqa: E402
from gandiva.node.zygote import Zygote  # noqa: E402


def standalone(tmp: Path, command: list[str], timeout: float = 180) -> dict:
    """The final checkpoint of ``command`` run alone, uninterrupted, with no agent."""
    return standalone_all(tmp, {"reference": command}, timeout)["reference"]


def standalone_all(tmp: Path, commands: dict[str, list[str]], timeout: float = 300,
                   preload: tuple[str, ...] = ()) -> dict:
    """``standalone`` for several commands at once (one process each; see ``alone``)."""
    alone(tmp, commands, timeout, preload)
    return {name: checkpoint.latest(tmp / "alone" / name)[1] for name in commands}


# Forks each reference of a Python script from one process that has imported ``argv[1:]``,
# as the agent's zygote forks its jobs: each is its own process, run as ``python script``
# with its own environment (no agent: no control channel), but the references of a test pay
# the imports (torch, Lightning, transformers: ~3-8 s of CPU each) once between them.
RUNNER = """\
import json, os, sys
runs = json.load(sys.stdin)
for name in sys.argv[1:]:
    __import__(name)
from gandiva.job import warm, wire
pids = {}
for i, run in enumerate(runs):
    pid = os.fork()
    if pid == 0:  # as a warm job starts, with no agent: exits as python script.py does
        warm.enter(wire.Become(run["argv"], run["env"], run["cwd"]),
                   os.open(run["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    pids[pid] = i
codes = [None] * len(runs)
while pids:
    pid, status = os.wait()
    codes[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""


def alone(tmp: Path, commands: dict[str, list[str]], timeout: float = 300,
          preload: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> dict[str, str]:
    """Run each command alone, uninterrupted, with no agent and none of the environment
    ``drop`` names, its checkpoints in ``tmp/alone/<name>``; the output of each. The
    commands ``[sys.executable, script, ...]`` are forked from one process that has imported
    ``preload`` (``RUNNER``), the others (torchrun) run as they are."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("GANDIVA_CONTROL_FD", "GANDIVA_JOB_ID", *drop)}
    base.update(alone_env.ENV)

    def env(name: str) -> dict[str, str]:
        return {**base, "GANDIVA_CHECKPOINT_DIR": str(tmp / "alone" / name),
                "GANDIVA_CHECKPOINT_EVERY_S": "1e9"}

    (tmp / "alone").mkdir(parents=True, exist_ok=True)
    logs = {name: tmp / "alone" / f"{name}.log" for name in commands}
    forked = {name: c for name, c in commands.items()
              if c[0] == sys.executable and c[1].endswith(".py")}
    procs = {name: subprocess.Popen(c, env=env(name), cwd=tmp, stdout=logs[name].open("wb"),
                                    stderr=subprocess.STDOUT)
             for name, c in commands.items() if name not in forked}
    codes = {}
    if forked:
        runs = [{"argv": c[1:], "env": env(name), "cwd": str(tmp), "log": str(logs[name])}
                for name, c in forked.items()]
        runner = subprocess.run([sys.executable, "-c", RUNNER, *preload], env=base, cwd=tmp,
                                input=json.dumps(runs), capture_output=True, text=True,
                                timeout=timeout)
        assert runner.returncode == 0, runner.stdout + runner.stderr
        codes = dict(zip(forked, json.loads(runner.stdout.splitlines()[-1]), strict=True))
    for name, proc in procs.items():
        codes[name] = proc.wait(timeout=timeout)
    out = {name: logs[name].read_text(errors="replace") for name in commands}
    for name, code in codes.items():
        assert code == 0, f"{name}: exit status {code}\n{out[name][-3000:]}"
    return out


def installed(*packages: str) -> None:
    """Skip the test unless ``packages`` are installed, found without importing them here:
    importing Lightning costs this process ~6 s of CPU and sets variables in its environment
    (PYTORCH_NVML_BASED_CUDA_CHECK, TORCHINDUCTOR_CACHE_DIR) that its agents' jobs would
    inherit, and a job whose environment differs from the warm zygote's starts cold."""
    for package in packages:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed: pip install -e '.[integrations]'")


def assert_same_training(a: dict, b: dict, keys: tuple[str, ...]) -> None:
    """Bit-identical in what training produced: parameters, optimizer and schedule state."""
    for key in keys:
        fa, fb = flatten(a[key]), flatten(b[key])
        assert fa.keys() == fb.keys(), key
        for k in fa:
            if torch.is_tensor(fa[k]):
                assert torch.equal(fa[k], fb[k]), f"{key}.{k} differs"
            else:
                assert fa[k] == fb[k], f"{key}.{k} differs"


def run_time_sliced(zygote: Zygote, tmp: Path, launches: dict[str, Launch], crash: str,
                    spec_model: str, last_step: int):
    """Run ``launches`` (more jobs than the one slot) in turns of a second (``slicer``), with
    periodic checkpoints; kill job ``crash``'s process once it has checkpointed before its
    ``last_step``, so it restarts from that checkpoint with work left. The backend's result."""
    from gandiva import actions as A
    from gandiva.backends.driver import Driver
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    backend = Driver(make_policy("slicer:quantum=1"), tmp / "run", slots=1,
                     checkpoint_every_s=0.5, feedback_steps=10, zygote=zygote)
    for jid, launch in launches.items():
        backend.submit(JobSpec(jid, 0.0, 1, spec_model), launch)
    killed: list[int] = []

    def kill_once_checkpointed() -> None:
        directory = backend.agent.checkpoint_dir(crash)

        def running_with_work_left():
            job = backend.agent.jobs.get(crash)
            steps = checkpoint.steps(directory)
            return job if (job and job.ranks and job.aware and not job.suspended and steps
                           and max(steps) < last_step) else None
        job = until(running_with_work_left, 240, f"{crash} to checkpoint with work left")
        killed.append(job.ranks[0].proc.pid)
        os.kill(job.ranks[0].proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_checkpointed, daemon=True)
    killer.start()
    result = backend.run(timeout=400)
    killer.join(timeout=5)
    assert killed, "the job never checkpointed, so it was never killed"
    assert [j.status for j in result.jobs] == ["done"] * len(launches)
    kinds = {type(a) for _, a, _ in result.actions}
    assert A.Suspend in kinds and A.Resume in kinds  # more jobs than slots: time-sliced
    log = (backend.agent.job_dir(crash) / "rank0.log").read_text()
    assert "restored from checkpoint" in log or "Restoring states" in log, log[-2000:]
    return backend, result


# ---- torchrun DDP: a script that makes its own process group -------------------------------

def test_torchrun_ddp_script_runs_as_one_gang_time_sliced_and_ends_bit_identical(zygote, tmp_path):
    script, args = str(EXAMPLES / "ddp.py"), ["--steps", "800", "--seed", "4"]
    # the reference: the same script launched by torchrun itself, no gandiva
    ref = standalone(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node=2", script, *args])
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9, zygote=zygote)
    try:
        agent.start("d", Launch(["torchrun", "--nproc-per-node=2", script, *args]), (0, 1))
        assert started(agent, "d").restored is None
        assert len(agent.jobs["d"].ranks) == 2  # one process per rank, not torchrun's 2 x 2
        for devices in ((1, 0), (0, 1), (1, 0)):
            trains(agent, "d")
            agent.suspend("d")  # both ranks, at one boundary, through the library
            assert agent.jobs["d"].suspended and not agent.jobs["d"].signalled
            agent.resume("d", devices)
        agent.restart("d", (0, 1))  # checkpoint, stop, start again: a move's path
        assert started(agent, "d").restored > 0
        wait_for(agent, "done", "d")
        assert_identical(checkpoint.latest(agent.checkpoint_dir("d"))[1], ref)
        log = (agent.job_dir("d") / "rank0.log").read_text()
        assert "torchrun unwrapped" in log and "done: 800 steps on 2 ranks" in log
        assert "initialized twice" not in log
    finally:
        agent.close()


def test_ranks_get_torchruns_whole_environment_and_meet_at_the_agents_store(zygote, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')  # env://, at the store the agent hosts\n"
        "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',\n"
        "        'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID',\n"
        "        'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_USE_AGENT_STORE']\n"
        "print(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "dist.barrier()\n")
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], zygote=zygote)
    try:
        agent.start("p", Launch(["torchrun", "--nproc-per-node", "2", str(probe)]), (0, 1))
        wait_for(agent, "done", "p")
    finally:
        agent.close()
    import json

    seen = [json.loads(next(line for line in (agent.job_dir("p") / f"rank{r}.log")
                            .read_text().splitlines() if line.startswith("{")))
            for r in (0, 1)]
    assert [e["RANK"] for e in seen] == ["0", "1"] == [e["LOCAL_RANK"] for e in seen]
    for e in seen:
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "2"
        assert e["GROUP_RANK"] == e["NODE_RANK"] == "0"
        assert e["TORCHELASTIC_RUN_ID"] == "p" and e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["MASTER_PORT"] == seen[0]["MASTER_PORT"]


def test_torchrun_commands_are_unwrapped_and_a_conflicting_width_is_refused():
    from gandiva.node import torchrun
    from gandiva.server.jobspec import SpecError, parse

    assert torchrun.unwrap(["torchrun", "--standalone", "--nproc-per-node=4", "t.py", "--lr",
                            "1"]) == ["{python}", "t.py", "--lr", "1"]
    assert torchrun.unwrap(["python", "-m", "torch.distributed.run", "-m", "pkg.train"]) == [
        "{python}", "-m", "pkg.train"]
    assert torchrun.unwrap(["torchrun", "--no-python", "./train.sh"]) == ["./train.sh"]
    assert torchrun.unwrap(["python", "t.py"]) == ["python", "t.py"]
    assert torchrun.worker_count(["torchrun", "--nnodes=2", "--nproc-per-node=4", "t.py"]) == 8
    assert torchrun.worker_count(["torchrun", "--nnodes=1:4", "--nproc-per-node=4", "t.py"]) is None
    assert parse("name: d\ncommand: torchrun --nproc-per-node=2 t.py\ngpus: 2").gpus == 2
    with pytest.raises(SpecError, match="torchrun asks for 4 workers .* but gpus is 2"):
        parse("name: d\ncommand: torchrun --nproc-per-node=4 t.py\ngpus: 2")
    with pytest.raises(SpecError, match="unrecognized arguments: --bogus"):
        parse("name: d\ncommand: torchrun --bogus t.py\ngpus: 2")
    with pytest.raises(SpecError, match="--help would have torchrun exit"):  # not SystemExit
        parse("name: d\ncommand: torchrun --help\ngpus: 2")


# ---- PyTorch Lightning: an unmodified script ---------------------------------------------

@pytest.mark.slow  # (CI runs it after the suite: .ci/run)
def test_unmodified_lightning_script_time_sliced_restarted_ends_bit_identical(zygote, tmp_path):
    installed("lightning")
    script = str(EXAMPLES / "lightning_mlp.py")
    # 1,200 mini-batches: about 2 s of running on a fast core, so that the job is seen running
    # between its first periodic checkpoint and its end (at 360 it ended inside that window on CI)
    runs = {f"l{i}": ["--epochs", "3", "--batches", "400", "--seed", str(i)] for i in range(2)}
    backend, result = run_time_sliced(
        zygote, tmp_path, {j: Launch(["{python}", script, *a]) for j, a in runs.items()},
        crash="l0", spec_model="mlp", last_step=1200)
    refs = standalone_all(tmp_path, {j: [sys.executable, script, *a] for j, a in runs.items()},
                          preload=("lightning.pytorch",))
    for jid, ref in refs.items():
        final = checkpoint.latest(backend.agent.checkpoint_dir(jid))[1]
        assert final["global_step"] == ref["global_step"] == 1200
        assert_same_training(final, ref, ("state_dict", "optimizer_states", "lr_schedulers"))
    # a gandiva checkpoint is Lightning's own: plain torch.load opens it, fit() resumes it
    step, path = checkpoint.newest_whole(backend.agent.checkpoint_dir("l0"))
    assert "state_dict" in torch.load(path, weights_only=False)


# ---- Hugging Face Trainer: one changed line -------------------------------------------

@pytest.mark.slow  # (CI runs it after the suite: .ci/run)
def test_hf_trainer_script_time_sliced_restarted_ends_bit_identical(zygote, tmp_path):
    pytest.importorskip("transformers", reason="pip install -e '.[integrations]'")
    script = str(EXAMPLES / "hf_bert.py")
    runs = {f"h{i}": ["--max-steps", "400", "--seed", str(i)] for i in range(2)}
    backend, result = run_time_sliced(
        zygote, tmp_path, {j: Launch(["{python}", script, *a]) for j, a in runs.items()},
        crash="h0", spec_model="bert", last_step=400)
    from test_hf import HF_IMPORTS, hf_training, run_alone  # a Trainer's checkpoint: a tar

    refs = run_alone(tmp_path, {j: [sys.executable, script, *a] for j, a in runs.items()},
                     preload=HF_IMPORTS)
    for jid, (ref_file, _) in refs.items():
        ref = hf_training(ref_file)
        final = hf_training(checkpoint.newest_whole(backend.agent.checkpoint_dir(jid))[1])
        assert final["step"] == ref["step"] == 400
        assert_same_training(final, ref, ("weights", "optimizer", "scheduler"))
