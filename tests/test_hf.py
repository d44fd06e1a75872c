"""The Hugging Face Trainer integration (``gandiva.job.integrations.hf``), on real Trainer
processes (CPU slots): streamed one-file checkpoints, the script's save strategies left as
they are, no DDP for a one-process job, and the data position across a resize."""

from __future__ import annotations

import io
import json
import os
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="pip install -e '.[integrations]'")

from held import Held  # noqa: E402
from test_runtime import EXAMPLES, flatten  # noqa: E402

from gandiva.job import checkpoint  # noqa: E402
from gandiva.job.integrations import hf  # noqa: E402
from gandiva.node.agent import Agent, Launch  # noqa: E402

SCRIPT = str(EXAMPLES / "hf_bert.py")
# what torchrun (or an agent) sets: a one-process job run by hand has none of it
# what hf_bert.py imports (Trainer's own imports: accelerate, ...), ~1 s of CPU over torch
HF_IMPORTS = ("transformers.trainer", "transformers.models.bert.modeling_bert",
              "gandiva.job.integrations.hf")
TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_USE_AGENT_STORE", "GANDIVA_CONTROL_FD", "GANDIVA_JOB_ID")


# ---- helpers (the HF test in test_integrations uses them too) --------------------------------

def run_alone(tmp: Path, commands: dict[str, list[str]], timeout: float = 300,
              preload: tuple[str, ...] = ()) -> dict:
    """Run each command alone (no agent, no torchrun environment unless the command is
    torchrun), uninterrupted; the final checkpoint file and the output of each. The Python
    scripts fork from one process that has imported ``preload`` (``test_integrations.alone``)."""
    from test_integrations import alone

    out = alone(tmp, commands, timeout, preload, drop=TORCHRUN)
    return {name: (checkpoint.newest_whole(tmp / "alone" / name)[1], text)
            for name, text in out.items()}


def hf_training(file: Path) -> dict:
    """What training produced, from a gandiva checkpoint of a Trainer: weights, optimizer,
    scheduler, and the step."""
    from safetensors.torch import load as load_safetensors

    def load(name: str):
        return torch.load(io.BytesIO(hf.read(file, name)), weights_only=False)

    return {"weights": load_safetensors(hf.read(file, "model.safetensors")),
            "optimizer": load("optimizer.pt"), "scheduler": load("scheduler.pt"),
            "step": json.loads(hf.read(file, "trainer_state.json"))["global_step"]}


def assert_same(a: dict, b: dict, keys=("weights", "optimizer", "scheduler"), close=False):
    """Bit-identical (or, with ``close``, equal to rounding) in what training produced."""
    for key in keys:
        fa, fb = flatten(a[key]), flatten(b[key])
        assert fa.keys() == fb.keys(), key
        for k in fa:
            if torch.is_tensor(fa[k]) and close and fa[k].is_floating_point():
                torch.testing.assert_close(fa[k], fb[k], rtol=1e-3, atol=1e-4)
            elif torch.is_tensor(fa[k]):
                assert torch.equal(fa[k], fb[k]), f"{key}.{k} differs"
            else:
                assert fa[k] == fb[k], f"{key}.{k} differs"


class Events:
    """An agent's events, by job: waiting for one job's keeps the others'."""

    def __init__(self, agent: Agent) -> None:
        self.agent, self.kept = agent, []

    def wait(self, job_id: str, kind: str, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.kept:
                if ev.job_id == job_id and ev.kind in (kind, "failed"):
                    self.kept.remove(ev)
                    assert ev.kind == kind, ev.data["reason"]
                    return ev.data
            try:
                self.kept.append(self.agent.events.get(timeout=0.2))
            except queue.Empty:
                pass
        raise AssertionError(f"no {kind!r} event for {job_id} within {timeout} s: "
                             f"{[(e.kind, e.job_id) for e in self.kept]}")


# ---- the checkpoint file -----------------------------------------------------------------

def test_checkpoint_file_is_streamed_not_held_in_memory_and_the_earlier_format_restores(
        tmp_path):
    folder = tmp_path / "checkpoint-7"
    (folder / "sub").mkdir(parents=True)
    big = os.urandom(1 << 20) * 48  # 48 MB
    (folder / "model.safetensors").write_bytes(big)
    (folder / "sub" / "x.json").write_text("{}")
    with Held() as held:
        hf.pack(folder, tmp_path / "packed", {hf.META: b'{"world_size": 1}'})
        hf.unpack(tmp_path / "packed", tmp_path / "out")
    assert held.mib < 8, held.mib  # a few copy buffers, never the 48 MB file
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == big
    assert (tmp_path / "out" / "sub" / "x.json").read_text() == "{}"
    assert hf.read(tmp_path / "packed", hf.META) == b'{"world_size": 1}'
    # checkpoints of running jobs, written before: one torch.save dict of the files' bytes
    torch.save({hf.KEY: {"a.txt": b"old", "d/b.bin": b"\x00\x01"}}, tmp_path / "old.pt")
    hf.unpack(tmp_path / "old.pt", tmp_path / "old")
    assert (tmp_path / "old" / "d" / "b.bin").read_bytes() == b"\x00\x01"
    assert hf.read(tmp_path / "old.pt", "a.txt") == b"old"


def test_rng_files_follow_the_ranks_of_a_new_width(tmp_path):
    for rank in range(2):
        (tmp_path / f"rng_state_{rank}.pth").write_bytes(b"r%d" % rank)
    hf.rng_for_width(tmp_path, 2, 1)  # a one-process Trainer reads rng_state.pth
    assert (tmp_path / "rng_state.pth").read_bytes() == b"r0"
    hf.rng_for_width(tmp_path, 2, 4)
    assert [(tmp_path / f"rng_state_{r}.pth").read_bytes() for r in range(4)] == [
        b"r0", b"r1", b"r0", b"r1"]


# ---- save strategies, and a one-process job without DDP --------------------------------

def script_checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("checkpoint-*"))


@pytest.mark.slow  # (CI runs it after the suite: .ci/run)
def test_save_strategies_best_and_no_keep_their_saves_and_gandivas_moves_complete(zygote, tmp_path):
    """"best" evaluates every 2 steps and saves only a new best (it overwrites
    ``control.should_save``); a move must still get its checkpoint, the script's
    ``output_dir`` must hold what it holds alone, and the end must be bit-identical."""
    common = ["--max-steps", "150", "--examples", "512", "--batch", "8", "--eval-steps", "2",
              "--eval-examples", "16", "--seed", "3"]
    runs = {s: [*common, "--save-strategy", s] for s in ("best", "no")}
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9, zygote=zygote)
    events = Events(agent)
    try:
        for slot, (name, args) in enumerate(runs.items()):
            agent.start(name, Launch(["{python}", SCRIPT, *args, "--output-dir", "out"]),
                        (slot,))
        for name in runs:
            assert events.wait(name, "started").restored is None
        # both held at once, neither ends while the other is moved; suspended together: one
        # after the other, "no" ran to its end while "best" waited for its step (under load)
        with ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(agent.suspend, runs))
        for slot, name in enumerate(runs):
            agent.resume(name, (slot,))
            agent.suspend(name)
            agent.restart(name, (slot,))  # checkpoint while suspended, exit, start again
            assert events.wait(name, "started").restored > 0
        for name in runs:
            events.wait(name, "done")
    finally:
        agent.close()
    alone = run_alone(tmp_path, {n: [sys.executable, SCRIPT, *a, "--output-dir",
                                     str(tmp_path / n)] for n, a in runs.items()},
                      preload=HF_IMPORTS)
    for name, (file, output) in alone.items():
        # item: a one-process job run without torchrun's environment is not DDP
        assert "1 process(es), not_parallel" in output, output[-2000:]
        assert "wrapped as BertForSequenceClassification" in output, output[-2000:]
        final = hf_training(checkpoint.newest_whole(agent.checkpoint_dir(name))[1])
        ref = hf_training(file)
        assert final["step"] == ref["step"] == 150
        assert_same(final, ref)
        mine = script_checkpoints(agent.job_dir(name) / "out")
        assert mine == script_checkpoints(tmp_path / name), name
    assert script_checkpoints(tmp_path / "best") and not script_checkpoints(tmp_path / "no")


# ---- resizing: the data position -----------------------------------------------------------

TRACED = """\
import os, sys
sys.path.insert(0, {examples!r})
import torch
import hf_bert
from transformers import TrainerCallback
from gandiva.job.integrations import hf


class Indexed(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return {{**self.data[i], "index": i}}


class Step(TrainerCallback):
    now = 0
    def on_step_begin(self, args, state, control, **_):
        Step.now = state.global_step + 1


trace = open(sys.argv[-1] + f".{{os.getpid()}}", "a")


def strip(module, args, kwargs):
    index = kwargs.pop("index")
    if module.training:  # the samples each optimizer step trains on
        trace.write(f"{{Step.now}} {{' '.join(map(str, index.tolist()))}}\\n")
        trace.flush()
    return args, kwargs


trainer = hf_bert.build(hf_bert.parse(sys.argv[1:-1]))
trainer.train_dataset = Indexed(trainer.train_dataset)
trainer.args.remove_unused_columns = False  # keep "index" for the hook
trainer.add_callback(Step())
trainer.model.register_forward_pre_hook(strip, with_kwargs=True)
hf.train(trainer)
print(f"done on {{trainer.args.world_size}} ranks")
"""


def samples_by_step(prefix: Path) -> dict[int, list[int]]:
    """Which samples each optimizer step trained on, over every process of a run."""
    seen: dict[int, list[int]] = {}
    for part in prefix.parent.glob(prefix.name + ".*"):
        for line in part.read_text().splitlines():
            step, *index = map(int, line.split())
            seen.setdefault(step, []).extend(index)
    return {step: sorted(index) for step, index in seen.items()}


@pytest.mark.slow  # (CI runs it after the suite: .ci/run; ~50 s each)
def test_resized_job_trains_every_step_on_the_samples_it_would_have_alone(zygote, tmp_path):
    """Checkpointed at width 2 (DDP over gloo), resumed at width 1, then at 2 again: each
    optimizer step trains on the same samples as the run at width 2 alone (none repeated,
    none skipped, across epochs), and the weights agree to rounding (no dropout: its masks
    are drawn per rank, so they cannot match across widths)."""
    script = tmp_path / "traced.py"
    script.write_text(TRACED.format(examples=str(EXAMPLES)))
    # 20 optimizer steps an epoch (global batch 16), eight epochs
    args = ["--max-steps", "160", "--examples", "320", "--batch", "8", "--dropout", "0",
            "--seed", "5"]
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9, zygote=zygote)
    events = Events(agent)
    try:
        agent.start("r", Launch(["{python}", str(script), *args, str(tmp_path / "run")]),
                    (0, 1))
        restored = []
        events.wait("r", "started")
        for devices in ((0,), (0, 1)):
            agent.suspend("r")
            agent.restart("r", devices)
            restored.append(events.wait("r", "started").restored)
        events.wait("r", "done")
    finally:
        agent.close()
    alone = run_alone(tmp_path, {"r": [sys.executable, "-m", "torch.distributed.run",
                                       "--standalone", "--nproc-per-node=2", str(script),
                                       *args, str(tmp_path / "alone-trace")]})
    log = (agent.job_dir("r") / "rank0.log").read_text()
    assert "resized from 2 to 1 ranks: per-device batch 8, gradient accumulation 2" in log
    assert "resized from 1 to 2 ranks: per-device batch 8, gradient accumulation 1" in log
    assert 0 < restored[0] <= restored[1] < 160, restored
    ref = samples_by_step(tmp_path / "alone-trace")
    assert sorted(ref) == list(range(1, 161)) and all(len(s) == 16 for s in ref.values())
    assert samples_by_step(tmp_path / "run") == ref
    final = hf_training(checkpoint.newest_whole(agent.checkpoint_dir("r"))[1])
    expected = hf_training(alone["r"][0])
    assert final["step"] == expected["step"] == 160
    assert_same(final, expected, close=True)


def test_a_width_that_cannot_keep_the_global_batch_is_refused(tmp_path):
    callback = hf.GandivaCallback.__new__(hf.GandivaCallback)

    class Args:
        world_size, per_device_train_batch_size, gradient_accumulation_steps = 3, 8, 1

    callback.trainer = type("T", (), {"args": Args()})()
    callback.resumed = {"world_size": 2, "global_batch": 16}
    with pytest.raises(RuntimeError, match="global batch of 16 samples on 3 ranks"):
        callback.fit_width()


@pytest.mark.slow  # (CI runs it after the suite: .ci/run; ~50 s each)
def test_a_trainer_restored_from_the_checkpoint_of_its_last_step_takes_no_step_more(tmp_path):
    """The Trainer's loop takes a step before it looks at max_steps: a job moved or restarted
    as it ended (its last checkpoint mid-epoch) would train one step more than alone."""
    import subprocess

    env = {**os.environ, "GANDIVA_CHECKPOINT_DIR": str(tmp_path / "ck"),
           "GANDIVA_CHECKPOINT_EVERY_S": "1e9"}
    for k in TORCHRUN:
        env.pop(k, None)
    command = [sys.executable, SCRIPT, "--max-steps", "20", "--examples", "64", "--batch", "4"]
    subprocess.run(command, env=env, capture_output=True, timeout=180, check=True)
    step, file = checkpoint.newest_whole(tmp_path / "ck")
    assert step == 20  # 16 steps an epoch: the last one is mid-epoch
    last = file.read_bytes()
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180,
                           check=True)
    assert "restored from checkpoint at step 20" in again.stderr + again.stdout
    assert "done: 20 steps" in again.stdout
    step, file = checkpoint.newest_whole(tmp_path / "ck")
    assert step == 20 and file.read_bytes() == last
