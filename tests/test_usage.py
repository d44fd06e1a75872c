"""Accounting: GPU-seconds allocated and used, borrowed and lent, fair against received
(``gandiva/accounting.py``), counted from the server's record of real jobs
(``server/usage.py``), served as ``GET /v1/usage`` and printed by ``gandiva usage``."""

import json
import time
from datetime import UTC, datetime

import pytest
from serving import in_process

from gandiva.accounting import JobUse, account
from gandiva.shares import Shares


def use(jid, user, held=(), demand=None, samples=(), gpus=1):
    held = [(a, b, tuple(d)) for a, b, d in held]
    return JobUse(jid, user, gpus, held, demand if demand is not None else
                  [(min(a for a, _, _ in held), max(b for _, b, _ in held))], list(samples))


def test_a_packed_device_charges_each_job_half_and_suspended_time_nothing():
    jobs = [use("a", "ann", [(0, 100, [0])]),
            use("b", "bo", [(50, 100, [0]), (150, 200, [0])])]  # suspended 100-150
    u = account(jobs, Shares(), {}, 1, 0, 200)
    assert u.users["ann"].allocated == pytest.approx(50 + 25)
    assert u.users["bo"].allocated == pytest.approx(25 + 50)
    assert not u.quotas and u.users["bo"].borrowed == 0


def test_used_is_weighted_by_utilisation_and_unknown_utilisation_is_unmeasured_not_zero():
    jobs = [use("a", "ann", [(0, 100, [0, 1])], samples=[(20, 0.5), (60, None), (80, 1.0)])]
    t = account(jobs, Shares(), {}, 2, 0, 100).users["ann"]
    assert t.allocated == pytest.approx(200)
    assert t.used == pytest.approx(2 * (40 * 0.5 + 20 * 1.0))
    assert t.unmeasured == pytest.approx(2 * (20 + 20))  # before the first sample; None


def test_a_team_over_its_quota_borrows_what_another_teams_idle_quota_lends():
    shares = Shares({"a": 1, "b": 1}, {"ann": ("a", 1), "bo": ("b", 1)})
    jobs = [use("x", "ann", [(0, 10, [0])]), use("y", "bo", [(10, 40, [0])])]
    u = account(jobs, shares, {"a": 1, "b": 0}, 1, 0, 40)
    assert u.teams["b"].borrowed == pytest.approx(30) and u.teams["b"].lent == 0
    assert u.teams["a"].lent == pytest.approx(30) and u.teams["a"].borrowed == 0
    # a GPU no quota reserves is borrowed first: nothing of a's is lent while one is free
    u = account(jobs, shares, {"a": 1, "b": 0}, 2, 0, 40)
    assert u.teams["b"].borrowed == pytest.approx(30) and u.teams["a"].lent == 0


def test_an_elastic_jobs_growth_beyond_its_teams_quota_is_borrowed():
    # ann's job asks for 1 GPU, her team's quota; it grows into 3 more for 100 s (the other
    # team's idle quota of 3): those GPU-seconds are borrowed by a, lent by b
    shares = Shares({"a": 1, "b": 1}, {"ann": ("a", 1), "bo": ("b", 1)})
    jobs = [use("x", "ann", [(0, 100, [0]), (100, 200, [0, 1, 2, 3])])]
    u = account(jobs, shares, {"a": 1, "b": 3}, 4, 0, 200)
    assert u.teams["a"].allocated == pytest.approx(100 + 400)
    assert u.teams["a"].borrowed == pytest.approx(300)
    assert u.teams["b"].lent == pytest.approx(300)


def test_the_fair_share_is_water_filled_by_tickets_within_each_window():
    shares = Shares({"a": 3, "b": 1}, {"ann": ("a", 1), "bo": ("b", 1)})
    jobs = [use("x", "ann", [(0, 50, [0])], demand=[(0, 100)]),
            use("y", "bo", [(50, 100, [0])], demand=[(0, 100)]),
            use("z", "bo", [], demand=[(100, 200)])]  # alone in the second window
    u = account(jobs, shares, {}, 1, 0, 200, window=100)
    assert u.users["ann"].fair == pytest.approx(75) and u.users["bo"].fair == pytest.approx(125)
    assert [round(per.get("a", (0, 0))[0]) for _, per in u.series] == [75, 0]
    assert u.series[0][1]["b"] == pytest.approx((25, 50))


def test_the_record_of_a_job_gives_its_intervals_a_restart_ends_what_it_held():
    from gandiva.server.store import EventRow, JobRow
    from gandiva.server.usage import job_use

    row = JobRow(id="j", spec={"gpus": 2}, submitted_at=0.0)
    events = [EventRow(at=at, kind=kind, data=data) for at, kind, data in (
        (10, "running", {"devices": [0, 1]}), (15, "profile", {"utilization": None}),
        (15, "done", {"utilization": 0.8}),  # one batch: one time; None sorts beside 0.8
    )]
    use = job_use(row, "ann", events, 100)
    assert use.held == [(10, 15, (0, 1))] and use.demand == [(0, 15)]
    account([use], Shares(), {}, 2, 0, 100)  # (samples of one time, one of them None)
    events = [EventRow(at=at, kind=kind, data=data) for at, kind, data in (
        (10, "running", {"devices": [0]}), (20, "stopped-for-shutdown", {}),
        (1000, "requeued", {}), (1010, "running", {"devices": [1]}), (1020, "held", {}),
        (1050, "released", {}), (1060, "migrated", {"devices": [0]}),
        (1070, "cancelled", {}))]
    use = job_use(row, "ann", events, 2000)
    assert use.held == [(10, 20, (0,)), (1010, 1020, (1,)), (1060, 1070, (0,))]
    assert use.demand == [(0, 1020), (1050, 1070)]


# ---- on a server, real jobs ---------------------------------------------------------------

pytest.importorskip("torch")
PACED = """\
import time
import torch
import gandiva.job as gj

job = gj.init()
job.register(model=torch.nn.Linear(2, 2))
for step in job.steps(1_000_000):
    time.sleep(0.01)
"""


@pytest.fixture
def served(zygote, tmp_path):
    """A server's parts on one slot, time-sliced in 5 s turns, behind a real uvicorn."""
    with in_process(tmp_path / "home", zygote, policy="slicer:quantum=5") as server:
        for who in ("ada", "bob"):
            (server.home / "users" / who / "paced.py").write_text(PACED)
        yield server.client, server.tokens, server.url


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def test_two_jobs_sliced_on_one_slot_for_30_s_are_charged_15_each_borrowed_and_lent(served):
    """ada's team has the slot as its quota; bob's has none: while bob's job has its turn,
    bob's team borrows the slot and ada's lends it. Read back through ``gandiva usage``."""
    from typer.testing import CliRunner

    from gandiva.cli import app as cli

    client, tokens, url = served
    root = {"Authorization": f"Bearer {tokens['root']}"}
    client.post("/v1/teams", json={"name": "owners", "quota_gpus": 1}, headers=root)
    client.post("/v1/teams", json={"name": "guests"}, headers=root)
    client.patch("/v1/users/ada", json={"team": "owners"}, headers=root)
    client.patch("/v1/users/bob", json={"team": "guests"}, headers=root)
    start = time.time()
    ids = []
    for who in ("ada", "bob"):
        r = client.post("/v1/jobs", json={"name": who, "command": ["python", "paced.py"]},
                        headers={"Authorization": f"Bearer {tokens[who]}"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    time.sleep(max(0.0, start + 30 - time.time()))
    end = time.time()
    runner = CliRunner()
    out = runner.invoke(cli, ["usage", "--since", iso(start), "--until", iso(end), "--by",
                              "team", "--json", "--url", url, "--token", tokens["root"]])
    assert out.exit_code == 0, out.output
    teams = {r["name"]: r for r in json.loads(out.output)["rows"]}
    print({t: {k: r[k] for k in ("allocated_gpu_s", "borrowed_gpu_s", "lent_gpu_s")}
           for t, r in teams.items()})
    for team in ("owners", "guests"):  # half the slot each, less the switches
        assert 14 <= teams[team]["allocated_gpu_s"] <= 16, teams
    assert teams["guests"]["borrowed_gpu_s"] == pytest.approx(
        teams["guests"]["allocated_gpu_s"], abs=0.01)
    assert teams["owners"]["lent_gpu_s"] == pytest.approx(
        teams["guests"]["borrowed_gpu_s"], abs=0.01)
    assert teams["owners"]["borrowed_gpu_s"] == 0 and teams["guests"]["lent_gpu_s"] == 0
    # used: weighted by what the job reports (on a CPU slot its CPU time: it sleeps 10 ms a
    # step); unmeasured: before its first report
    owners = teams["owners"]
    assert owners["used_gpu_s"] < 0.5 * owners["allocated_gpu_s"]
    assert owners["used_gpu_s"] + owners["unmeasured_gpu_s"] <= owners["allocated_gpu_s"]
    # a member sees their own row only; the table names the columns
    out = runner.invoke(cli, ["usage", "--since", iso(start), "--until", iso(end), "--json",
                              "--url", url, "--token", tokens["ada"]])
    assert [r["name"] for r in json.loads(out.output)["rows"]] == ["ada"]
    out = runner.invoke(cli, ["usage", "--since", iso(start), "--url", url, "--token",
                              tokens["ada"]])
    assert "ALLOCATED" in out.output and "BORROWED" in out.output and "ada" in out.output
    # Prometheus, per team: the slot held by one team at a time, owed half to each
    metrics = client.get("/metrics").text
    held = [float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("gandiva_team_devices_allocated{")]
    assert len(held) == 2 and sum(held) <= 1.0
    assert 'gandiva_team_devices_fair{team="owners"} 0.5' in metrics
    assert 'gandiva_team_devices_fair{team="guests"} 0.5' in metrics
    for query, field in (("since=yesterday", "since"), ("since=0001-01-01", "since"),
                         ("window=" + "9" * 400, "window"), ("since=1h&window=1s", "window")):
        r = client.get(f"/v1/usage?{query}", headers=root)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", field], query
    for job in ids:
        client.post(f"/v1/jobs/{job}/cancel", headers=root)
