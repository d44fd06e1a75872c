"""The checks of benchmarks/gpu_check.sh that need a GPU and the job library, one per
subcommand; each prints what it measured and exits non-zero if the behaviour is wrong.

    python benchmarks/gpu_checks.py memory --mb 1000   # suspend frees device memory; resume
    python benchmarks/gpu_checks.py nccl               # a 1-rank NCCL job through the agreement
    python benchmarks/gpu_checks.py frameworks         # Lightning and HF jobs time-sliced
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def smi_used_mb() -> float:
    """The GPU's used memory as nvidia-smi sees it (the driver's view, not the allocator's)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                          "nounits", "-i", "0"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def memory(mb: float) -> None:
    from gandiva.job import Job

    job = Job({"GANDIVA_DEVICE": "cuda:0"})
    n = int((mb * 2**20 / 4 / 3) ** 0.5)  # weights + Adam's two moments: about ``mb``
    model = torch.nn.Linear(n, n, bias=False).cuda()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, n, device="cuda")).sum().backward()
    opt.step()
    job.register(model=model, optimizer=opt)
    weights = model.weight.detach().cpu().clone()
    torch.cuda.synchronize()
    rows = [("running", torch.cuda.memory_reserved() / 2**20, smi_used_mb())]
    t0 = time.perf_counter()
    job._to("cpu")
    suspend = time.perf_counter() - t0
    rows.append(("suspended", torch.cuda.memory_reserved() / 2**20, smi_used_mb()))
    t0 = time.perf_counter()
    job._to(torch.device("cuda", 0))
    torch.cuda.synchronize()
    resume = time.perf_counter() - t0
    rows.append(("resumed", torch.cuda.memory_reserved() / 2**20, smi_used_mb()))
    for name, reserved, used in rows:
        print(f"{name:>10}: allocator reserved {reserved:8.0f} MB, "
              f"nvidia-smi used {used:8.0f} MB")
    print(f"state {mb:g} MB: suspend {suspend * 1e3:.0f} ms, resume {resume * 1e3:.0f} ms")
    freed_alloc, freed_smi = rows[0][1] - rows[1][1], rows[0][2] - rows[1][2]
    assert freed_alloc > 0.9 * mb * 0.9, f"the allocator kept {rows[1][1]:.0f} MB"
    assert freed_smi > 0.8 * mb * 0.9, f"nvidia-smi shows only {freed_smi:.0f} MB given back"
    assert rows[2][1] > 0.9 * rows[0][1] and model.weight.is_cuda
    assert torch.equal(model.weight.detach().cpu(), weights), "resume changed the weights"
    print("ok: suspend gave the memory back to the driver; resume restored the state")


def nccl() -> None:
    from gandiva.node.agent import Agent, Launch

    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(Path(tmp) / "agent", ["cuda:0"], checkpoint_every_s=1e9)
        try:
            agent.start("n", Launch(["torchrun", "--nproc-per-node=1", str(EXAMPLES / "ddp.py"),
                                     "--steps", "4000", "--backend", "nccl"]), (0,))
            wait(agent, "n", "started")
            for _ in range(3):
                time.sleep(0.5)
                t0 = time.perf_counter()
                agent.suspend("n")
                assert agent.jobs["n"].suspended and not agent.jobs["n"].signalled
                agent.resume("n", (0,))
                print(f"suspend+resume through the library: {time.perf_counter() - t0:.3f} s")
            agent.restart("n", (0,))
            wait(agent, "n", "started")
            wait(agent, "n", "done")
            log = (agent.job_dir("n") / "rank0.log").read_text()
            print(log[-600:])
            assert "done: 4000 steps on 1 ranks" in log and "restored from checkpoint" in log
            print("ok: a 1-rank NCCL job agreed through its gloo group, was suspended, "
                  "resumed and restarted, and finished")
        finally:
            agent.close()


def wait(agent, job: str, kind: str, timeout: float = 300.0) -> list:
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        try:
            ev = agent.events.get(timeout=0.2)
        except Exception:
            continue
        seen.append(ev.kind)
        if ev.job_id == job and ev.kind == "failed":
            raise AssertionError(ev.data["reason"])
        if ev.job_id == job and ev.kind == kind:
            return seen
    raise AssertionError(f"no {kind} from {job} in {timeout} s")


def frameworks() -> None:
    from gandiva import actions as A
    from gandiva.backends.driver import Driver
    from gandiva.node.agent import Launch
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    with tempfile.TemporaryDirectory() as tmp:
        backend = Driver(make_policy("gandiva:quantum=5:-pack"), Path(tmp), slots=None,
                               checkpoint_every_s=30.0, feedback_steps=10)
        jobs = {f"lightning{i}": ["{python}", str(EXAMPLES / "lightning_mlp.py"), "--epochs",
                                  "4", "--batches", "400", "--width", "2048", "--seed", str(i)]
                for i in range(2)}
        jobs |= {f"hf{i}": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "1500",
                            "--seed", str(i)] for i in range(2)}
        for jid, command in jobs.items():
            backend.submit(JobSpec(jid, 0.0, 1, jid.rstrip("01")), Launch(command))
        result = backend.run(timeout=400)
        for j in result.jobs:
            acts = [type(a).__name__ for _, a, _ in result.actions if a.job_id == j.spec.id]
            print(f"{j.spec.id:>11}: {j.status}, {acts.count('Suspend')} suspends, "
                  f"{acts.count('Resume')} resumes, ran {j.finish - j.start:.0f} s")
        assert [j.status for j in result.jobs] == ["done"] * len(jobs)
        assert any(isinstance(a, A.Suspend) for _, a, _ in result.actions)
        print("ok: Lightning and HF jobs time-sliced on one GPU, each finished")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=("memory", "nccl", "frameworks"))
    ap.add_argument("--mb", type=float, default=1000)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no GPU visible")
    {"memory": lambda: memory(args.mb), "nccl": nccl, "frameworks": frameworks}[args.check]()


if __name__ == "__main__":
    main()
