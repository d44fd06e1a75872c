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

``--limit S``: the check's own limit (gpu_check.sh's); every wait inside it ends at least 10 s
before, so that a timeout names the step that waited. ``--dry-run`` (gpu_check.sh
--dry-run, in CI): the same check end to end on CPU slots standing in for one GPU of
``DRY_GB``, NVML answered by a fake that lists no process (unknown, as in a container), the
jobs smaller; its criterion is evaluated as on a GPU. ``CUDA_ONLY`` checks cannot run so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOBS = Path(__file__).resolve().parent / "jobs"
PROBE = Path(__file__).resolve().parents[1] / "tests" / "jobs" / "probe.py"
DRY = False  # set by --dry-run
DRY_GB = 2.0
DRY_UUID = "GPU-00000000-0000-0000-0000-000000000d01"
CUDA_ONLY = {"memory": "what the driver counts as freed", "nccl": "NCCL"}
DEADLINE = float("inf")  # --limit's end, less 10 s: no wait inside a check goes past it


def within(timeout: float) -> float:
    """``timeout``, or less: what is left before DEADLINE (at least a second)."""
    return max(1.0, min(timeout, DEADLINE - time.monotonic()))


class FakeNVML:
    """NVML for --dry-run: one GPU, named DRY_UUID, that lists no process (what every
    reading of a process's memory then is: unknown)."""

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return DRY_UUID

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return []


def device_uuid() -> str:
    """The UUID of the GPU this process calls cuda:0 (which need not be nvidia-smi's 0)."""
    if DRY:
        return DRY_UUID
    import torch

    return f"GPU-{torch.cuda.get_device_properties(0).uuid}"


def smi_used_mb() -> float:
    """The used memory of this process's cuda:0 as nvidia-smi sees it (the driver's view,
    not the allocator's), asked by UUID."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                          "nounits", "-i", device_uuid()], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.split()[0])


def memory(mb: float) -> None:
    import torch

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
    torch.cuda.empty_cache()  # (foreach Adam's temporaries: not the state's; the matmul's
    # cuBLAS workspace stays reserved: a suspend must clear it before it empties the cache)
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
    assert rows[1][1] < 16, (f"the allocator kept {rows[1][1]:.0f} MB reserved while suspended "
                             "(cuBLAS' workspaces cleared after the cache was emptied?)")
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
    """An agent on GPU 0, jobs allowed what the driver allows them (see node.devices); in
    a dry run, a CPU slot standing in for a GPU of DRY_GB."""
    from gandiva.backends.driver import detect_devices
    from gandiva.node.agent import Agent

    if DRY:
        return Agent(Path(tmp) / "agent", ["cuda:0"], checkpoint_every_s=1e9, cpu_backed=True,
                     memory_gb=DRY_GB, **kw)
    _, _, usable = detect_devices(1)
    return Agent(Path(tmp) / "agent", ["cuda:0"], checkpoint_every_s=1e9, memory_gb=usable,
                 **kw)


def until(condition, timeout: float, what: str):
    """``condition()``'s first true value, asked every 0.1 s, within ``timeout`` (and the
    check's own limit)."""
    limit = within(timeout)
    deadline = time.monotonic() + limit
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not in {limit:.0f} s"
        time.sleep(0.1)
    return value


def next_event(agent, job: str, kind: str, timeout: float = 120.0):
    timeout = within(timeout)
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


def held_jobs() -> dict[str, list[str]]:
    if DRY:  # (small: their imports are the most of it)
        return {"lightning": ["{python}", str(EXAMPLES / "lightning_mlp.py"), "--epochs", "50"],
                "hf (AdamW)": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "100000",
                               "--examples", "64", "--batch", "4"],
                "ddp, 1 rank, gloo": ["torchrun", "--nproc-per-node=1", str(EXAMPLES / "ddp.py"),
                                      "--steps", "100000"],
                "GradScaler, AdamW": ["{python}", str(JOBS / "amp_job.py"), "--steps", "100000"]}
    return {
        "lightning": ["{python}", str(EXAMPLES / "lightning_mlp.py"), "--epochs", "50",
                      "--width", "2048"],
        "hf (fused AdamW)": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "100000"],
        "ddp, 1 rank, nccl": ["torchrun", "--nproc-per-node=1", str(EXAMPLES / "ddp.py"),
                              "--steps", "100000", "--backend", "nccl"],
        "GradScaler, fused AdamW": ["{python}", str(JOBS / "amp_job.py"), "--steps", "100000"],
    }


def held() -> None:
    """Each kind of job, suspended through the library: what its process still holds (NVML),
    against what it held running. Passes if every job was suspended by the library (not
    stopped by signal) and each holds a known amount within the agent's budget for what
    suspended jobs keep of a GPU (unknown: NVML lists none of this PID namespace's)."""
    from gandiva.node.agent import Launch

    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp)
        budget = agent.held_budget_gb
        try:
            for i, (name, command) in enumerate(held_jobs().items()):
                jid = f"j{i}"
                agent.start(jid, Launch(command), (0,))
                next_event(agent, jid, "started", 180)
                time.sleep(0.2 if DRY else 3)
                running = agent.jobs[jid].memory_gb
                agent.suspend(jid)
                ev = next_event(agent, jid, "suspended")
                held = ev.data["held_gb"]
                print(f"{name:>24}: running {running or 0:6.2f} GB, suspended holds "
                      f"{'unknown (NVML lists no process here)' if held is None else held} "
                      f"GB (stopped instead: {ev.data['stopped']})")
                if ev.data["stopped"] or held is None or held > budget:
                    failures.append(f"{name}: held {held} GB, stopped {ev.data['stopped']}")
                agent.resume(jid, (0,))
                time.sleep(0.5)
                agent.kill(jid)
        finally:
            agent.close()
    assert not failures, f"over the budget of {budget:.2f} GB, or unknown: {failures}"
    print(f"ok: every job suspended through the library, each holding at most the budget of "
          f"{budget:.2f} GB")


def run_alone(tmp: Path, name: str, command: list[str]) -> Path:
    """The final checkpoint file of ``command`` run alone, uninterrupted."""
    from gandiva.job import checkpoint

    directory = tmp / "alone" / name
    # on the GPU the interrupted run used (without GANDIVA_DEVICE the library trains on the
    # CPU, and no run compares bit for bit)
    env = {**os.environ, "GANDIVA_CHECKPOINT_DIR": str(directory),
           "GANDIVA_CHECKPOINT_EVERY_S": "1e9", "GANDIVA_DEVICE": "cpu" if DRY else "cuda:0"}
    for k in ("GANDIVA_CONTROL_FD", "GANDIVA_JOB_ID"):
        env.pop(k, None)
    subprocess.run([sys.executable if c == "{python}" else c for c in command], env=env,
                   check=True, capture_output=True, timeout=within(300))
    return checkpoint.newest_whole(directory)[1]


def same(a, b, where: str = "") -> None:
    """Bit-identical, tensor by tensor, value by value (tensors compared on the CPU)."""
    import torch

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


def exact_jobs() -> dict[str, list[str]]:
    if DRY:  # (small; no torch.compile: its C++ build on CPU alone takes a minute)
        return {"job library, GradScaler": ["{python}", str(JOBS / "amp_job.py"), "--steps",
                                            "300"],
                "lightning.pytorch": ["{python}", str(EXAMPLES / "lightning_shuffled.py"),
                                      "--epochs", "2", "--samples", "256"],
                "hf (AdamW)": ["{python}", str(EXAMPLES / "hf_bert.py"), "--max-steps", "24",
                               "--examples", "64", "--batch", "4"]}
    return {
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

    import torch

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
            for i, (name, command) in enumerate(exact_jobs().items()):
                jid = f"x{i}"
                agent.start(jid, Launch(command), (0,))
                next_event(agent, jid, "started", 180)
                for _ in range(2):
                    time.sleep(0.2 if DRY else 0.5)
                    agent.suspend(jid)
                    agent.resume(jid, (0,))
                time.sleep(0.2 if DRY else 0.5)
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
            "x = torch.ones(4, device='cuda' if torch.cuda.is_available() else 'cpu')"
            ".sum().item()\n"
            "json.dump({'ppid': os.getppid(), 'threads': torch.get_num_threads(),\n"
            "           'gpus': torch.cuda.device_count(), 'x': x}, open(sys.argv[1], 'w'))\n")
        try:
            until(agent.warm_ready, 120, "the zygote ready")
            pid = agent._zygote.proc.pid
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "libcuda" not in maps, "the zygote loaded libcuda before forking"
            agent.start("z", Launch([sys.executable, str(script), str(out)]), (0,))
            next_event(agent, "z", "done")
            seen = json.loads(out.read_text())
            print(f"zygote {pid}: no libcuda mapped; warm job: {seen}")
            assert seen == {"ppid": pid, "threads": 2, "gpus": 0 if DRY else 1, "x": 4.0}, seen
        finally:
            agent.close()
    print("ok: fork before CUDA; a warm job has its threads and its GPU")


def uuid() -> None:
    """An agent given its GPU by UUID passes the UUID on; the job computes on it."""
    import json

    from gandiva.node.agent import Launch

    out = device_uuid()
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
    assert start["CUDA_VISIBLE_DEVICES"] == out and start["GANDIVA_DEVICE"] == "cuda:0", start
    assert DRY or start["device"] == "cuda:0", start
    print("ok: the job got its GPU by UUID and computed on it")


def pack() -> None:
    """Two jobs packed on the GPU, each holding 30% of it: each is capped at its peak and
    half the rest; the one that grows past its cap fails alone, the other finishes."""
    import torch

    from gandiva.node.agent import Launch

    total = DRY_GB if DRY else torch.cuda.get_device_properties(0).total_memory / 2**30
    with tempfile.TemporaryDirectory() as tmp:
        agent = gpu_agent(tmp, max_restarts=0)
        try:
            agent.start("a", Launch(["{python}", str(JOBS / "hog_job.py"), "--gb",
                                     f"{0.3 * total:.1f}", "--steps", "10000000"]), (0,))
            until(lambda: agent.jobs["a"].memory_gb, 120, "a profiled (its peak known)")
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
    global DRY, DEADLINE
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=("memory", *CHECKS))
    ap.add_argument("--mb", type=float, default=1000)
    ap.add_argument("--limit", type=float, default=None, help="the check's limit, seconds")
    ap.add_argument("--dry-run", action="store_true", help="on CPU slots, NVML faked")
    args = ap.parse_args()
    DRY = args.dry_run
    if args.limit is not None:
        DEADLINE = time.monotonic() + args.limit - 10
    if DRY:
        if args.check in CUDA_ONLY:
            sys.exit(f"{args.check} needs a GPU ({CUDA_ONLY[args.check]}): no dry run")
        from gandiva.job import nvml

        nvml.use(FakeNVML())
    else:
        import torch

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
