"""The checks of benchmarks/gpu_check.sh that need a GPU and the job library, one per
subcommand; each prints what it measured and exits non-zero if the behaviour is wrong.

    python benchmarks/gpu_checks.py memory --mb 1000   # suspend frees device memory; resume
    python benchmarks/gpu_checks.py nccl               # a 1-rank NCCL job through the agreement
    python benchmarks/gpu_checks.py frameworks         # Lightning and HF jobs time-sliced
    python benchmarks/gpu_checks.py held               # what a suspended job's process keeps
    python benchmarks/gpu_checks.py exact              # interrupted == alone, bit for bit
    python benchmarks/gpu_checks.py zygote             # no CUDA before the fork; threads
    python benchmarks/gpu_checks.py uuid               # an agent under CUDA_VISIBLE_DEVICES=UUID
    python benchmarks/gpu_checks.py pack               # a memory-tight packed pair, capped
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
JOBS = Path(__file__).resolve().parent / "jobs"
PROBE = Path(__file__).resolve().parents[1] / "tests" / "jobs" / "probe.py"


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
    torch.cuda.empty_cache()  # (foreach Adam's temporaries: not the state's)
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
            next_event(agent, "n", "started", 300)
            for _ in range(3):
                time.sleep(0.5)
                t0 = time.perf_counter()
                agent.suspend("n")
                assert agent.jobs["n"].suspended and not agent.jobs["n"].signalled
                agent.resume("n", (0,))
                print(f"suspend+resume through the library: {time.perf_counter() - t0:.3f} s")
            agent.restart("n", (0,))
            next_event(agent, "n", "started", 300)
            next_event(agent, "n", "done", 300)
            log = (agent.job_dir("n") / "rank0.log").read_text()
            print(log[-600:])
            assert "done: 4000 steps on 1 ranks" in log and "restored from checkpoint" in log
            print("ok: a 1-rank NCCL job agreed through its gloo group, was suspended, "
                  "resumed and restarted, and finished")
        finally:
            agent.close()


def frameworks() -> None:
    from gandiva import actions as A
    from gandiva.backends.driver import Driver
    from gandiva.node.agent import Launch
    from gandiva.policies import make_policy
    from gandiva.spec import JobSpec

    with tempfile.TemporaryDirectory() as tmp:
        backend = Driver(make_policy("gandiva:quantum=5:-packing"), Path(tmp), slots=None,
                               checkpoint_every_s=30.0, feedback_steps=10)
        jobs = {f"lightning{i}": ["{python}", str(EXAMPLES / "lightning_mlp.py"), "--epochs",
                                  "2", "--batches", "300", "--width", "2048", "--seed", str(i)]
                for i in range(2)}
        jobs |= {f"hf{i}": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "600",
                            "--seed", str(i)] for i in range(2)}
        for jid, command in jobs.items():
            backend.submit(JobSpec(jid, 0.0, 1, jid.rstrip("01")), Launch(command))
        result = backend.run(timeout=55)
        for j in result.jobs:
            acts = [type(a).__name__ for _, a, _ in result.actions if a.job_id == j.spec.id]
            print(f"{j.spec.id:>11}: {j.status}, {acts.count('Suspend')} suspends, "
                  f"{acts.count('Resume')} resumes, ran {j.finish - j.start:.0f} s")
        assert [j.status for j in result.jobs] == ["done"] * len(jobs)
        assert any(isinstance(a, A.Suspend) for _, a, _ in result.actions)
        print("ok: Lightning and HF jobs time-sliced on one GPU, each finished")


def gpu_agent(tmp: str, **kw):
    """An agent on GPU 0, jobs allowed what the driver allows them (see node.devices)."""
    from gandiva.backends.driver import detect_devices
    from gandiva.node.agent import Agent

    _, _, usable = detect_devices(1)
    return Agent(Path(tmp) / "agent", ["cuda:0"], checkpoint_every_s=1e9, memory_gb=usable,
                 **kw)


def next_event(agent, job: str, kind: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ev = agent.events.get(timeout=0.2)
        except Exception:
            continue
        if ev.job_id == job and ev.kind == "failed" and kind != "failed":
            raise AssertionError(ev.data["reason"])
        if ev.job_id == job and ev.kind == kind:
            return ev
    raise AssertionError(f"no {kind} from {job} in {timeout} s")


HELD_JOBS = {
    "lightning": ["{python}", str(EXAMPLES / "lightning_mlp.py"), "--epochs", "50",
                  "--width", "2048"],
    "hf (fused AdamW)": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "100000"],
    "ddp, 1 rank, nccl": ["torchrun", "--nproc-per-node=1", str(EXAMPLES / "ddp.py"),
                          "--steps", "100000", "--backend", "nccl"],
    "GradScaler, fused AdamW": ["{python}", str(JOBS / "amp_job.py"), "--steps", "100000"],
}


def held() -> None:
    """Each kind of job, suspended through the library: what its process still holds (NVML),
    against what it held running."""
    from gandiva.node.agent import Launch

    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp)
        try:
            for i, (name, command) in enumerate(HELD_JOBS.items()):
                jid = f"j{i}"
                agent.start(jid, Launch(command), (0,))
                next_event(agent, jid, "started", 180)
                time.sleep(3)
                running = agent.jobs[jid].memory_gb
                agent.suspend(jid)
                ev = next_event(agent, jid, "suspended")
                held = ev.data["held_gb"]
                print(f"{name:>24}: running {running or 0:6.2f} GB, suspended holds "
                      f"{'unknown (NVML lists no process here)' if held is None else held} "
                      f"GB (stopped instead: {ev.data['stopped']})")
                agent.resume(jid, (0,))
                time.sleep(1)
                agent.kill(jid)
        finally:
            agent.close()
    print("ok: every job suspended through the library; what each still holds, as above")


def run_alone(tmp: Path, name: str, command: list[str]) -> Path:
    """The final checkpoint file of ``command`` run alone, uninterrupted."""
    import os

    from gandiva.job import checkpoint

    directory = tmp / "alone" / name
    # on the GPU the interrupted run used (without GANDIVA_DEVICE the library trains on the
    # CPU, and no run compares bit for bit)
    env = {**os.environ, "GANDIVA_CHECKPOINT_DIR": str(directory),
           "GANDIVA_CHECKPOINT_EVERY_S": "1e9", "GANDIVA_DEVICE": "cuda:0"}
    for k in ("GANDIVA_CONTROL_FD", "GANDIVA_JOB_ID"):
        env.pop(k, None)
    subprocess.run([sys.executable if c == "{python}" else c for c in command], env=env,
                   check=True, capture_output=True, timeout=300)
    return checkpoint.newest_whole(directory)[1]


def same(a, b, where: str = "") -> None:
    """Bit-identical, tensor by tensor, value by value (tensors compared on the CPU)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a.cpu(), b.cpu()), f"{where} differs"
    elif isinstance(a, float | int | str | bool | type(None)):
        assert a == b, f"{where}: {a!r} != {b!r}"


EXACT_JOBS = {
    "job library, amp + compile": ["{python}", str(JOBS / "amp_job.py"), "--steps", "3000",
                                   "--compile"],
    "job library, amp": ["{python}", str(JOBS / "amp_job.py"), "--steps", "5000"],
    "lightning.pytorch": ["{python}", str(EXAMPLES / "lightning_shuffled.py"), "--epochs",
                          "2", "--samples", "4096"],
    "pytorch_lightning": ["{python}", str(EXAMPLES / "pl_shuffled.py"), "--epochs", "2",
                          "--samples", "4096"],
    "hf (fused AdamW)": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "300"],
}
LIGHTNING = ("state_dict", "optimizer_states", "lr_schedulers", "global_step")


def training(name: str, file: Path) -> dict:
    """What training produced, from a checkpoint file of the job ``name``."""
    import io
    import json

    if name.startswith("hf"):
        from safetensors.torch import load as load_safetensors

        from gandiva.job.integrations import hf

        return {"weights": load_safetensors(hf.read(file, "model.safetensors")),
                "optimizer": torch.load(io.BytesIO(hf.read(file, "optimizer.pt")),
                                        weights_only=False),
                "step": json.loads(hf.read(file, "trainer_state.json"))["global_step"]}
    state = torch.load(file, map_location="cpu", weights_only=False)
    if "lightning" in name:
        return {k: state[k] for k in LIGHTNING}
    return {"objects": state["objects"], "step": state["step"]}


def exact() -> None:
    """Each job suspended and resumed twice and restarted once on the GPU ends bit-identical
    to the same job run alone."""
    from gandiva.job import checkpoint
    from gandiva.node.agent import Launch

    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp)
        failures = []
        try:
            for i, (name, command) in enumerate(EXACT_JOBS.items()):
                jid = f"x{i}"
                agent.start(jid, Launch(command), (0,))
                next_event(agent, jid, "started", 180)
                for _ in range(2):
                    time.sleep(0.5)
                    agent.suspend(jid)
                    agent.resume(jid, (0,))
                time.sleep(0.5)
                agent.restart(jid, (0,))
                next_event(agent, jid, "done", 300)
                mine = training(name, checkpoint.newest_whole(agent.checkpoint_dir(jid))[1])
                alone = training(name, run_alone(Path(tmp), jid, command))
                try:
                    same(mine, alone, name)
                    print(f"{name:>28}: bit-identical to its run alone")
                except AssertionError as err:
                    failures.append(str(err))
                    print(f"{name:>28}: DIFFERS: {err}")
        finally:
            agent.close()
    assert not failures, failures
    print("ok: interrupted runs end as their runs alone")


def zygote() -> None:
    """The zygote has no CUDA in it before it forks; a warm job has the agent's thread count
    and a working GPU."""
    import json

    from gandiva.node.agent import Launch

    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp, threads=2)
        script = Path(tmp) / "seen.py"
        out = Path(tmp) / "seen.json"
        script.write_text(
            "import json, os, sys, torch\n"
            "x = torch.ones(4, device='cuda').sum().item()\n"
            "json.dump({'ppid': os.getppid(), 'threads': torch.get_num_threads(),\n"
            "           'gpus': torch.cuda.device_count(), 'x': x}, open(sys.argv[1], 'w'))\n")
        try:
            deadline = time.monotonic() + 120
            while not agent.warm_ready():
                assert time.monotonic() < deadline, "the zygote never got ready"
                time.sleep(0.1)
            pid = agent._zygote.proc.pid
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "libcuda" not in maps, "the zygote loaded libcuda before forking"
            agent.start("z", Launch([sys.executable, str(script), str(out)]), (0,))
            next_event(agent, "z", "done")
            seen = json.loads(out.read_text())
            print(f"zygote {pid}: no libcuda mapped; warm job: {seen}")
            assert seen == {"ppid": pid, "threads": 2, "gpus": 1, "x": 4.0}, seen
        finally:
            agent.close()
    print("ok: fork before CUDA; a warm job has its threads and its GPU")


def uuid() -> None:
    """An agent given its GPU by UUID passes the UUID on; the job computes on it."""
    import json
    import os

    from gandiva.node.agent import Launch

    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i",
                          "0"], capture_output=True, text=True, check=True).stdout.strip()
    os.environ["CUDA_VISIBLE_DEVICES"] = out
    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp)
        seen = Path(tmp) / "probe.jsonl"
        try:
            agent.start("u", Launch(["{python}", str(PROBE), str(seen), "50"]), (0,))
            next_event(agent, "u", "done")
        finally:
            agent.close()
        start = json.loads(seen.read_text().splitlines()[0])
    print(f"agent under CUDA_VISIBLE_DEVICES={out}: the job saw {start}")
    assert start["CUDA_VISIBLE_DEVICES"] == out and start["device"] == "cuda:0", start


def pack() -> None:
    """Two jobs packed on the GPU, each holding 30% of it: each is capped at its peak and
    half the rest; the one that grows past its cap fails alone, the other finishes."""
    from gandiva.node.agent import Launch

    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp, max_restarts=0)
        try:
            agent.start("a", Launch(["{python}", str(JOBS / "hog_job.py"), "--gb",
                                     f"{0.3 * total:.1f}", "--steps", "10000000"]), (0,))
            deadline = time.monotonic() + 120
            while not agent.jobs["a"].memory_gb:  # profiled: its peak known
                assert time.monotonic() < deadline, "a was never profiled"
                time.sleep(0.1)
            agent.start("b", Launch(["{python}", str(JOBS / "hog_job.py"), "--gb",
                                     f"{0.3 * total:.1f}", "--grow-at", "500", "--grow-gb",
                                     f"{0.3 * total:.1f}", "--steps", "4000"]), (0,))
            ev = next_event(agent, "b", "failed", 240)
            print(f"b failed: {ev.data['reason'][-300:]}")
            a = agent.jobs["a"]
            time.sleep(2)
            assert all(r.exit is None for r in a.ranks), "a did not run on"
            print(f"a runs on, its cap now {[r.cap_gb for r in a.ranks]} of {total:.0f} GB")
            agent.kill("a")
            assert "OutOfMemoryError" in ev.data["reason"] or "out of memory" in ev.data[
                "reason"], ev.data["reason"]
        finally:
            agent.close()
    print("ok: a packed job that grew past its cap failed alone; its partner ran on")


CHECKS = {"nccl": nccl, "frameworks": frameworks, "held": held, "exact": exact,
          "zygote": zygote, "uuid": uuid, "pack": pack}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=("memory", *CHECKS))
    ap.add_argument("--mb", type=float, default=1000)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no GPU visible")
    import signal

    # a timeout's SIGTERM unwinds through the checks' finally blocks, whose agents then stop
    # their jobs: none is left running into the next check
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if args.check == "memory":
        memory(args.mb)
    else:
        CHECKS[args.check]()


if __name__ == "__main__":
    main()
