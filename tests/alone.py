"""Reference runs: a script run alone, uninterrupted, with no agent, for a test to compare a
scheduled job's end with. Each is a fork of one warm process per test worker (torch imported
once, not once a run: ~3 s of CPU each on the machines the suite runs on), which becomes the
script as a warm job does (``gandiva.job.warm.enter``), with no control channel."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

SERVE = """\
import json, os, sys
import torch  # noqa: F401 - once, for every run
from gandiva.job import warm, wire

for line in sys.stdin:
    run = json.loads(line)
    pid = os.fork()
    if pid == 0:
        warm.enter(wire.Become(run["argv"], run["env"], run["cwd"]),
                   os.open(run["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""
# what a job's process gets from its agent that acts at start-up (as start_zygote's)
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

_lock = threading.Lock()
_runner: subprocess.Popen | None = None


def run(argv: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float = 300
        ) -> None:
    """Run ``argv`` (a script and its arguments) with ``env`` (plus ``ENV``) in ``cwd``, its
    output to ``log``, to its end; an exit status other than 0 fails the test."""
    global _runner
    env = {k: v for k, v in {**env, **ENV}.items()
           if k not in ("GANDIVA_CONTROL_FD", "GANDIVA_JOB_ID")}
    with _lock:
        if _runner is None or _runner.poll() is not None:
            _runner = subprocess.Popen(
                [sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, env={k: v for k, v in {**os.environ, **ENV}.items()
                                if k != "GANDIVA_CONTROL_FD"})
        assert _runner.stdin is not None and _runner.stdout is not None
        _runner.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": str(cwd),
                                        "log": str(log)}) + "\n")
        _runner.stdin.flush()
        if not select.select([_runner.stdout], [], [], timeout)[0]:
            _runner.kill()  # (the next run starts a new one)
            raise AssertionError(f"{argv} did not end within {timeout:g} s alone")
        code = _runner.stdout.readline().strip()
    out = log.read_text(errors="replace") if log.exists() else ""
    assert code == "0", f"{argv} alone: exit status {code or '(none)'}\n{out[-3000:]}"
