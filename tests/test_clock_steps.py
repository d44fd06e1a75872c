"""The wall clock stepped (NTP, a VM resumed) moves no time limit: the driver measures
running time on the monotonic clock, and the wall clock only stamps what is stored."""

from __future__ import annotations

import threading
import time

from gandiva.backends.driver import Driver
from gandiva.node.agent import Launch
from gandiva.policies import make_policy
from gandiva.spec import JobSpec


def test_a_wall_clock_stepped_a_day_ahead_mid_run_stops_no_job_for_its_time_limit(
        zygote, tmp_path, monkeypatch):
    backend = Driver(make_policy("fifo"), tmp_path, slots=1, zygote=zygote)
    backend.submit(JobSpec("sleeps", 0.0, 1, "cnn"), Launch(["sleep", "2"]), time_limit=30)
    backend.submit(JobSpec("limited", 0.0, 1, "cnn"), Launch(["sleep", "60"]), time_limit=1)
    real = time.time
    step = threading.Timer(0.5, lambda: monkeypatch.setattr(time, "time",
                                                            lambda: real() + 86400))
    step.start()
    try:
        result = backend.run()
    finally:
        step.cancel()
    jobs = {j.spec.id: j for j in result.jobs}
    assert jobs["sleeps"].status == "done"  # 2 s of its 30, whatever the wall clock says
    assert jobs["limited"].status == "failed"  # its own limit still holds...
    assert "time limit" in jobs["limited"].reason
    assert jobs["limited"].finish - jobs["limited"].start < 20  # ...after about 1 s of running
