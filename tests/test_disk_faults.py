"""A disk that refuses a checkpoint fails the checkpoint, not the job: the job trains on, the
checkpoints before it stand and verify, nothing half-written is left, and the log says so.
A disk that refuses a job's output drops the output, not the job.

The fault is the operating system's own: the job process lowers its file-size limit
(RLIMIT_FSIZE) mid-run, so every later write of a checkpoint fails with EFBIG, as a full
volume fails it with ENOSPC, through the same calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gandiva.backends.driver import Driver, JobRecord
from gandiva.job import checkpoint
from gandiva.node.agent import Launch
from gandiva.node.zygote import Zygote
from gandiva.policies import make_policy
from gandiva.spec import JobSpec

SCRIPT = """
import resource, signal, sys, torch
import gandiva.job as gj

job = gj.init()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
job.register(model=model, optimizer=opt)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
for step in job.steps(30):
    if step == FULL_AT:  # the disk is full from here on
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY))
    loss = model(torch.ones(2, 8)).square().sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained to", job.step, "refused", job.checkpoints_refused)
"""


def run(tmp_path: Path, full_at: int, directory: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("FULL_AT", str(full_at)))
    env = {**os.environ, "GANDIVA_CHECKPOINT_DIR": str(directory),
           "GANDIVA_CHECKPOINT_EVERY_S": "0"}  # a checkpoint at every boundary
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_checkpoint_the_disk_refuses_fails_alone_and_the_last_good_one_stands(tmp_path):
    ckpts = tmp_path / "ckpt"
    proc = run(tmp_path, 10, ckpts)
    assert proc.returncode == 0, proc.stderr
    assert "trained to 30 refused" in proc.stdout
    refused = int(proc.stdout.split("refused")[1])
    assert refused >= 20  # every checkpoint after the disk filled, the final one included
    assert "failed" in proc.stderr and "training goes on, the newest checkpoint is step" in (
        proc.stderr)
    newest = checkpoint.steps(ckpts)
    assert newest and newest[0] <= 10  # written before the disk filled
    found = checkpoint.latest(ckpts)
    assert found is not None and found[0] == newest[0]  # it verifies against its digest
    assert not [p.name for p in ckpts.iterdir() if p.name.endswith(".tmp")
                or p.name.endswith(".corrupt")]


def test_a_checkpoint_directory_removed_mid_run_is_made_again(tmp_path):
    """The directory is recreated at the next checkpoint; a job whose directory cannot be
    made (its parent is a file) trains on without one."""
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    proc = run(tmp_path, 10**6, blocked / "ckpt")  # the disk never fills
    assert proc.returncode == 0, proc.stderr
    assert "trained to 30" in proc.stdout and "not written" in proc.stderr


def run_alone(zygote: Zygote, tmp_path: Path, name: str, source: str) -> tuple[JobRecord, str]:
    """The script ``source`` run as the only job of a driver on one slot: its record and
    its log."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    backend = Driver(make_policy("fifo"), tmp_path / "work", slots=1, zygote=zygote)
    backend.submit(JobSpec(name, 0.0, 1, "cnn"), Launch(["{python}", str(script)]))
    (rec,) = backend.run(timeout=120).jobs
    return rec, backend.read_log(name).decode()


CHATTY = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
print("before", flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.fstat(1).st_size, resource.RLIM_INFINITY))
for i in range(1000):  # the disk is full: none of these fit
    print("lost", i)
print("a warning", file=sys.stderr)
sys.stdout.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print("after")
"""


def test_output_the_disk_refuses_is_dropped_and_the_job_ends_well(tmp_path):
    """Printing to a full disk (/dev/full: ENOSPC on every write) ends a plain Python
    process with an error; with the output guard the same script ends well."""
    loop = "for i in range(2000):\n    print('step', i, 'x' * 100)\n"
    with open("/dev/full", "w") as full:
        bare = subprocess.run([sys.executable, "-c", loop], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
        guarded = subprocess.run([sys.executable, "-c", "from gandiva.job import output\n"
                                  "output.install()\n" + loop], stdout=full,
                                 stderr=subprocess.PIPE, text=True, timeout=60)
    assert bare.returncode == 1 and "No space left on device" in bare.stderr  # the fault
    assert guarded.returncode == 0, guarded.stderr


def test_a_job_s_log_says_what_the_full_disk_lost_once_it_takes_writes_again(zygote, tmp_path):
    """A job the agent runs, its log's disk full for a while (its file-size limit): the job
    ends done, and its log has what came before and after, and how much was lost."""
    rec, log = run_alone(zygote, tmp_path, "chatty", CHATTY)
    assert rec.status == "done", log
    assert "before" in log and "after" in log and "lost 0" not in log
    lost = int(log.split("[gandiva: ")[1].split(" bytes of output lost")[0])
    assert lost > 1000 * len("lost 999\n") // 2  # the prints, buffered and dropped


def test_the_guarded_log_keeps_every_line_in_order_up_to_an_abrupt_end(zygote, tmp_path):
    """Unbuffered as before: stdout and stderr interleave in the order written, and the lines
    before ``os._exit`` (as the library ends a checkpointed job) are in the log."""
    rec, log = run_alone(zygote, tmp_path, "abrupt", "import os, sys\nprint('one')\n"
                         "print('two', file=sys.stderr)\nprint('three')\nos._exit(0)\n")
    assert rec.status == "done", log
    assert log.splitlines()[-3:] == ["one", "two", "three"], log
