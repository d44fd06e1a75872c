"""The DDP gang that did not end (issue 54): unmodified 2-rank gloo DDP scripts (their own
``init_process_group`` and ``destroy_process_group``, under their torchrun line), four at
once on two slots, time-sliced every 2 s: the load under which one rank stayed in its
teardown after its result was out (rank 0 here, in the first round: the stack of the
issue). ``GANDIVA_DDP_ROUNDS`` rounds (20 by default); each job must end done, none failed
or restarted; how many hung at their end (and were ended by the agent) is printed.

    .venv/bin/python -m pytest -q -m slow tests/test_ddp_exit.py   # about a minute a round
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

# What such a script is: nothing of gandiva's; its own group, DDP, its own end
PLAIN_DDP = """\
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
steps = ap.parse_args().steps


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(32, 64)).square().mean().backward()
        opt.step()
    if dist.get_rank() == 0:
        print("result", float(sum(p.sum() for p in model.parameters())), flush=True)
    dist.destroy_process_group()


main()
"""


def test_four_plain_ddp_gangs_time_sliced_on_two_slots_all_end_done_round_after_round(
        zygote, tmp_path):
    from gandiva.backends.driver import Driver
    from gandiva.node.agent import STRAGGLED, Launch
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    script = tmp_path / "plain_ddp.py"
    script.write_text(PLAIN_DDP)
    rounds = int(os.environ.get("GANDIVA_DDP_ROUNDS", "20"))
    outcomes = []
    for n in range(rounds):
        backend = Driver(make_policy("slicer:quantum=2"), tmp_path / f"run{n}", slots=2,
                         zygote=zygote)
        for i in range(4):
            backend.submit(JobSpec(f"d{i}", 0.0, 2, "unknown"), Launch(
                ["torchrun", "--nproc-per-node=2", str(script), "--steps", "600"]))
        result = backend.run(timeout=900)
        outcomes += [(n, r.spec.id, r.status, r.restarts, r.reason) for r in result.jobs]
    bad = [o for o in outcomes if o[2] != "done" or o[3]]
    hung = [o for o in outcomes if o[4].startswith(STRAGGLED)]  # ended by the agent's rule
    print(f"{rounds} rounds, {len(outcomes)} jobs: {len(hung)} hung at exit (killed, done), "
          f"{len(bad)} not done or restarted: {bad}")
    assert bad == []
