"""A server process paused (SIGSTOP, as a debugger, a frozen VM or a swap storm does) and
continued: it catches up on what its jobs said meanwhile and acts once, not twice. A job
that is itself silent past the hang limit is another matter: restarted, and counted."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx2
from serving import metric, running
from waiting import until

STEADY = """\
import time
import gandiva.job as gj

job = gj.init()
for step in job.steps(300):  # 6 s or more: it trains on through the 4 s pause
    time.sleep(0.02)
"""

HANGS_ONCE = """\
import time
from pathlib import Path
import gandiva.job as gj

job = gj.init()
for step in job.steps(150):
    time.sleep(0.02)
    if step == 50 and not Path("hung-once").exists():
        Path("hung-once").touch()
        time.sleep(600)  # stuck, as a rank in a collective whose peer is gone
"""


def submitted(srv, script: str, source: str) -> tuple[httpx2.Client, dict]:
    """alice's client, and the job running her ``script`` (written with ``source``)."""
    http = httpx2.Client(base_url=srv.url, timeout=60,
                         headers={"Authorization": f"Bearer {srv.tokens['alice']}"})
    srv.user_dir("alice").mkdir(parents=True, exist_ok=True)
    (srv.user_dir("alice") / script).write_text(source)
    job = http.post("/v1/jobs", json={"name": script.removesuffix(".py"),
                                      "command": ["python", script]}).json()
    return http, job


def test_a_paused_server_is_not_taken_for_a_hung_job_and_acts_once(tmp_path):
    """The server (and its agent) stopped for longer than its hang limit while a job trains:
    continued, it reads the job's reports and does not restart it; a submission sent during
    the pause is answered once the server runs again, and its job runs once."""
    with running(tmp_path, args=("--hang-after", "2", "--checkpoint-every", "1")) as srv:
        http, job = submitted(srv, "steady.py", STEADY)
        until(lambda: http.get(f"/v1/jobs/{job['id']}").json()["steps"] > 20, 60,
              "the job training", every=0.1)
        answered = {}
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            during = threading.Thread(target=lambda: answered.update(r=http.post(
                "/v1/jobs", json={"name": "during", "command": ["true"],
                                  "submission_id": "during-pause"})))
            during.start()
            time.sleep(4)  # twice the hang limit
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        during.join(timeout=30)
        assert answered["r"].status_code == 201, answered["r"].text
        until(lambda: all(j["state"] == "done" for j in http.get("/v1/jobs").json()), 120,
              "both jobs done", every=0.1)
        kinds = [e["kind"] for e in http.get(f"/v1/jobs/{job['id']}/events").json()]
        assert "restarted" not in kinds and kinds.count("done") == 1, kinds
        other = answered["r"].json()["id"]
        kinds = [e["kind"] for e in http.get(f"/v1/jobs/{other}/events").json()]
        assert kinds.count("running") == 1 and kinds.count("done") == 1, kinds
        assert metric(http, "gandiva_jobs_hung_total") == 0


def test_a_job_silent_past_the_hang_limit_is_restarted_said_why_and_counted(
        tmp_path):
    """(That it resumes from its checkpoint: tests/test_runtime.py.)"""
    with running(tmp_path, args=("--hang-after", "5")) as srv:
        http, job = submitted(srv, "hangs.py", HANGS_ONCE)
        until(lambda: http.get(f"/v1/jobs/{job['id']}").json()["state"] == "done", 120,
              "the job done", every=0.1)
        events = http.get(f"/v1/jobs/{job['id']}/events").json()
        (restarted,) = [e for e in events if e["kind"] == "restarted"]
        assert "hung: no report from any rank for 5 s" in restarted["data"]["reason"]
        assert metric(http, "gandiva_jobs_hung_total") == 1
        assert metric(http, "gandiva_job_restarts_total") == 1
