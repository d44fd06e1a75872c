"""Lightning scripts with nothing resumable by Lightning's own rules (a plain shuffled
``DataLoader``, dropout, gradient accumulation), for both of Lightning's packages, held
mid-epoch by the agent (suspended, then checkpointed, stopped and started again), and ended
bit-identical to the same script run alone. Real processes on CPU slots."""

from __future__ import annotations

import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from test_integrations import assert_same_training, installed, standalone_all  # noqa: E402
from test_runtime import EXAMPLES  # noqa: E402
from waiting import node_event, until  # noqa: E402

from gandiva.job import checkpoint  # noqa: E402
from gandiva.node.agent import Agent, Launch  # noqa: E402

# 1,024 samples in batches of 16: 64 mini-batches an epoch, 32 optimizer steps (2 accumulated)
ARGS = ["--epochs", "3", "--seed", "3"]
BATCHES, ACCUMULATE, STEPS = 64, 2, 96
SCRIPTS = {"pytorch_lightning": "pl_shuffled.py", "lightning.pytorch": "lightning_shuffled.py"}


def test_shuffled_dropout_accumulating_scripts_held_mid_epoch_end_bit_identical(zygote, tmp_path):
    installed("lightning", "pytorch_lightning")
    launches = {p: Launch(["{python}", str(EXAMPLES / s), *ARGS]) for p, s in SCRIPTS.items()}
    alone: dict = {}  # the references, run alone and uninterrupted, meanwhile
    references = threading.Thread(target=lambda: alone.update(standalone_all(
        tmp_path, {p: [sys.executable, str(EXAMPLES / s), *ARGS] for p, s in SCRIPTS.items()},
        preload=tuple(SCRIPTS))))
    references.start()
    agent = Agent(tmp_path / "agent", ["cpu:0", "cpu:1"], checkpoint_every_s=1e9, zygote=zygote)
    held, logs, backlog = {}, {}, []
    try:
        for slot, (package, launch) in enumerate(launches.items()):
            agent.start(package, launch, (slot,))
        slots = {package: slot for slot, package in enumerate(launches)}
        for _ in launches:  # each as soon as it runs: a run takes under a second
            package, data = event(agent, "started", launches, backlog)
            assert data.restored is None
            agent.suspend(package)  # at its next optimizer step, by the library
            job = agent.jobs[package]
            assert job.suspended and not job.signalled
        for package, launch in launches.items():
            agent.stop(package, checkpoint=True)  # the suspended job checkpoints as it waits
            agent.start(package, launch, (1 - slots[package],))
        for _ in launches:
            package, data = event(agent, "started", launches, backlog)
            held[package] = data.restored
        for package in launches:
            event(agent, "done", [package], backlog)
            logs[package] = (agent.job_dir(package) / "rank0.log").read_text()
    finally:
        agent.close()
        references.join(timeout=300)
    for package, log in logs.items():
        assert "restored from checkpoint" in log and "done: 96 steps" in log, log[-2000:]
        assert "dataloader is not resumable" not in log
        final = checkpoint.latest(agent.checkpoint_dir(package))[1]
        assert final["global_step"] == alone[package]["global_step"] == STEPS
        assert_same_training(final, alone[package],
                             ("state_dict", "optimizer_states", "lr_schedulers"))
        assert_held_at_an_optimizer_step(agent.checkpoint_dir(package), held[package])


def event(agent: Agent, kind: str, jobs, backlog: list):
    """The job and data of the next ``kind`` event of any of ``jobs``."""
    ev = node_event(agent, kind, jobs, backlog=backlog)
    return ev.job_id, ev.data


def assert_held_at_an_optimizer_step(directory, step: int) -> None:
    """The hold's checkpoint is named by its optimizer step, taken inside an epoch after
    whole accumulations."""
    state = torch.load(checkpoint.path(directory, step), weights_only=False)
    done = state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] + 1
    assert state["global_step"] == step
    assert done % ACCUMULATE == 0 and 0 < done < BATCHES, done
    assert step == state["epoch"] * BATCHES // ACCUMULATE + done // ACCUMULATE


def test_a_resumed_epoch_draws_the_same_order_and_loads_only_the_batches_left():
    from torch.utils.data import DataLoader, DistributedSampler

    from gandiva.job.integrations.lightning import ResumableSampler

    class Counting(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.loaded: list[int] = []

        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> int:
            self.loaded.append(i)
            return i

    data = Counting()
    for sampler in (None, DistributedSampler(data, num_replicas=2, rank=1, seed=5)):
        loader = DataLoader(data, batch_size=4, shuffle=sampler is None, sampler=sampler)
        wrapped = loader.batch_sampler.sampler = ResumableSampler(loader.batch_sampler.sampler)
        if sampler is not None:
            sampler.set_epoch(3)
        torch.manual_seed(1)
        whole = [b.tolist() for b in loader]
        order = wrapped.order_rng
        torch.manual_seed(2)  # the resumed run is elsewhere in the random stream
        data.loaded.clear()
        plans = iter([(order, 2 * 4)])  # this epoch resumed after two batches, then none
        wrapped.plan = lambda plans=plans: next(plans, None)
        assert [b.tolist() for b in loader] == whole[2:]
        assert data.loaded == [i for b in whole[2:] for i in b]
        if sampler is None:  # a new epoch draws a new order (its plan: None)
            assert [b.tolist() for b in loader] != whole


def test_a_suspend_during_validation_is_obeyed_at_a_validation_batch(zygote, tmp_path):
    installed("lightning")
    # its sanity check runs its whole validation first: 150 batches of 20 ms, 3 s
    agent = Agent(tmp_path / "agent", ["cpu:0"], checkpoint_every_s=1e9, zygote=zygote)
    try:
        agent.start("v", Launch(["{python}", str(EXAMPLES / "lightning_shuffled.py"),
                                 "--epochs", "1", "--samples", "2400", "--val-batches",
                                 "150", "--val-ms", "20", "--batch", "16"]), (0,))
        until(lambda: agent.jobs["v"].aware, what="the library's hello")
        # no event marks the validation's start: half a second after the hello, it is inside
        # its 3 s of validation (a suspend there is what is tested)
        time.sleep(0.5)
        agent.suspend("v")
        job = agent.jobs["v"]
        assert job.suspended and not job.signalled  # by the library, inside the validation
        assert job.replies["suspended:0"].step == 0  # before any training step
        agent.resume("v", (0,))
        assert not agent.jobs["v"].suspended
        agent.kill("v")
    finally:
        agent.close()
