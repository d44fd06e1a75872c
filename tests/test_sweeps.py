"""Learning curves and sweeps: every value a job reports reaches the store by step, and a
sweep draws its trials from its seed, promotes and stops them at its rungs from what they
report, and survives a server restart."""

import itertools
import math
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from held import Held

from gandiva.job import wire
from gandiva.server.jobspec import SpecError
from gandiva.sweep import rules
from gandiva.sweep.spec import grid_point, parse

SPEC = """
name: cnn-lr
command: python cnn.py --steps 600 --lr {lr} --width {width} --seed {trial}
trials: 6
seed: 7
space:
  lr: {log_uniform: [0.001, 0.5]}
  width: {choice: [8, 16, 32]}
  batch: {grid: [32, 64]}
  optimizer: sgd
metric: loss
stop: {rule: asha, rungs: [50, 150]}
"""


# ---- the spec ---------------------------------------------------------------------------
def test_a_sweeps_trials_are_drawn_from_its_seed_with_their_parameters_in_the_command():
    spec = parse(SPEC)
    trials = spec.draw()
    assert trials == parse(SPEC).draw()  # the same seed: the same trials
    assert trials != parse(SPEC.replace("seed: 7", "seed: 8")).draw()
    assert len(trials) == 6
    assert [t["batch"] for t in trials] == [32, 64] * 3  # grid points in order, cycled
    assert all(0.001 <= t["lr"] <= 0.5 and t["width"] in (8, 16, 32)
               and t["optimizer"] == "sgd" for t in trials)
    # log-uniform: spread over the decades, not bunched at the top as a uniform draw is
    many = parse(SPEC.replace("trials: 6", "trials: 400")).draw()
    assert sum(t["lr"] < 0.02 for t in many) > 150
    job = spec.trial_request(3, trials[3], "cnn-lr-1234")
    assert job.name == "cnn-lr-3"
    assert job.command == ["python", "cnn.py", "--steps", "600", "--lr",
                           f"{trials[3]['lr']:.6g}", "--width", str(trials[3]["width"]),
                           "--seed", "3"]
    assert job.labels == {"sweep": "cnn-lr-1234", "trial": "3"}
    grid_only = parse("name: g\ncommand: python a.py {x} {y}\nmetric: loss\n"
                      "space: {x: {grid: [1, 2, 3]}, y: {grid: [a, b]}}")
    assert grid_only.count() == 6 and len({tuple(p.values()) for p in grid_only.draw()}) == 6
    # no rule named: ASHA, at rungs of 100 mini-batches times powers of its reduction (3)
    assert (grid_only.stop.rule, grid_only.stop.rungs) == ("asha", [100, 300, 900, 2700])


def test_a_grid_of_a_billion_points_and_one_trial_builds_one_point():
    """A 400-byte spec: 9 parameters of 10 values each, 1 trial (the product, built whole,
    would be ~100 GB)."""
    space = ", ".join(f"p{k}: {{grid: [{', '.join(map(str, range(10)))}]}}" for k in range(9))
    with Held() as held:
        spec = parse(f"name: g\ncommand: python a.py\nmetric: loss\ntrials: 1\n"
                     f"space: {{{space}}}")
        trials = spec.draw()
    assert spec.grid_size() == 10**9 and trials == [{f"p{k}": 0 for k in range(9)}]
    assert held.mib < 20  # a point, not the grid
    grids = {"a": [1, 2, 3], "b": ["x", "y"], "c": [True, False]}  # itertools.product's order
    assert [tuple(grid_point(grids, i).values()) for i in range(24)] == \
        list(itertools.product(*grids.values())) * 2


def test_the_example_sweep_spec_is_valid_and_draws_its_trials():
    spec = parse((Path(__file__).resolve().parents[1] / "examples" / "sweep.yaml").read_text())
    assert spec.count() == 16 and spec.stop.rule == "asha"
    assert all("{" not in a for a in spec.trial_request(0, spec.draw()[0], "x").command)


@pytest.mark.parametrize("change, field, says", [
    ("trials: 6\n", "trials", "drawn at random; say how many"),
    ("{lr}", "command", "{lrr} names no parameter"),
    ("log_uniform: [0.001, 0.5]", "space", "lr.log_uniform: give [lo, hi] with lo <= hi, lo > 0"),
    ("choice: [8, 16, 32]", "space", "width: 'normal' is no distribution"),
    ("rungs: [50, 150]", "stop", "rungs: give positive mini-batch counts in ascending order"),
    ("rule: asha", "stop.rule", "Input should be 'asha', 'median' or 'none'"),
    ("metric: loss", "metric", "String should have at least 1 character"),
])
def test_a_bad_sweep_spec_is_refused_naming_the_field(change, field, says):
    bad = {"trials: 6\n": "", "{lr}": "{lrr}", "log_uniform: [0.001, 0.5]": "log_uniform: [0, 1]",
           "choice: [8, 16, 32]": "normal: [0, 1]", "rungs: [50, 150]": "rungs: [150, 50]",
           "rule: asha": "rule: hyperband", "metric: loss": "metric: ''"}[change]
    with pytest.raises(SpecError) as e:
        parse(SPEC.replace(change, bad), "s.yaml")
    text = str(e.value)
    assert text.startswith("s.yaml: invalid sweep spec")
    assert f"{field}:" in text and says in text, text


# ---- the rules --------------------------------------------------------------------------
def test_a_rungs_value_is_the_mean_over_the_last_tenth_of_the_way_to_it():
    points = [(s, float(s)) for s in range(1, 120)]
    assert rules.value_at(100, points) == pytest.approx(sum(range(90, 101)) / 11)
    assert rules.value_at(200, points) is None  # not reached yet


def test_asha_keeps_the_top_third_at_a_rung_and_the_first_to_arrive():
    judge = rules.judge
    alone = judge("asha", 5.0, {}, minimize=True)
    assert alone.go_on and not alone.sure  # the first there goes on, for want of company
    assert not judge("asha", 5.0, {0: 4.0}, minimize=True).go_on  # 2nd of 2: top 1 only
    six = {i: float(i) for i in range(5)}  # 0..4 recorded: a 6th keeps the top 2
    assert judge("asha", 0.5, six, minimize=True).go_on  # 2nd of 6
    v = judge("asha", 1.5, six, minimize=True)
    assert not v.go_on and v.sure and (v.rank, v.of) == (3, 6) and "top 2 of 6" in v.why
    assert judge("asha", 9.0, six, minimize=False).go_on  # mode max: higher is better


def test_the_median_rule_stops_a_trial_worse_than_the_others_median_once_they_are_enough():
    judge = rules.judge
    assert judge("median", 9.0, {0: 1.0, 1: 2.0}, minimize=True, min_trials=3).go_on
    assert not judge("median", 9.0, {0: 1.0, 1: 2.0, 2: 3.0}, minimize=True).go_on
    assert judge("median", 2.0, {0: 1.0, 1: 2.0, 2: 3.0}, minimize=True).go_on
    assert judge("none", 1e9, {0: 1.0}, minimize=True).go_on


# ---- the job library --------------------------------------------------------------------
def test_every_reported_value_reaches_the_agent_by_step_thinned_to_the_window_limit():
    import gandiva.job as gj

    ours, theirs = socket.socketpair()
    job = gj.Job(env={"GANDIVA_CONTROL_FD": str(theirs.detach()), "GANDIVA_JOB_ID": "j"})
    for step in range(200):
        job.report(samples=1, loss=float(step + 1),
                   **({"accuracy": 0.5} if step % 50 == 0 else {}),
                   **({"bad": math.nan} if step == 7 else {}))
        job.next_command()
    job.finish(save=False)
    ours.settimeout(5)
    data = b""
    while not data.endswith(wire.encode(wire.Done(200))):
        data += ours.recv(65536)
    profiles = [m for m in map(wire.report, data.splitlines())
                if isinstance(m, wire.Profile)]
    assert all(len(pts) <= gj.POINTS_PER_WINDOW for p in profiles for pts in p.series.values())
    loss = [pt for p in profiles for pt in p.series.get("loss", [])]
    steps = [s for s, _ in loss]
    assert steps == sorted(set(steps)) and steps[-1] == 200  # the last always kept
    assert all(v == s for s, v in loss)  # each value at the step it was measured
    accuracy = [s for p in profiles for s, _ in p.series.get("accuracy", [])]
    assert accuracy == [1, 51, 101, 151]
    assert all("bad" not in p.series and "bad" not in p.metrics  # NaN is no JSON number
               for p in profiles)
    ours.close()


def test_a_jobs_first_profile_comes_after_a_quarter_second_and_later_ones_each_second():
    """Early feedback: the first window after a start is FIRST_WINDOW_S, and windows double
    up to REPORT_INTERVAL_S. (Steps of >= 50 ms: a one-second first window would report at
    step 20 at the earliest.)"""
    import gandiva.job as gj

    ours, theirs = socket.socketpair()
    job = gj.Job(env={"GANDIVA_CONTROL_FD": str(theirs.detach()), "GANDIVA_JOB_ID": "j"})
    t0 = time.perf_counter()
    for _ in range(60):
        time.sleep(0.05)
        job.report(samples=1, loss=1.0)
        job.next_command()
    took = time.perf_counter() - t0
    job.finish(save=False)
    ours.settimeout(5)
    data = b""
    while not data.endswith(wire.encode(wire.Done(60))):
        data += ours.recv(65536)
    steps = [m.step for m in map(wire.report, data.splitlines()) if isinstance(m, wire.Profile)]
    assert 5 <= steps[0] < 20, steps
    # 0.25 s, 0.5 s, then 1 s windows (and the last, sent at the end): quarter-second
    # windows throughout would have sent at least 4 a second
    assert len(steps) <= 3 + took, (steps, took)
    ours.close()


# ---- on a server: real trials, a real store ---------------------------------------------
CNN = str(Path(__file__).resolve().parents[1] / "examples" / "cnn.py")
TERMINAL = ("done", "failed", "cancelled")
LRS = [0.00001, 0.05, 0.0001, 0.1]  # two that learn, two that barely move


class Up:
    """A server's parts in this process (store, loop, API) over ``home``; ``crash`` stops
    the loop as a dying server does (the jobs' processes end; no drain), what was queued for
    the store stored first so that the next ``Up`` over ``home`` finds it."""

    def __init__(self, home: Path, zygote) -> None:
        from fastapi.testclient import TestClient

        from gandiva.backends.driver import Driver
        from gandiva.policies import make_policy
        from gandiva.server.app import Service, create_app
        from gandiva.server.store import Store

        self.store = Store(str(home / "gandiva.db"))
        self.backend = Driver(make_policy("gandiva:quantum=1"), home / "work", slots=2,
                              feedback_steps=20, zygote=zygote)
        self.service = Service(self.store, self.backend, home / "base")
        self.service.resume_unfinished()
        self.loop = threading.Thread(target=self.backend.run, kwargs={"until_idle": False})
        self.loop.start()
        self.client = TestClient(create_app(self.service))

    def crash(self) -> None:
        self.backend.stop()
        self.loop.join(timeout=60)
        self.service.close(timeout=30)

    def wait(self, get, ok, timeout=240):
        """``get()``, once ``ok`` holds of it: looked at again whenever the store is handed
        or takes a write (what the tests ask of the API comes from the store)."""
        last = []

        def holds() -> bool:
            last[:] = [get()]
            return ok(last[0])

        assert self.service.writer.wait(holds, timeout), f"still {last[0]!r} after {timeout} s"
        return last[0]


@pytest.fixture
def home(tmp_path):
    from gandiva.server.store import Store

    store = Store(str(tmp_path / "gandiva.db"))
    token = store.add_user("ada")
    base = tmp_path / "base" / "users" / "ada"
    base.mkdir(parents=True)
    shutil.copy(CNN, base / "cnn.py")
    store.engine.dispose()
    return tmp_path, {"Authorization": f"Bearer {token}"}


def sweep_spec(steps: int, rungs: list[int], **extra) -> dict:
    return {"name": "lr", "command": f"python cnn.py --steps {steps} --lr {{lr}} --seed 1",
            "space": {"lr": {"grid": LRS}}, "metric": "loss",
            "stop": {"rule": "asha", "rungs": rungs, "reduction": 2}, **extra}


def test_a_jobs_reported_values_are_served_as_curves_and_followed_from_a_step(zygote, home):
    path, auth = home
    up = Up(path, zygote)
    try:
        c = up.client
        r = c.post("/v1/jobs", json={"name": "one", "command": "python cnn.py --steps 150"},
                   headers=auth)
        job = r.json()["id"]
        up.wait(lambda: c.get(f"/v1/jobs/{job}", headers=auth).json()["state"],
             lambda s: s in TERMINAL)
        up.wait(lambda: c.get(f"/v1/jobs/{job}/metrics", headers=auth).json()["series"],
             lambda s: s.get("loss", [[0]])[-1][0] == 150, timeout=10)
        series = c.get(f"/v1/jobs/{job}/metrics", headers=auth).json()["series"]
        assert set(series) == {"loss", "accuracy"}  # cnn.py reports both
        loss = [s for s, _, _ in series["loss"]]
        assert loss == sorted(loss) and loss[0] == 1 and loss[-1] == 150
        assert [s for s, _, _ in series["accuracy"]] == [1, 51, 101]  # every 50 steps
        later = c.get(f"/v1/jobs/{job}/metrics?names=loss&after=100", headers=auth).json()
        assert set(later["series"]) == {"loss"}
        assert [s for s, _, _ in later["series"]["loss"]] == [s for s in loss if s > 100]
        # a step beyond the column's range is left out, not a batch the database refuses
        # (PostgreSQL's INTEGER), and cannot be asked for
        up.backend.on_points(up.backend.records[job], {"loss": [[2**31, 0.5], [151, 0.25]]})
        after = up.wait(lambda: c.get(f"/v1/jobs/{job}/metrics?after=150",
                                   headers=auth).json()["series"], bool, timeout=10)
        assert [[s, v] for s, v, _ in after["loss"]] == [[151, 0.25]]
        r = c.get(f"/v1/jobs/{job}/metrics?after={2**31}", headers=auth)
        assert r.status_code == 422 and "after" in r.text
        other = up.store.add_user("bob")
        assert c.get(f"/v1/jobs/{job}/metrics",
                     headers={"Authorization": f"Bearer {other}"}).status_code == 404
    finally:
        up.crash()


class Sleeping:
    """A sweep of four trials that sleep, on a server's parts (``Up``); ``report`` gives a
    trial's value at a step for it, so a test chooses the order in which values come in."""

    def __init__(self, home, zygote, **spec) -> None:
        path, self.auth = home
        (path / "base" / "users" / "ada" / "idle.py").write_text(
            "import time\ntime.sleep(300)\n")
        self.up = Up(path, zygote)
        self.c = self.up.client
        r = self.c.post("/v1/sweeps", headers=self.auth, json={
            "name": "idle", "trials": 4, "seed": 0, "command": "python idle.py {lr}",
            "space": {"lr": {"grid": [1, 2, 3, 4]}}, "metric": "loss", "mode": "min",
            "stop": {"rule": "asha", "rungs": [10, 20], "reduction": 2}, **spec})
        assert r.status_code == 201, r.text
        self.id, self.jobs = r.json()["id"], [t["job_id"] for t in r.json()["trials"]]

    def report(self, trial: int, loss: float, step: int = 10) -> None:
        """As the loop would; then what the sweep decided is stored."""
        self.up.backend.on_points(self.up.backend.records[self.jobs[trial]],
                                  {"loss": [[step, loss]]})
        assert self.up.service.flush(timeout=30)

    def get(self, path: str):
        return self.c.get(path, headers=self.auth).json()

    def trials(self) -> list[dict]:
        return self.get(f"/v1/sweeps/{self.id}")["trials"]

    def kinds(self, trial: int) -> list[str]:
        return [e["kind"] for e in self.get(f"/v1/jobs/{self.jobs[trial]}/events")]


def test_the_best_at_the_first_rung_leads_unsure_trials_wait_and_the_rest_resume_once_judged(
        zygote, home):
    """The best trial at the first rung, judged against enough others, runs above every other
    trial of the sweep (on devices of its own), and the lead moves when a better one comes.
    Until every trial has had its first judgement, a trial let through at the first rung for
    want of company waits one priority below the sweep's (the trials not yet tried come
    first), and is judged again once others reach the rung; once every trial is judged, a
    trial let through at a later rung comes back to the sweep's priority."""
    s = Sleeping(home, zygote, priority=5)
    lead = 5 + 2 + 1  # above a trial promoted at both rungs
    try:
        def priorities() -> list[int]:
            return [s.get(f"/v1/jobs/{j}")["priority"] for j in s.jobs]

        assert priorities() == [5, 5, 5, 5]
        s.report(0, 1.0)  # first at the rung: continued, and waits; no lead without company
        assert priorities() == [4, 5, 5, 5]
        assert "sweep-waits" in s.kinds(0)
        s.report(1, 0.5)  # better than the one before: promoted, and it leads; trial 0,
        # judged again against it, is paused (held, it keeps its priority)
        assert [t["decision"] for t in s.trials()][:2] == ["paused", "promoted"]
        s.report(2, 3.0)  # paused
        assert priorities() == [4, lead, 5, 5]
        # alone at the second rung, trial 1 is let through for want of company; the first
        # rung's values keep it in the lead
        s.report(1, 0.4, step=20)
        assert [t["decision"] for t in s.trials()][:2] == ["paused", "continued"]
        assert priorities() == [4, lead, 5, 5]
        assert "sweep-waits" not in s.kinds(1) and "sweep-leads" in s.kinds(1)
        s.report(3, 0.2)  # the best at the first rung: it leads; every trial is judged now
        assert priorities() == [4, 5, 5, lead]
        assert s.kinds(1).index("sweep-leads") < s.kinds(1).index("sweep-resumes")
        assert [t["decision"] for t in s.trials()] == \
            ["paused", "continued", "paused", "promoted"]
    finally:
        s.up.crash()


def test_a_members_sweep_raises_its_trials_no_higher_than_the_ceiling(zygote, home):
    """Rungs order a sweep's own trials: a member's sweep at 49 leads at 50 (the ceiling),
    not at 52, and no member's sweep starts above it."""
    s = Sleeping(home, zygote, priority=49)
    try:
        s.report(0, 1.0)
        s.report(1, 0.5)  # promoted, and it leads: 49 + 2 + 1, clamped
        assert [s.get(f"/v1/jobs/{j}")["priority"] for j in s.jobs] == [48, 50, 49, 49]
        r = s.c.post("/v1/sweeps", headers=s.auth, json={
            "name": "high", "trials": 1, "command": "python idle.py {lr}", "priority": 51,
            "space": {"lr": {"grid": [1]}}, "metric": "loss"})
        assert r.status_code == 403 and "priority: 51 is above 50" in r.json()["detail"]
    finally:
        s.up.crash()


def test_an_outranked_trial_is_paused_promoted_when_later_values_put_it_on_top_then_stopped(
        zygote, home):
    """ASHA pauses, it does not stop at once: a trial outranked by the few values its rung had
    is held (its device freed), goes on when later values put it in the top, and is stopped
    only once nothing of its sweep runs or waits to run."""
    s = Sleeping(home, zygote)
    try:
        def state(trial: int) -> str:
            return s.get(f"/v1/jobs/{s.jobs[trial]}")["state"]

        s.report(0, 1.0)  # alone at the rung: continued
        s.report(1, 2.0)  # #2 of 2, the top 1 goes on: paused; trial 0, judged again
        assert [t["decision"] for t in s.trials()][:2] == ["promoted", "paused"]
        s.up.wait(lambda: state(1), lambda st: st == "held")  # its device is free
        s.report(2, 3.0)  # #3 of 3: paused
        s.report(3, 4.0)  # #4 of 4: paused; and now the top 2 of 4 includes trial 1
        assert [t["decision"] for t in s.trials()] == \
            ["promoted", "promoted", "paused", "paused"]
        s.up.wait(lambda: state(1), lambda st: st in ("queued", "running"))  # back from its hold
        assert "sweep-unpaused" in s.kinds(1)
        assert state(2) != "cancelled"  # not while trials 0 and 1 may still put it on
        for j in s.jobs[:2]:
            assert s.c.post(f"/v1/jobs/{j}/cancel", headers=s.auth).status_code == 200
        done = s.up.wait(s.trials, lambda ts: all(t["state"] in TERMINAL for t in ts))
        assert [t["decision"] for t in done][2:] == ["stopped", "stopped"]
        assert done[2]["state"] == "cancelled"
        assert "rung 10: loss 3, #3 of 4 (not in the top 2 of 4)" in done[2]["reason"]
    finally:
        s.up.crash()


def test_a_trial_let_through_alone_is_judged_again_when_others_reach_its_rung(zygote, home):
    """Which trials a sweep pauses does not hang on the order they reach a rung: trials that
    arrive worst first are each the best so far, yet the first, let through for want of
    company, is judged again as the others come, and paused."""
    s = Sleeping(home, zygote)
    try:
        s.report(0, 4.0)  # alone: continued
        assert [t["decision"] for t in s.trials()][0] == "continued"
        for trial, loss in ((1, 3.0), (2, 2.0), (3, 1.0)):  # each better than all before
            s.report(trial, loss)
        assert [t["decision"] for t in s.trials()] == \
            ["paused", "promoted", "promoted", "promoted"]
        assert "sweep-paused" in s.kinds(0)
        paused = [e for e in s.get(f"/v1/jobs/{s.jobs[0]}/events") if e["kind"] == "sweep-paused"]
        assert "rung 10: loss 4, #2 of 2" in str(paused[0])
    finally:
        s.up.crash()


def test_a_sweep_request_of_a_billion_grid_points_builds_one_trial(zygote, home):
    """Through the API, as a client sends it: the server builds the trial, not the grid."""
    path, auth = home
    up = Up(path, zygote)
    try:
        spec = {"name": "g", "command": "python cnn.py --steps 1 --lr {p0}", "metric": "loss",
                "trials": 1, "space": {f"p{k}": {"grid": list(range(10))} for k in range(9)}}
        with Held() as held:
            r = up.client.post("/v1/sweeps", json=spec, headers=auth)
        assert r.status_code == 201, r.text
        assert len(r.json()["trials"]) == 1 and held.mib < 20  # one point, not ~100 GB
    finally:
        up.crash()


def test_a_sweep_stops_trials_at_its_rungs_promotes_the_rest_and_names_the_best(zygote, home):
    path, auth = home
    up = Up(path, zygote)
    try:
        c = up.client
        # (1200 steps: the two that learn pass the first rung, one the second; a trial
        # judged out is held long before its end)
        r = c.post("/v1/sweeps", json=sweep_spec(1200, [40, 120]), headers=auth)
        assert r.status_code == 201, r.text
        sweep = r.json()
        assert [t["params"]["lr"] for t in sweep["trials"]] == LRS
        jobs = c.get("/v1/jobs", params={"label": f"sweep={sweep['id']}"}, headers=auth).json()
        assert len(jobs) == 4  # ordinary jobs, with the sweep's label
        sweep = up.wait(lambda: c.get(f"/v1/sweeps/{sweep['id']}", headers=auth).json(),
                     lambda s: all(t["state"] in TERMINAL for t in s["trials"]))
        stopped = [t for t in sweep["trials"] if t["decision"] == "stopped"]
        assert stopped, sweep
        for t in stopped:
            at = max(t["rungs"], key=int)
            assert t["state"] == "cancelled" and f"rung {at}:" in t["reason"], t
            events = c.get(f"/v1/jobs/{t['job_id']}/events", headers=auth).json()
            kinds = [e["kind"] for e in events]
            assert "sweep-stopped" in kinds and kinds[-1] == "cancelled"
            paused = [e["data"]["why"] for e in events if e["kind"] == "sweep-paused"]
            assert paused, kinds
            if "once others reached the rung" not in paused[-1]:
                assert t["step"] < 1200  # judged out on coming to its rung: held there,
            # long before its end; one let through for want of company runs on (ASHA: the
            # first there goes on) and may end its steps before the others catch it up
        for t in sweep["trials"]:
            if t["decision"] == "promoted":  # one more priority for each rung passed (the
                # lead at the first rung: one above them all, while it ran)
                # (its last priority event: a sweep-continued may follow the lead's)
                set_by = [e["kind"] for e in
                          c.get(f"/v1/jobs/{t['job_id']}/events", headers=auth).json()
                          if "to" in e["data"]]
                led = set_by[-1] == "sweep-leads"
                assert c.get(f"/v1/jobs/{t['job_id']}", headers=auth).json()["priority"] \
                    == (2 + 1 if led else len(t["rungs"]))
        # the trials that barely learn never win; the best is one that learns
        assert sweep["best"] is not None and sweep["best"]["params"]["lr"] in (0.05, 0.1)
        from gandiva.job import checkpoint  # the best trial's final state, one field away
        best = Path(sweep["best"]["checkpoint"])
        assert best.exists() and checkpoint.steps(best.parent)[0] == 1200
        assert all(t["decision"] == "stopped" or t["state"] == "done"
                   for t in sweep["trials"])  # paused trials are stopped at the end
        bob = {"Authorization": f"Bearer {up.store.add_user('bob')}"}  # another user's sweep
        assert c.get(f"/v1/sweeps/{sweep['id']}", headers=bob).status_code == 404
        assert c.get("/v1/sweeps", headers=bob).json() == []
        listed = c.get("/v1/sweeps", params={"brief": "true"}, headers=auth).json()
        assert [s["id"] for s in listed] == [sweep["id"]] and listed[0]["trials"] == []
        assert c.get("/v1/sweeps", headers=auth).json()[0]["trials"] == sweep["trials"]
    finally:
        up.crash()


def test_a_sweep_survives_a_server_restart_with_its_rungs_and_decisions(zygote, home):
    path, auth = home
    up = Up(path, zygote)
    # (the second rung 560 mini-batches, 2 s or more, past the first: none reaches it
    # before the crash)
    sid = up.client.post("/v1/sweeps", json=sweep_spec(1200, [40, 600]),
                         headers=auth).json()["id"]
    before = up.wait(lambda: up.client.get(f"/v1/sweeps/{sid}", headers=auth).json(),
                  lambda s: sum(len(t["rungs"]) for t in s["trials"]) >= 2)
    up.crash()  # mid-sweep: trials at rung 40 judged, none at 600 yet
    up = Up(path, zygote)
    try:
        c = up.client
        after = up.wait(lambda: c.get(f"/v1/sweeps/{sid}", headers=auth).json(),
                     lambda s: all(t["state"] in TERMINAL for t in s["trials"]), timeout=300)
        was = {t["trial"]: t for t in before["trials"]}
        for t in after["trials"]:
            for rung, value in was[t["trial"]]["rungs"].items():
                assert t["rungs"][rung] == value  # what was judged stays judged
            if was[t["trial"]]["decision"] == "stopped":
                assert t["state"] == "cancelled"  # a stopped trial does not come back
        assert any("600" in t["rungs"] for t in after["trials"])  # judged after the restart
        assert after["best"] is not None
    finally:
        up.crash()


def test_an_optuna_studys_pruned_trials_are_stopped_by_the_scheduler(tmp_path):
    optuna = pytest.importorskip("optuna")
    from serving import running

    from gandiva.client import Client, Settings
    from gandiva.sweep.optuna_bridge import optimize

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with running(tmp_path) as srv:
        base = srv.user_dir("alice")
        base.mkdir(parents=True, exist_ok=True)
        shutil.copy(CNN, base / "cnn.py")
        client = Client(Settings(srv.url, srv.tokens["alice"]))

        def job(trial):
            lr = trial.suggest_float("lr", 1e-5, 0.2, log=True)
            return {"name": f"t{trial.number}",
                    "command": f"python cnn.py --steps 1500 --lr {lr} --seed 1"}

        # enqueued rates make the outcome certain: two that learn (no mini-batch's loss above
        # 0.5 after step 300), two that barely move (above 2.2), and the pruner stops any
        # trial whose latest loss is above 2.1 after 300 steps. (0.05 and 0.1 learn too, but
        # a single mini-batch's loss of theirs passes 2.1 now and then, and the pruner
        # sees single values.)
        study = optuna.create_study(
            study_name="cnn lr", sampler=optuna.samplers.RandomSampler(seed=0),
            pruner=optuna.pruners.ThresholdPruner(upper=2.1, n_warmup_steps=300))
        for lr in (0.00001, 0.02, 0.0001, 0.03):
            study.enqueue_trial({"lr": lr})
        optimize(study, job, n_trials=4, client=client, metric="loss", parallel=4,
                 poll_s=0.5)
        states = {t.params["lr"]: t.state for t in study.trials}
        pruned = optuna.trial.TrialState.PRUNED
        assert states == {0.00001: pruned, 0.0001: pruned,
                          0.02: optuna.trial.TrialState.COMPLETE,
                          0.03: optuna.trial.TrialState.COMPLETE}
        jobs = {j["labels"]["optuna-trial"]: j for j in client.jobs(
            labels={"optuna-study": "cnn-lr"})}
        for t in study.trials:
            j = jobs[str(t.number)]
            if t.state == pruned:  # stopped by the scheduler long before its end
                assert j["state"] == "cancelled" and j["steps"] < 1500, j
            else:  # the value told is the job's last loss
                assert j["state"] == "done"
                assert t.value == client.metrics(j["id"], ["loss"])["loss"][-1][1]
                assert max(t.intermediate_values) == 1500
        assert study.best_params["lr"] in (0.02, 0.03)


def test_a_job_sends_what_its_turn_measured_before_it_is_suspended():
    import gandiva.job as gj

    ours, theirs = socket.socketpair()
    job = gj.Job(env={"GANDIVA_CONTROL_FD": str(theirs.detach()), "GANDIVA_JOB_ID": "j"})
    for step in range(5):  # well inside one report window: nothing sent yet
        job.report(samples=1, loss=float(step))
        if step < 4:
            job.next_command()
    ours.sendall(wire.encode(wire.Suspend()) + wire.encode(wire.Resume("cpu")))
    job.boundary()  # the turn ends here: suspended, then resumed at once
    ours.settimeout(5)
    data = b""
    while b'"resumed"' not in data:
        data += ours.recv(65536)
    reports = [wire.report(line) for line in data.splitlines()]
    kinds = [type(r).__name__ for r in reports if not isinstance(r, wire.Hello)]
    assert kinds == ["Profile", "Suspended", "Resumed"]
    profile = next(r for r in reports if isinstance(r, wire.Profile))
    assert profile.series["loss"] == [[s + 1, float(s)] for s in range(5)]
    ours.close()
