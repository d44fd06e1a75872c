"""GPU semantics without a GPU: an agent whose GPUs are CPU slots underneath (``cpu_backed``),
named as a real node names them (indices through the agent's own CUDA_VISIBLE_DEVICES,
UUIDs, MIG ids). What each job process saw is asserted from inside it (tests/jobs/probe.py
writes it down): its CUDA_VISIBLE_DEVICES, its torchrun variables, its device; and whether a
move to other GPUs was a restart (a new process, restored at the step it stopped at)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_runtime import started, wait_for  # noqa: E402
from waiting import trains, until  # noqa: E402

from gandiva.job import nvml, wire  # noqa: E402
from gandiva.node import devices  # noqa: E402
from gandiva.node.agent import Agent, Launch  # noqa: E402

PROBE = Path(__file__).resolve().parent / "jobs" / "probe.py"
UUIDS = ["GPU-0b5c1e9e-aaaa", "GPU-7f31d2c4-bbbb", "GPU-2a9e0c11-cccc"]  # (MIG: see below)


def probe(out: Path, steps: int, *extra: str) -> Launch:
    return Launch(["{python}", str(PROBE), str(out), str(steps), *extra])


def records(out: Path, event: str | None = None) -> list[dict]:
    if not out.exists():
        return []
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return [r for r in lines if event is None or r["event"] == event]


@pytest.fixture
def gpu_agent(zygote, tmp_path, monkeypatch):
    """Three GPUs as a node under Slurm sees them: the agent was given 4,5,7 of the machine."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,7")
    a = Agent(tmp_path / "agent", ["cuda:0", "cuda:1", "cuda:2"], checkpoint_every_s=1e9,
              cpu_backed=True, memory_gb=10.0, zygote=zygote)
    yield a
    a.close()


# ---- naming and visibility -------------------------------------------------------------------

def test_gpu_names_go_through_the_agents_own_visible_list_in_every_form():
    assert devices.gpu_ids(["cuda:0", "cuda:1"], "4,5") == ["4", "5"]
    assert devices.gpu_ids(["cuda:1"], f"{UUIDS[0]},{UUIDS[2]}") == [UUIDS[2]]
    assert devices.gpu_ids(["cuda:0", "cuda:1"], None) == ["0", "1"]
    assert devices.gpu_ids([f"cuda:{UUIDS[1]}"], "4,5") == [UUIDS[1]]  # named outright
    with pytest.raises(ValueError, match="makes only 2 GPU"):
        devices.gpu_ids(["cuda:2"], "4,5")
    with pytest.raises(ValueError, match="makes only 1 GPU"):
        devices.gpu_ids(["cuda:1"], "4,-1,5")  # CUDA stops at the first bad entry
    with pytest.raises(ValueError, match="twice"):
        devices.gpu_ids(["cuda:0", f"cuda:{UUIDS[0]}"], UUIDS[0])


def test_a_one_gpu_job_sees_its_gpu_alone_as_cuda_0_with_no_torchrun_variables(
        gpu_agent, tmp_path):
    out = tmp_path / "one.jsonl"
    gpu_agent.start("one", probe(out, 20), (2,))
    wait_for(gpu_agent, "done", "one")
    [start] = records(out, "start")
    assert start["CUDA_VISIBLE_DEVICES"] == "7"  # the machine's GPU 7, not its GPU 2
    assert start["GANDIVA_DEVICE"] == "cuda:0"
    # run as `python script.py` is: HF's Trainer would make it a one-rank DDP job otherwise
    assert start["LOCAL_RANK"] is start["RANK"] is start["TORCHELASTIC_RUN_ID"] is None


def test_a_gangs_ranks_see_the_jobs_gpus_in_local_rank_order_as_torchrun_would(
        zygote, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(UUIDS))
    agent = Agent(tmp_path / "agent", ["cuda:0", "cuda:1", "cuda:2"], checkpoint_every_s=1e9,
                  cpu_backed=True, zygote=zygote)
    try:
        out = tmp_path / "gang.jsonl"
        agent.start("g", probe(out, 20), (2, 0))
        wait_for(agent, "done", "g")
        starts = sorted(records(out, "start"), key=lambda r: r["rank"])
        assert [s["CUDA_VISIBLE_DEVICES"] for s in starts] == [f"{UUIDS[2]},{UUIDS[0]}"] * 2
        assert [(s["LOCAL_RANK"], s["GANDIVA_DEVICE"]) for s in starts] == [
            ("0", "cuda:0"), ("1", "cuda:1")]
        assert {s["WORLD_SIZE"] for s in starts} == {"2"}
    finally:
        agent.close()


# ---- moves -----------------------------------------------------------------------------------

def test_a_resume_on_other_gpus_is_a_restart_at_the_step_it_stopped_at(gpu_agent, tmp_path):
    out = tmp_path / "m.jsonl"
    gpu_agent.start("m", probe(out, 400), (0,))
    started(gpu_agent, "m")
    trains(gpu_agent, "m")
    gpu_agent.suspend("m")
    assert gpu_agent.jobs["m"].suspended and not gpu_agent.jobs["m"].signalled
    gpu_agent.resume("m", (0,))  # the same GPU: in place, the same process
    trains(gpu_agent, "m")
    gpu_agent.suspend("m")
    stopped_at = gpu_agent.jobs["m"].replies["suspended:0"].step
    gpu_agent.resume("m", (1,))  # another GPU: a restart, from the step it stopped at
    assert started(gpu_agent, "m").restored == stopped_at
    wait_for(gpu_agent, "done", "m")
    first, second = records(out, "start")
    assert first["pid"] != second["pid"]
    assert (first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]) == ("4", "5")
    assert second["step"] == stopped_at
    assert [r["step"] for r in records(out, "end")] == [400]


def test_a_job_that_reads_its_device_every_step_moves_in_place_once_it_sees_the_gpu(
        gpu_agent, tmp_path):
    out = tmp_path / "ip.jsonl"
    gpu_agent.start("ip", probe(out, 600, "in-place"), (0,))
    started(gpu_agent, "ip")
    # its first process sees only its own GPU: the first move is a restart, after which it
    # sees the node's others after its own, and moves among them in place
    gpu_agent.suspend("ip")
    gpu_agent.resume("ip", (1,))
    started(gpu_agent, "ip")
    for target in ((2,), (0,)):
        trains(gpu_agent, "ip")
        gpu_agent.suspend("ip")
        assert not gpu_agent.jobs["ip"].signalled
        gpu_agent.resume("ip", target)
    wait_for(gpu_agent, "done", "ip")
    starts = records(out, "start")
    assert len(starts) == 2, starts
    assert starts[1]["CUDA_VISIBLE_DEVICES"] == "5,4,7"
    assert [r["step"] for r in records(out, "end")] == [600]


def test_a_job_stopped_by_signal_moves_by_restart_and_is_never_left_on_its_old_gpu(
        gpu_agent, tmp_path):
    out, script = tmp_path / "plain.txt", tmp_path / "plain.py"
    script.write_text("import os, sys, time\n"
                      "with open(sys.argv[1], 'a') as f:\n"
                      "    f.write(f\"{os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}\\n\")\n"
                      "time.sleep(3)\n")
    gpu_agent.start("s", Launch(["{python}", str(script), str(out)]), (0,))
    until(lambda: out.exists() and out.read_text())
    gpu_agent.suspend("s")
    assert gpu_agent.jobs["s"].signalled  # it never spoke the library's protocol
    gpu_agent.resume("s", (2,))
    wait_for(gpu_agent, "done", "s")
    lines = [line.split() for line in out.read_text().splitlines()]
    assert [cvd for _, cvd in lines] == ["4", "7"]
    assert lines[0][0] != lines[1][0]


def test_gpus_named_by_index_are_handed_on_by_uuid_where_nvml_names_them(
        zygote, tmp_path, monkeypatch):
    """An index means a GPU only under a CUDA_DEVICE_ORDER, which a job may set anew; the
    agent names each GPU by its UUID once, as it starts, where NVML can say."""
    class Driver:  # NVML's numbering (PCI bus order) of a machine's GPUs, and their UUIDs
        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetUUID(self, handle):
            return f"GPU-0000000{handle}-uuid".encode()

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,7")
    try:
        nvml.use(Driver())
        agent = Agent(tmp_path / "agent", ["cuda:0", "cuda:2"], cpu_backed=True,
                      zygote=zygote)
        agent.close()
        assert agent.gpu_ids == ["GPU-00000004-uuid", "GPU-00000007-uuid"]
        assert devices.by_uuid(["4", f"{UUIDS[0]}"]) == ["GPU-00000004-uuid", UUIDS[0]]
    finally:
        nvml.use(None)
    assert devices.by_uuid(["4", "5"]) == ["4", "5"]  # no NVML here: indices they stay


def test_on_mig_a_process_sees_its_own_instance_and_a_gang_over_instances_is_refused(
        zygote, tmp_path, monkeypatch):
    """CUDA shows a process only the first MIG instance it is given: a job's process is
    given its own (``cuda:0``), sees no other even when it moves in place, and a gang over
    MIG instances (NCCL joins none of them) fails at once, saying so."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    migs = ["MIG-5c1e9e0b-aaaa", "MIG-5c1e9e0b-bbbb"]
    agent = Agent(tmp_path / "agent", [f"cuda:{m}" for m in migs], checkpoint_every_s=1e9,
                  cpu_backed=True, zygote=zygote)
    script = tmp_path / "sees.py"
    script.write_text("import os\n"
                      "print('SEES', os.environ['CUDA_VISIBLE_DEVICES'], "
                      "os.environ['GANDIVA_DEVICE'], flush=True)\n")
    try:
        agent.in_place.add("one")  # (as if it had said it moves in place)
        agent.start("one", Launch(["{python}", str(script)]), (1,))
        wait_for(agent, "done", "one")
        assert "SEES MIG-5c1e9e0b-bbbb cuda:0" in agent.read_log("one").decode()
        agent.start("gang", Launch(["{python}", str(script)]), (0, 1))
        ev = wait_for(agent, "failed", "gang")
        assert "MIG instances" in ev.data["reason"] and "NCCL" in ev.data["reason"]
    finally:
        agent.close()


# ---- memory ----------------------------------------------------------------------------------

def test_packed_jobs_divide_the_gpu_by_their_peaks_and_a_job_left_alone_is_uncapped(
        gpu_agent, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    gpu_agent.start("a", probe(a, 100_000), (1,))
    until(lambda: gpu_agent.jobs["a"].memory_gb)  # profiled: its peak is known
    gpu_agent.start("b", probe(b, 300), (1,))  # packed on a's GPU

    def caps():  # the latest each job applied, once they add up to the GPU
        ca, cb = records(a, "cap"), records(b, "cap")
        both = ca and cb and (ca[-1]["cap"], cb[-1]["cap"])
        return both if both and abs(sum(both) - 10.0) < 1e-9 else None

    cap_a, cap_b = until(caps)
    assert cap_a >= gpu_agent.jobs["a"].memory_gb and cap_b > 0
    wait_for(gpu_agent, "done", "b")
    until(lambda: records(a, "cap")[-1]["cap"] is None)  # alone again: the whole GPU
    gpu_agent.kill("a")


def test_a_job_packed_beside_another_starts_capped_before_its_first_allocation(
        gpu_agent, tmp_path):
    """Its first mini-batch is often its peak (cuDNN benchmarking, autotuning): the cap is in
    its start environment, applied as the job library starts, not at its first boundary."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    gpu_agent.start("a", probe(a, 100_000), (1,))
    until(lambda: gpu_agent.jobs["a"].memory_gb, what="a's peak")
    gpu_agent.start("b", probe(b, 300), (1,))  # packed on a's GPU
    start = until(lambda: records(b, "start"), what="b's start")[0]
    assert start["cap"] is not None and start["step"] == 0
    cap_a = until(lambda: records(a, "cap"), what="a's cap")[-1]["cap"]
    assert start["cap"] == pytest.approx(10.0 - cap_a)  # the rest of the GPU
    for jid in "ab":
        gpu_agent.kill(jid)


def test_a_packed_job_that_outgrows_its_cap_says_so_and_is_restarted_uncounted(
        gpu_agent, tmp_path):
    """Past its cap a packed job gets torch.OutOfMemoryError in its own process: the agent
    tells the scheduler (``out-of-memory``, which should take it off the GPU) and starts it
    again from its checkpoint without counting a crash (3 of those fail a job)."""
    a = tmp_path / "a.jsonl"
    gpu_agent.start("a", probe(a, 100_000), (1,))
    until(lambda: gpu_agent.jobs["a"].memory_gb, what="a's peak")
    script, marker = tmp_path / "grows.py", tmp_path / "grew"
    script.write_text("import os, sys, time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(20):\n"
                      "    if job.memory_cap_gb is not None and not os.path.exists(sys.argv[1]):\n"
                      "        open(sys.argv[1], 'w').close()  # (once)\n"
                      "        raise torch.OutOfMemoryError('CUDA out of memory (stand-in)')\n"
                      "    time.sleep(0.01)\n")
    gpu_agent.start("b", Launch(["{python}", str(script), str(marker)]), (1,))  # packed
    seen: list = []
    wait_for(gpu_agent, "done", "b", timeout=90, seen=seen)
    ends = [e for e in seen if e.job_id == "b" and e.kind not in ("profile", "started")]
    assert [e.kind for e in ends] == ["out-of-memory", "done"], seen
    assert "its memory cap" in ends[0].data["reason"]
    assert "b" not in gpu_agent.jobs and marker.exists()
    gpu_agent.kill("a")


def test_a_packed_job_out_of_memory_again_and_again_is_restarted_a_bounded_number_of_times(
        zygote, tmp_path):
    """Uncounted restarts for running out of a cap are bounded too (``max_restarts``); past
    them an out-of-memory exit is a crash like any other, and the job ends failed."""
    agent = Agent(tmp_path / "agent", ["cuda:0"], checkpoint_every_s=1e9, cpu_backed=True,
                  memory_gb=10.0, max_restarts=1, zygote=zygote)
    script = tmp_path / "hog.py"
    script.write_text("import time, torch\n"
                      "import gandiva.job as gj\n"
                      "job = gj.init()\n"
                      "job.register(model=torch.nn.Linear(2, 2))\n"
                      "for step in job.steps(100_000):\n"
                      "    if job.memory_cap_gb is not None:\n"
                      "        raise torch.OutOfMemoryError('CUDA out of memory (stand-in)')\n"
                      "    time.sleep(0.01)\n")
    try:
        agent.start("a", probe(tmp_path / "a.jsonl", 100_000), (0,))
        until(lambda: agent.jobs["a"].memory_gb, what="a's peak")
        agent.start("b", Launch(["{python}", str(script)]), (0,))  # capped from its start
        seen: list = []
        with pytest.raises(AssertionError, match="after 1 restarts"):
            wait_for(agent, "done", "b", timeout=90, seen=seen)
        ends = [e.kind for e in seen if e.job_id == "b" and e.kind not in ("profile", "started")]
        assert ends == ["out-of-memory", "restarted", "failed"], seen
    finally:
        agent.close()


def test_a_packed_job_nvml_sees_over_its_cap_twice_in_a_row_is_said_out_of_memory_once(
        gpu_agent, tmp_path, monkeypatch):
    """The cap binds the caching allocator only: memory outside it (NCCL's buffers, a second
    context) is seen in NVML's readings. One reading over cap and margin is not enough (a
    transient); two in a row are, and the scheduler is told once; unknown counts as neither."""
    from types import SimpleNamespace

    from gandiva.node import agent as agent_module

    monkeypatch.setattr(agent_module, "CAP_READ_S", 0.2)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    gpu_agent.start("a", probe(a, 100_000), (1,))
    until(lambda: gpu_agent.jobs["a"].memory_gb, what="a's peak")
    gpu_agent.start("b", probe(b, 100_000), (1,))  # packed on a's GPU
    until(lambda: all(r.cap_gb for j in "ab" for r in gpu_agent.jobs[j].ranks),
          what="both capped")
    over = {"b": [None, 2.0, None, 2.0, 0.0]}  # (GB over cap: unknown, over once, ...)

    class Driver:  # NVML's readings of the two jobs' processes
        def nvmlDeviceGetCount(self):
            return 1

        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            listed = []
            for jid in "ab":
                r = gpu_agent.jobs[jid].ranks[0]
                extra = over[jid].pop(0) if over.get(jid) else 0.0
                used = None if extra is None else int((r.cap_gb + extra) * 2**30)
                listed.append(SimpleNamespace(pid=r.proc.pid, usedGpuMemory=used))
            return listed

    events: list = []
    try:
        nvml.use(Driver())
        until(lambda: not over["b"], what="five readings")
        time.sleep(0.5)
        while not gpu_agent.events.empty():
            events.append(gpu_agent.events.get())
        assert "out-of-memory" not in [e.kind for e in events]  # never twice in a row
        over["b"] = [2.0] * 1000  # from now on, over
        ev = wait_for(gpu_agent, "out-of-memory", "b", timeout=30, seen=events)
        assert "two readings" in ev.data["reason"] and "its cap" in ev.data["reason"]
        time.sleep(1.0)  # said once, not at every reading
        while not gpu_agent.events.empty():
            events.append(gpu_agent.events.get())
        assert [e.job_id for e in events if e.kind == "out-of-memory"] == ["b"]
        assert "two readings" in gpu_agent.read_log("b").decode()
    finally:
        nvml.use(None)
    for jid in "ab":
        gpu_agent.kill(jid)


def test_a_packed_job_restarted_after_a_crash_keeps_its_peak_and_is_capped_at_once(
        gpu_agent, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    gpu_agent.start("a", probe(a, 100_000), (1,))
    peak = until(lambda: gpu_agent.jobs["a"].memory_gb, what="a's peak")
    gpu_agent.start("b", probe(b, 100_000), (1,))  # packed on a's GPU
    until(lambda: all(r.cap_gb for j in "ab" for r in gpu_agent.jobs[j].ranks),
          what="both capped")
    first = gpu_agent.jobs["a"]
    os.kill(first.ranks[0].proc.pid, signal.SIGKILL)  # a crashes: restarted at once
    again = until(lambda: (j := gpu_agent.jobs["a"]) is not first and j.ranks and j,
                  what="a restarted")
    assert again.memory_gb == peak  # its peak is still known (not "unprofiled")...
    until(lambda: again.ranks[0].cap_gb is not None, what="a capped")  # ...and it is capped
    for jid in "ab":
        gpu_agent.kill(jid)


def test_a_gpu_job_stopped_by_signal_past_the_bound_is_preempted_and_starts_again_on_resume(
        zygote, tmp_path):
    """A script without the library is suspended by SIGSTOP; on a GPU, NCCL's watchdog
    would abort its communicators had it stayed stopped past its timeout: past the bound
    (here 1 s) it is preempted instead (SIGTERM, on which it saves) and starts again when
    resumed."""
    agent = Agent(tmp_path / "agent", ["cuda:0"], checkpoint_every_s=1e9, cpu_backed=True,
                  signal_stop_max_s=1.0, zygote=zygote)
    script = tmp_path / "plain.py"
    script.write_text("import signal, sys, time\n"
                      "def saved(*_):\n"
                      "    print('saved on SIGTERM', flush=True)\n"
                      "    sys.exit(0)\n"
                      "signal.signal(signal.SIGTERM, saved)\n"
                      "print('training', flush=True)\n"
                      "while True:\n"
                      "    time.sleep(0.05)\n")
    try:
        agent.start("p", Launch(["{python}", str(script)]), (0,))
        until(lambda: "training" in agent.read_log("p").decode(), what="p to train")
        agent.suspend("p")  # it says nothing of the protocol: SIGSTOP
        assert agent.jobs["p"].signalled
        ev = wait_for(agent, "suspended", "p", timeout=30)
        assert ev.data == {"held_gb": None, "stopped": True}
        log = agent.read_log("p").decode()
        assert "saved on SIGTERM" in log and "stopped by signal for 1 s" in log
        agent.resume("p", (0,))  # started again
        until(lambda: agent.read_log("p").decode().count("training") == 2,
              what="p's second start")
        agent.kill("p")
    finally:
        agent.close()


def test_a_signal_stop_is_bounded_by_half_the_collective_timeout_the_job_reported(
        zygote, tmp_path, monkeypatch):
    """A library job whose mini-batch outlasts the suspend's wait is stopped by signal; its
    process group's timeout (here 2 s, said in its profiles) bounds the stop to 1 s, far
    below the agent's own bound, so its watchdog never finds a collective timed out."""
    from gandiva.node import agent as agent_module

    assert agent_module.stop_bound(300.0, None) == 300.0  # nothing reported: 5 minutes
    assert agent_module.stop_bound(300.0, 600.0) == 300.0  # NCCL's default 10 minutes
    assert agent_module.stop_bound(300.0, 2.0) == 1.0
    assert agent_module.stop_bound(300.0, -5.0) == 300.0  # a job's nonsense: ignored
    with pytest.raises(wire.BadReport, match="collective_timeout_s"):  # (not a number)
        wire.report(b'{"ev": "profile", "step": 1, "mini_batch_time": 0.1, "memory_gb": 1, '
                    b'"utilization": null, "collective_timeout_s": "never"}')
    monkeypatch.setattr(agent_module, "ACK_TIMEOUT_S", 0.3)
    slow = tmp_path / "slow"
    script = tmp_path / "grouped.py"
    script.write_text(
        "import datetime, os, sys, time, torch, torch.distributed as dist\n"
        "import gandiva.job as gj\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, init_method='file://'\n"
        "                        + sys.argv[1] + '.store', timeout=datetime.timedelta(seconds=2))\n"
        "job = gj.init()\n"
        "job.register(model=torch.nn.Linear(2, 2))\n"
        "for step in job.steps(100_000):\n"
        "    time.sleep(2.0 if os.path.exists(sys.argv[1]) else 0.02)\n")
    agent = Agent(tmp_path / "agent", ["cuda:0"], checkpoint_every_s=1e9, cpu_backed=True,
                  zygote=zygote)
    try:
        agent.start("t", Launch(["{python}", str(script), str(slow)]), (0,))
        until(lambda: agent.jobs["t"].collective_timeout_s == 2.0, what="its group's timeout")
        slow.touch()  # its mini-batches now outlast the suspend's wait
        time.sleep(0.1)
        agent.suspend("t")
        assert agent.jobs["t"].signalled
        ev = wait_for(agent, "suspended", "t", timeout=30)
        assert ev.data == {"held_gb": None, "stopped": True}
        assert "stopped by signal for 1 s" in agent.read_log("t").decode()
    finally:
        agent.close()


def test_what_a_suspended_process_holds_is_unknown_without_nvml_never_guessed():
    # this machine has no NVIDIA driver: NVML answers nothing, and nothing is made up
    assert nvml.held_gb() is None
    assert nvml.utilization("GPU-0b5c1e9e-aaaa", 0) is None


def test_a_jobs_utilization_is_its_own_samples_not_its_gpu_partners():
    class Sample:
        def __init__(self, pid, at, sm):
            self.pid, self.timeStamp, self.smUtil = pid, at, sm

    samples = [Sample(10, 5, 90), Sample(11, 6, 40), Sample(11, 8, 60), Sample(11, 2, 100)]
    assert nvml.own_utilization(samples, 11, since_us=4) == pytest.approx(0.5)
    assert nvml.own_utilization(samples, 12, since_us=0) is None


def test_the_old_import_still_works_and_names_the_new_one():
    import importlib
    import sys

    sys.modules.pop("gandiva.runtime.job", None)
    with pytest.warns(DeprecationWarning, match="gandiva.job"):
        old = importlib.import_module("gandiva.runtime.job")
    import gandiva.job

    assert old is gandiva.job


def test_a_gang_whose_suspended_ranks_still_hold_too_much_is_checkpointed_and_stopped(
        zygote, tmp_path):
    # the stand-in GPUs say each suspended rank still holds 2 GB (NVML's part on a GPU:
    # NCCL communicators, say), more than the 1 GB a suspended process may keep
    agent = Agent(tmp_path / "agent", ["cuda:0", "cuda:1"], checkpoint_every_s=1e9,
                  cpu_backed=True, zygote=zygote)
    out = tmp_path / "g.jsonl"
    try:
        agent.start("g", Launch(["{python}", str(PROBE), str(out), "300"],
                                env={"GANDIVA_CPU_BACKED_HELD_GB": "2"}), (0, 1))
        started(agent, "g")
        trains(agent, "g")
        agent.suspend("g")
        ev = wait_for(agent, "suspended", "g")
        assert ev.data == {"held_gb": 2.0, "stopped": True}
        until(lambda: all(r.exit is not None for r in agent.jobs["g"].ranks))  # gone
        stopped_at = agent.jobs["g"].replies["suspended:0"].step
        agent.resume("g", (0, 1))
        assert started(agent, "g").restored == stopped_at
        wait_for(agent, "done", "g")
        assert len(records(out, "start")) == 4  # two ranks, twice
        assert {r["step"] for r in records(out, "end")} == {300}
    finally:
        agent.close()


def test_suspended_jobs_on_one_gpu_keep_at_most_half_its_headroom_there_together(
        gpu_agent, tmp_path):
    # three jobs packed on a stand-in GPU whose jobs may use 10 GB (its headroom: 1.1 GB),
    # each said to keep 0.1, 0.2 and 0.3 GB suspended: the third suspend takes them past
    # 0.56 GB, so the one holding most stops instead
    outs = {}
    for jid, gb in (("a", "0.1"), ("b", "0.2"), ("c", "0.3")):
        outs[jid] = tmp_path / f"{jid}.jsonl"
        gpu_agent.start(jid, Launch(["{python}", str(PROBE), str(outs[jid]), "100000"],
                                    env={"GANDIVA_CPU_BACKED_HELD_GB": gb}), (0,))
        started(gpu_agent, jid)
    for jid in "abc":
        gpu_agent.suspend(jid)
    until(lambda: all(r.exit is not None for r in gpu_agent.jobs["c"].ranks))
    assert [gpu_agent.jobs[j].parked for j in "abc"] == [False, False, True]
    assert all(r.exit is None for j in "ab" for r in gpu_agent.jobs[j].ranks)  # kept
    for jid in "abc":
        gpu_agent.resume(jid, (0,))
    assert started(gpu_agent, "c").restored is not None  # started again, from its checkpoint
    # (its "start" line is written at its first step, after the started event)
    until(lambda: len(records(outs["c"], "start")) == 2, what="c's second start line")
    assert [len(records(outs[j], "start")) for j in "ab"] == [1, 1]
    for jid in "abc":
        gpu_agent.kill(jid)


def test_a_suspended_job_whose_held_memory_is_unknown_counts_as_its_peak_never_as_none(
        zygote, tmp_path):
    """NVML cannot say what a suspended job still holds (a container's host PIDs, MIG): it
    is counted as the most it was seen to hold, so a job whose peak is past what suspended
    jobs may keep on the GPU is checkpointed and stopped, not left holding it unseen."""
    # a stand-in GPU whose jobs may use 2 GB: suspended ones may keep 0.11 GB together, and
    # the probe's peak (its RSS, the stand-in's count) is twice that and more
    agent = Agent(tmp_path / "agent", ["cuda:0"], checkpoint_every_s=1e9, cpu_backed=True,
                  memory_gb=2.0, zygote=zygote)
    try:
        agent.start("u", Launch(["{python}", str(PROBE), str(tmp_path / "u.jsonl"), "100000"],
                                env={"GANDIVA_CPU_BACKED_HELD_GB": "unknown"}), (0,))
        started(agent, "u")
        peak = until(lambda: agent.jobs["u"].memory_gb, what="u's peak")
        assert peak > 0.2
        agent.suspend("u")
        ev = wait_for(agent, "suspended", "u")
        assert ev.data == {"held_gb": agent.jobs["u"].memory_gb, "stopped": True}
        assert agent.held_gb("u") is None  # what it said: unknown
        assert "(unknown: counted as its peak)" in agent.read_log("u").decode()
    finally:
        agent.close()


def test_held_memory_the_driver_cannot_tell_is_unknown_never_zero():
    """What NVML lists, by the numbers it has for processes: this process's own, none for
    it (WDDM, MIG without privileges), or host PIDs seen from a container."""
    from types import SimpleNamespace

    class Driver:  # a driver's NVML with one GPU and these processes on it
        def __init__(self, *listed):
            self.listed = [SimpleNamespace(pid=p, usedGpuMemory=used) for p, used in listed]

        def nvmlDeviceGetCount(self):
            return 1

        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            return self.listed

    me, parent, foreign = os.getpid(), os.getppid(), 4_194_304 + 7  # (beyond any pid_max)
    try:
        nvml.use(Driver((me, 3 * 2**30), (parent, 2**30)))
        assert nvml.held_gb() == 3.0
        nvml.use(Driver((me, None)))
        assert nvml.held_gb() is None
        nvml.use(Driver((parent, 2**30)))  # its numbers are this machine's: it holds none
        assert nvml.held_gb() == 0.0
        nvml.use(Driver((foreign, 2**30)))  # numbers from another PID namespace
        assert nvml.held_gb() is None
        nvml.use(Driver())
        assert nvml.held_gb() is None
    finally:
        nvml.use(None)  # (asked again: this machine's own, none)


def test_a_mig_instance_is_a_device_type_of_its_own_named_gpu_and_profile():
    from gandiva.backends.driver import device_type

    assert device_type("NVIDIA H100 80GB HBM3") == "H100"
    assert device_type("Tesla V100-SXM2-16GB") == "V100-SXM2-16GB"
    assert device_type("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "A100-SXM4-40GB-1g.5gb"
    assert device_type("NVIDIA H100 80GB HBM3 MIG 3g.40gb") == "H100-3g.40gb"


def test_a_cap_leaves_the_allocator_what_is_left_beside_what_the_process_holds_outside_it():
    """A cap counts as the driver does (context, NCCL's buffers and all); only the caching
    allocator can be limited, so it gets the cap less the rest: measured by NVML against
    the allocator's reserve, at least a context's, a context's where NVML cannot tell."""
    from types import SimpleNamespace

    from gandiva.job import CONTEXT_GB, Job, allocator_fraction

    assert allocator_fraction(20.0, 2.0, 80.0) == pytest.approx(18.0 / 80.0)
    assert allocator_fraction(1.0, 2.0, 80.0) == 0.0
    assert allocator_fraction(90.0, 0.5, 80.0) == 1.0

    class Driver:
        def __init__(self, used):
            self.used = used

        def nvmlDeviceGetCount(self):
            return 1

        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.used)]

    job = Job({})
    assert job.outside_gb(nvml.held_gb()) == CONTEXT_GB  # no NVML here
    try:
        nvml.use(Driver(3 * 2**30))
        assert job.outside_gb(nvml.held_gb()) == 3.0  # (no allocator reserve on this machine)
        nvml.use(Driver(2**28))
        assert job.outside_gb(nvml.held_gb()) == CONTEXT_GB  # never less than a context
        nvml.use(Driver(None))
        assert job.outside_gb(nvml.held_gb()) == CONTEXT_GB
    finally:
        nvml.use(None)


def test_no_sample_over_a_whole_sampling_period_is_idle_and_what_nvml_cannot_tell_is_unknown():
    """The driver keeps a process's sample only when it used the GPU (NOT_FOUND when no
    process did): over a span of a sampling period or more, none of its own means idle.
    A MIG instance or any other error: unknown, never busy. Shorter windows are extended,
    never read."""
    from types import SimpleNamespace

    class NotFound(Exception):
        value = 6  # NVML_ERROR_NOT_FOUND

    class Driver:
        NVML_ERROR_NOT_FOUND = 6

        def __init__(self, samples):
            self.samples = samples

        def nvmlDeviceGetHandleByUUID(self, uuid):
            return uuid

        def nvmlDeviceGetProcessUtilization(self, handle, since_us):
            if isinstance(self.samples, Exception):
                raise self.samples
            return self.samples

    me = os.getpid()
    try:
        nvml.use(Driver([SimpleNamespace(pid=me, timeStamp=10, smUtil=40)]))
        assert nvml.utilization("GPU-x", 5) == pytest.approx(0.4)
        nvml.use(Driver([SimpleNamespace(pid=me + 1, timeStamp=10, smUtil=90)]))
        assert nvml.utilization("GPU-x", 5) == 0.0  # its partner's, not its own
        nvml.use(Driver(NotFound()))
        assert nvml.utilization("GPU-x", 5) == 0.0
        nvml.use(Driver(RuntimeError("not supported (a MIG instance)")))
        assert nvml.utilization("GPU-x", 5) is None
    finally:
        nvml.use(None)
    asked = []
    span = nvml.Span(since=100.0)
    ask = lambda since_us: asked.append(since_us) or 0.5  # noqa: E731
    assert span.read(100.25, ask) is None and asked == []  # a first window: too short
    assert span.read(101.0, ask) == 0.5 and asked == [100_000_000]
    assert span.read(101.5, ask) == 0.5 and len(asked) == 1  # the last span's, not read
    assert span.read(102.0, ask) == 0.5 and asked[-1] == 101_000_000


def test_jobs_of_unknown_memory_are_never_paired_on_a_gpu():
    from gandiva.policies.gandiva import config
    from gandiva.policies.gandiva.packing import Packing
    from gandiva.policies.gandiva.shared import Shared
    from gandiva.spec import JobSpec
    from gandiva.state import Job

    packing = Packing(Shared(quantum=60.0), config.PackingSettings())
    a, b = (Job(JobSpec(name, 0.0, 1, "unknown"), seq, 0) for seq, name in enumerate("ab"))
    a.memory_gb = 2.0
    assert not packing.may_pair(a, b, 16.0)  # b's memory unknown: not 0
    b.memory_gb = 3.0
    assert packing.may_pair(a, b, 16.0) and not packing.may_pair(a, b, 4.0)


def test_a_cap_for_one_rank_of_a_gang_takes_no_part_in_its_agreement(gpu_agent, tmp_path):
    # a one-GPU job packed on one of a gang's two GPUs: only that rank is capped, and the
    # gang (whose ranks agree on commands) goes on to its end
    gang, one = tmp_path / "g.jsonl", tmp_path / "o.jsonl"
    gpu_agent.start("g", probe(gang, 400), (0, 1))
    started(gpu_agent, "g")
    gpu_agent.start("o", probe(one, 100_000), (0,))
    until(lambda: records(one, "cap"))
    wait_for(gpu_agent, "done", "g", timeout=120)
    assert {r["step"] for r in records(gang, "end")} == {400}
    gpu_agent.kill("o")


def test_a_cap_that_comes_while_suspended_does_not_end_the_suspension(tmp_path):
    import socket
    import threading

    from gandiva.job import Job, wire

    ours, theirs = socket.socketpair()
    job = Job({"GANDIVA_CONTROL_FD": str(theirs.fileno()), "GANDIVA_DEVICE": "cpu"})
    ours.recv(4096)  # its hello
    ours.sendall(wire.encode(wire.Suspend()) + wire.encode(wire.Limit(1.5)))
    boundary = threading.Thread(target=job.boundary)
    boundary.start()
    until(lambda: b"suspended" in ours.recv(4096))
    boundary.join(timeout=0.5)
    assert boundary.is_alive()  # still suspended: the cap is no command
    ours.sendall(wire.encode(wire.Resume("cpu")))
    boundary.join(timeout=10)
    assert not boundary.is_alive() and job.memory_cap_gb == 1.5
