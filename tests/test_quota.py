"""Quotas that lend: a team's guaranteed GPUs run other teams' jobs while it leaves them
idle, and its own job takes one back at the next round, by suspend (a checkpoint at a
mini-batch boundary), never a kill; the borrower ends as if it had run alone. Real jobs on a
server's parts (``serving.in_process``), one CPU slot."""

import shutil
import time
from pathlib import Path

import pytest
from serving import in_process
from waiting import until

pytestmark = pytest.mark.slow  # (CI runs it after the suite: .ci/run)
pytest.importorskip("torch")
from test_runtime import PACE, SMALL, assert_identical, reference  # noqa: E402

from gandiva.job import checkpoint  # noqa: E402

CNN = Path(__file__).resolve().parents[1] / "examples" / "cnn.py"
QUANTUM = 3


def test_an_owner_takes_its_lent_slot_back_within_two_quanta_and_the_borrower_ends_identical(
        zygote, tmp_path):
    args = ["--steps", "1500", "--seed", "5", *SMALL]
    ref = reference(tmp_path / "ref", "cnn.py", *args)
    with in_process(tmp_path / "home", zygote, policy=f"gandiva:fair:quantum={QUANTUM}"
                    ) as srv:
        c = srv.client

        def auth(who: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {srv.tokens[who]}"}

        c.post("/v1/teams", json={"name": "owners", "quota_gpus": 1}, headers=auth("root"))
        c.post("/v1/teams", json={"name": "guests"}, headers=auth("root"))
        c.patch("/v1/users/ada", json={"team": "owners"}, headers=auth("root"))
        c.patch("/v1/users/bob", json={"team": "guests"}, headers=auth("root"))
        for who in ("ada", "bob"):
            shutil.copy(CNN, srv.home / "users" / who / "cnn.py")

        def submit(who: str, argv: list[str]) -> str:
            r = c.post("/v1/jobs", json={"name": who, "command": ["python", "cnn.py", *argv]},
                       headers=auth(who))
            assert r.status_code == 201, r.text
            return r.json()["id"]

        def job(jid: str, who: str) -> dict:
            return c.get(f"/v1/jobs/{jid}", headers=auth(who)).json()

        borrower = submit("bob", [*args, *PACE])
        until(lambda: job(borrower, "bob")["steps"] > 50, 120, "bob's job to train")
        why = c.get(f"/v1/jobs/{borrower}/explain", headers=auth("bob")).json()
        assert why["share"].startswith("your team (guests) is over its quota: 1 of 0 GPUs")
        asked = time.monotonic()
        owner = submit("ada", ["--steps", "1500", "--seed", "1", *SMALL, *PACE])  # 2+ quanta
        until(lambda: job(owner, "ada")["state"] in ("running", "done"), 60, "ada's job")
        took = time.monotonic() - asked
        print(f"ada waited {took:.2f} s")
        assert took <= 2 * QUANTUM, f"{took:.1f} s from ada's submit to her job running"
        until(lambda: job(borrower, "bob")["state"] == "done", 180, "bob's job to end")
        events = c.get(f"/v1/jobs/{borrower}/events", headers=auth("bob")).json()
        kinds = [e["kind"] for e in events]
        assert "suspended" in kinds and "restarted" not in kinds and "failed" not in kinds
        # the quota is ada's while her job runs: bob's does not get a turn back meanwhile
        # (under fair shares alone they would alternate every round)
        hers = c.get(f"/v1/jobs/{owner}/events", headers=auth("ada")).json()
        began = min(e["at"] for e in hers if e["kind"] == "running")
        ended = max(e["at"] for e in hers if e["kind"] == "done")
        assert job(owner, "ada")["state"] == "done"
        assert not [e for e in events if e["kind"] == "running" and began < e["at"] < ended]
        final = checkpoint.latest(srv.service.backend.agent.checkpoint_dir(borrower))[1]
        assert_identical(final, ref)
