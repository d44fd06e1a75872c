"""Scripts people already have, on real training processes (CPU slots): a Lightning script
that never imports gandiva, a Hugging Face Trainer script with one changed line, and a
torchrun DDP script that makes its own process group. Each is time-sliced, moved, restarted
from a checkpoint, and ends as if it had run alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_runtime import EXAMPLES, flatten  # noqa: E402

from gandiva.runtime import checkpoint  # noqa: E402
from gandiva.runtime.agent import Launch  # noqa: E402

ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def standalone(tmp: Path, command: list[str], timeout: float = 180) -> dict:
    """The final checkpoint of ``command`` run alone, uninterrupted, with no agent."""
    ckpt = tmp / "reference"
    env = {**os.environ, **ENV, "GANDIVA_CHECKPOINT_DIR": str(ckpt),
           "GANDIVA_CHECKPOINT_EVERY_S": "1e9"}
    env.pop("GANDIVA_CONTROL_FD", None)
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=timeout,
                   cwd=tmp)
    return checkpoint.latest(ckpt)[1]


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


def run_under_gandiva(tmp: Path, launches: dict[str, Launch], crash: str, spec_model: str):
    """Run ``launches`` (more jobs than the 2 slots) under ``gandiva:quantum=1``, with
    periodic checkpoints; kill job ``crash``'s process once it has checkpointed, so it
    restarts from that checkpoint. The backend's result."""
    from gandiva import actions as A
    from gandiva.policies import make_policy
    from gandiva.runtime.local import LocalBackend
    from gandiva.spec import JobSpec

    backend = LocalBackend(make_policy("gandiva:quantum=1:-pack"), tmp / "run", slots=2,
                           checkpoint_every_s=2.0, feedback_steps=10)
    for jid, launch in launches.items():
        backend.submit(JobSpec(jid, 0.0, 1, spec_model), launch)
    killed: list[int] = []

    def kill_once_checkpointed() -> None:
        directory = backend.agent.checkpoint_dir(crash)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            job = backend.agent.jobs.get(crash)
            if (job and job.ranks and job.aware and not job.suspended
                    and checkpoint.steps(directory)):
                killed.append(job.ranks[0].proc.pid)
                os.kill(job.ranks[0].proc.pid, signal.SIGKILL)
            time.sleep(0.2)

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


# ---- PyTorch Lightning: an unmodified script ---------------------------------------------

pl = pytest.importorskip("lightning.pytorch", reason="pip install -e '.[integrations]'")


def test_unmodified_lightning_script_time_sliced_restarted_ends_bit_identical(tmp_path):
    script = str(EXAMPLES / "lightning_mlp.py")
    runs = {f"l{i}": ["--epochs", "3", "--batches", "120", "--seed", str(i)] for i in range(3)}
    backend, result = run_under_gandiva(
        tmp_path, {j: Launch(["{python}", script, *a]) for j, a in runs.items()},
        crash="l0", spec_model="mlp")
    for jid, args in runs.items():
        ref = standalone(tmp_path / jid if (tmp_path / jid).mkdir() is None else tmp_path,
                         [sys.executable, script, *args])
        final = checkpoint.latest(backend.agent.checkpoint_dir(jid))[1]
        assert final["global_step"] == ref["global_step"] == 360
        assert_same_training(final, ref, ("state_dict", "optimizer_states", "lr_schedulers"))
    # a gandiva checkpoint is Lightning's own: plain torch.load opens it, fit() resumes it
    step, path = checkpoint.newest_whole(backend.agent.checkpoint_dir("l0"))
    assert "state_dict" in torch.load(path, weights_only=False)


# ---- Hugging Face Trainer: one changed line -------------------------------------------

def hf_training(state: dict) -> dict:
    """What training produced, from a packed Trainer checkpoint: weights, optimizer,
    scheduler, and the step."""
    import io
    import json

    from safetensors.torch import load as load_safetensors

    files = state["transformers_checkpoint"]
    return {"weights": load_safetensors(files["model.safetensors"]),
            "optimizer": torch.load(io.BytesIO(files["optimizer.pt"]), weights_only=False),
            "scheduler": torch.load(io.BytesIO(files["scheduler.pt"]), weights_only=False),
            "step": json.loads(files["trainer_state.json"])["global_step"]}


def test_hf_trainer_script_time_sliced_restarted_ends_bit_identical(tmp_path):
    pytest.importorskip("transformers", reason="pip install -e '.[integrations]'")
    script = str(EXAMPLES / "hf_bert.py")
    runs = {f"h{i}": ["--max-steps", "400", "--seed", str(i)] for i in range(3)}
    backend, result = run_under_gandiva(
        tmp_path, {j: Launch(["{python}", script, *a]) for j, a in runs.items()},
        crash="h0", spec_model="bert")
    for jid, args in runs.items():
        (tmp_path / jid).mkdir()
        ref = hf_training(standalone(tmp_path / jid, [sys.executable, script, *args]))
        final = hf_training(checkpoint.latest(backend.agent.checkpoint_dir(jid))[1])
        assert final["step"] == ref["step"] == 400
        assert_same_training(final, ref, ("weights", "optimizer", "scheduler"))
