"""The command line: what `gandiva simulate`, `traces` and `policies` print, write and refuse."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gandiva import cli
from gandiva.cli import app
from gandiva.sim.perf import default_perf_model
from gandiva.sim.run import TIMELINE_MAX_JOBS
from gandiva.traces import bundled_traces
from gandiva.traces.bundled import BUNDLED

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRICS = {
    "mean_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "makespan_s", "utilization",
    "mean_queue_s", "mean_first_feedback_s", "suspends", "migrations", "packs", "max_ftf_rho",
    "jobs", "finished",
}
COUNTS = ("suspends", "migrations", "packs", "jobs", "finished")
HEADER = "job_id,submit_time,num_gpus,duration,model\n"
THREE_JOBS = HEADER + "a,0,1,100,resnet50\nb,10,2,50,resnet50\nc,20,1,30,resnet50\n"


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def read_json(path: Path) -> dict:
    """Standard JSON only: NaN or Infinity would break other readers."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path.name} holds non-standard JSON constant {constant}")
    return json.loads(path.read_text(), parse_constant=refuse)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- every bundled trace ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(bundled_traces()))
def test_simulate_every_bundled_trace_writes_the_documented_json(name, tmp_path):
    out = tmp_path / "m.json"
    # gandiva with a 600 s quantum: on the Gavel-Philly traces, gangs time-slice with jobs
    # lasting months, and 60 s slices make millions of switches (minutes of simulation)
    res = invoke("simulate", name, "--policy", "fifo,las,gandiva:quantum=600",
                 "--cluster", "25x4", "--jobs", 150, "--json", out)
    assert res.exit_code == 0, res.output
    data = read_json(out)
    assert {"policies", "trace", "cluster"} <= set(data)
    assert data["trace"] == name and data["cluster"] == "25x4"
    assert list(data["policies"]) == ["fifo", "las", "gandiva:quantum=600"]
    expected_jobs = min(150, BUNDLED[name].jobs)
    printed = flat(res.stdout)
    for policy, s in data["policies"].items():
        assert METRICS <= set(s), f"{policy}: missing {METRICS - set(s)}"
        assert s["jobs"] == expected_jobs or "left out" in printed
        assert s["finished"] == s["jobs"] or "never finished" in printed
        assert all(isinstance(s[k], int) and s[k] >= 0 for k in COUNTS)
        assert 0.0 < s["utilization"] <= 1.0
        assert s["makespan_s"] > 0
        assert 0 < s["p50_jct_s"] <= s["p95_jct_s"] <= s["p99_jct_s"]
        assert s["mean_queue_s"] >= 0 and s["mean_first_feedback_s"] > 0
        assert s["max_ftf_rho"] > 0
    assert data["policies"]["fifo"]["suspends"] == 0  # FIFO never preempts


def test_same_seed_gives_the_same_metrics(tmp_path):
    runs = []
    for i in range(2):
        out = tmp_path / f"{i}.json"
        res = invoke("simulate", "tiresias-60", "--seed", 3, "--json", out)
        assert res.exit_code == 0, res.output
        data = read_json(out)
        for s in data["policies"].values():
            s.pop("wall_s", None)
        runs.append(data)
    assert runs[0] == runs[1]


# ---- the report ---------------------------------------------------------------------------

def images_of(page: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', page.read_text())


def test_report_references_valid_pngs_with_a_gpu_timeline_per_policy(tmp_path):
    out = tmp_path / "report"
    res = invoke("simulate", "tiresias-60", "--policy", "fifo,las", "--cluster", "4x4",
                 "--out", out)
    assert res.exit_code == 0, res.output
    page = out / "report.html"
    html = page.read_text()
    assert "<td>fifo</td>" in html and "<td>las</td>" in html
    images = images_of(page)
    assert {"jct_cdf.png", "utilization_queue.png"} <= set(images)
    assert len([i for i in images if i.startswith("timeline")]) == 2
    for name in images:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 1000, name


def test_report_of_a_big_run_has_no_gpu_timeline(tmp_path):
    out = tmp_path / "report"
    res = invoke("simulate", "gavel-philly-0e4a51", "--policy", "fifo",
                 "--jobs", TIMELINE_MAX_JOBS + 1, "--out", out)
    assert res.exit_code == 0, res.output
    images = images_of(out / "report.html")
    assert images and not [i for i in images if i.startswith("timeline")]
    assert all((out / i).read_bytes().startswith(PNG_MAGIC) for i in images)


# ---- bad input: exit 2, a message naming the problem, nothing written ---------------------

BAD_ROWS = [
    (HEADER + "a,0,1,100,resnet50\nb,10,x,50,resnet50\n", "line 3, field 'num_gpus'", "'x'"),
    (HEADER + "a,0,1,100,resnet50\nb,,1,50,resnet50\n", "line 3, field 'submit_time'",
     "required"),
    (HEADER + "a,0,1,-5,resnet50\n", "line 2, field 'duration'", "'-5'"),
    ("job_id,submit_time,num_gpus,duration,mini_batches\na,0,1,100,\nb,1,1,50,20\n",
     "line 3, field 'duration'", "both"),
    (HEADER + "a,0,1,100,resnet50\na,1,1,50,resnet50\n", "line 3, field 'job_id'", "duplicate"),
    ("job_id,submit_time,num_gpus,duration,colour\na,0,1,100,red\n", "line 1, field 'colour'",
     "unknown field"),
]


@pytest.mark.parametrize(("body", "where", "what"), BAD_ROWS)
def test_malformed_csv_names_file_line_and_field(tmp_path, body, where, what):
    trace = write(tmp_path / "bad.csv", body)
    out = tmp_path / "m.json"
    res = invoke("simulate", trace, "--json", out, "--out", tmp_path / "report")
    assert res.exit_code == 2
    message = flat(res.stderr)
    assert f"bad.csv {where}" in message and what in message
    assert not out.exists() and not (tmp_path / "report").exists()


BAD_OPTIONS = [
    (["no-such-trace"], ["no-such-trace", "neither a bundled trace"]),
    (["pollux1"], ["did you mean", "pollux-1"]),
    (["tiresias-60", "--policy", "fifo,nope"], ["unknown policy 'nope'", "fifo", "las"]),
    (["tiresias-60", "--cluster", "4"], ["cluster", "'4'", "SERVERSxGPUS"]),
    (["tiresias-60", "--cluster", "2x4:Z9"], ["unknown GPU type 'Z9'"]),
    (["tiresias-60", "--gpu-type", "Z9"], ["unknown GPU type 'Z9'"]),
    (["tiresias-60", "--window", "abc"], ["--window", "'abc'", "START:END"]),
    (["tiresias-60", "--window", "1:2:3"], ["--window", "'1:2:3'"]),
    (["tiresias-60", "--window", "10:5"], ["window start must be before its end"]),
    (["tiresias-60", "--window", "1e9:2e9"], ["keeps no job"]),
    (["tiresias-60", "--policy", "fifo:colour=red"], ["no parameter 'colour'", "backfill"]),
    (["tiresias-60", "--policy", "fifo:backfill_depth=many"], ["backfill_depth", "'many'"]),
    (["tiresias-60", "--jobs", "0"], ["jobs", "positive"]),
    (["tiresias-60", "--mix", "nope"], ["mix 'nope'"]),
]


@pytest.mark.parametrize(("args", "fragments"), BAD_OPTIONS,
                         ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_option_exits_2_naming_the_problem_and_writes_nothing(tmp_path, args, fragments):
    out = tmp_path / "m.json"
    res = invoke("simulate", *args, "--json", out)
    assert res.exit_code == 2, res.output
    message = flat(res.stderr)
    assert message.startswith("error:")
    for fragment in fragments:
        assert fragment in message
    assert not out.exists()
    assert "Traceback" not in res.output


def test_unknown_model_in_a_trace_exits_2_and_writes_nothing(tmp_path):
    trace = write(tmp_path / "models.csv", HEADER + "a,0,1,100,nosuchmodel\n")
    out = tmp_path / "m.json"
    res = invoke("simulate", trace, "--json", out)
    assert res.exit_code == 2
    assert "nosuchmodel" in flat(res.stderr)
    assert not out.exists()


def test_unknown_model_message_names_file_job_and_field(tmp_path):
    # a path longer than a terminal line (pytest-xdist's are) is printed whole, to copy
    where = tmp_path / ("long-folder-name-" * 6)
    where.mkdir()
    trace = write(where / "models.csv", HEADER + "a,0,1,100,resnet50\nb,5,1,100,nosuchmodel\n")
    message = invoke("simulate", trace).stderr
    assert "'nosuchmodel'" in message
    assert f"{trace}: job 'b', field 'model'" in message


@pytest.mark.parametrize("case", ["policy", "csv"])
def test_bad_input_with_brackets_is_reported_verbatim(tmp_path, case):
    if case == "policy":
        args, shown = ["tiresias-60", "--policy", "[/x]"], "'[/x]'"
    else:
        trace = write(tmp_path / "br.csv", HEADER + "a,0,[b]2,100,resnet50\n")
        args, shown = [trace], "'[b]2'"
    res = invoke("simulate", *args)
    assert res.exit_code == 2
    assert shown in flat(res.stderr)


def test_jobs_too_big_for_the_cluster_are_noted(tmp_path):
    trace = write(tmp_path / "big.csv", HEADER + "a,0,2,100,resnet50\nb,0,1,100,resnet50\n")
    out = tmp_path / "m.json"
    res = invoke("simulate", trace, "--policy", "fifo", "--cluster", "1x1", "--json", out)
    assert res.exit_code == 0, res.output
    assert "1 jobs ask for more GPUs than the cluster's 1; left out" in flat(res.stdout)
    fifo = read_json(out)["policies"]["fifo"]
    assert fifo["jobs"] == fifo["finished"] == 1


def test_json_tells_of_jobs_left_out(tmp_path):
    trace = write(tmp_path / "big.csv", HEADER + "a,0,2,100,resnet50\nb,0,1,100,resnet50\n")
    out = tmp_path / "m.json"
    invoke("simulate", trace, "--policy", "fifo", "--cluster", "1x1", "--json", out)
    data = read_json(out)
    assert data["trace_jobs"] == 2 and data["policies"]["fifo"]["left_out"] == 1
    assert any("left out" in n for n in data["notes"])


# ---- listings -----------------------------------------------------------------------------

def test_traces_lists_every_bundled_trace(monkeypatch):
    monkeypatch.setattr(cli.console, "width", 200)  # a narrow terminal would wrap the names
    res = invoke("traces")
    assert res.exit_code == 0
    listed = set(re.findall(r"[\w.-]+", res.stdout))
    missing = set(bundled_traces()) - listed
    assert not missing


def test_policies_lists_the_baselines_with_their_parameters():
    res = invoke("policies")
    assert res.exit_code == 0
    text = flat(res.stdout)
    assert re.search(r"\bfifo backfill=False backfill_depth=256\b", text)
    assert re.search(r"\blas queue_limits=\(3600\.0, 36000\.0\)", text)


# ---- teams: shares reported ---------------------------------------------------------------

def test_simulate_with_a_teams_file_reports_each_teams_share_and_a_bad_one_names_the_field(
        tmp_path):
    jobs = "job_id,submit_time,num_gpus,duration,model,user\n" + "".join(
        f"a{i},0,1,7200,resnet50,alice\n" for i in range(8)) + "b,60,1,7200,resnet50,bob\n"
    trace = write(tmp_path / "ab.csv", jobs)
    teams = write(tmp_path / "teams.yaml", "teams: {red: {tickets: 1}, blue: {}}\n"
                  "users: {alice: red, bob: {team: blue, tickets: 1}}\n")
    out = tmp_path / "m.json"
    res = invoke("simulate", trace, "--policy", "gandiva,gandiva:fair", "--cluster", "1x4",
                 "--teams", teams, "--json", out)
    assert res.exit_code == 0, res.output
    assert "shares: each team" in flat(res.stdout) and "blue 1.0" in flat(res.stdout)
    fair = read_json(out)["policies"]["gandiva:fair"]["fairness"]
    unfair = read_json(out)["policies"]["gandiva"]["fairness"]
    assert set(fair["teams"]) == {"red", "blue"}
    assert fair["within"] > unfair["within"]
    blue = fair["teams"]["blue"]
    assert blue["received_gpu_h"] == pytest.approx(blue["fair_gpu_h"], rel=0.05)
    for text, says in (("teams: {red: {tickets: 0}}", "teams.red.tickets: 0"),
                       ("teams: {red: {}}\nusers: {alice: green}", "users.alice.team: no team"),
                       ("teams: {red: {quota: 2}}", "teams.red: a mapping of tickets")):
        res = invoke("simulate", trace, "--policy", "gandiva:fair", "--cluster", "1x4",
                     "--teams", write(tmp_path / "bad.yaml", text))
        assert res.exit_code != 0 and says in flat(res.output), res.output


# ---- our own CSV format, numbers by hand --------------------------------------------------

def test_own_csv_trace_gives_hand_computed_metrics(tmp_path):
    trace = write(tmp_path / "three.csv", THREE_JOBS)
    out = tmp_path / "sub" / "m.json"
    res = invoke("simulate", trace, "--policy", "fifo,fifo:backfill", "--cluster", "1x2",
                 "--gpu-type", "V100", "--json", out)
    assert res.exit_code == 0, res.output
    data = read_json(out)
    assert data["trace"] == "three"
    step = default_perf_model().step_time("resnet50", "V100")
    fifo, backfill = data["policies"]["fifo"], data["policies"]["fifo:backfill"]
    # strict FIFO on 2 GPUs: a 0-100 on one GPU; b (2 GPUs) 100-150; c waits behind b, 150-180
    assert fifo["jobs"] == fifo["finished"] == 3
    assert fifo["mean_jct_s"] == pytest.approx((100 + 140 + 160) / 3)
    assert fifo["p50_jct_s"] == pytest.approx(140)
    assert fifo["makespan_s"] == pytest.approx(180)
    assert fifo["utilization"] == pytest.approx((100 + 2 * 50 + 30) / (2 * 180))
    assert fifo["mean_queue_s"] == pytest.approx((0 + 90 + 130) / 3)
    # 100 steps each; b's are 2-GPU steps: 200 mini-batches at the 2-GPU throughput
    two = 200 / default_perf_model().throughput("resnet50", "V100", 2)
    assert fifo["mean_first_feedback_s"] == pytest.approx((0 + 90 + 130 + 200 * step + two) / 3)
    # c lived 20-180 with 370 job-seconds in the system: 2.3 jobs on average, 1/2.3 of 2 GPUs
    assert fifo["max_ftf_rho"] == pytest.approx(160 / (30 * (370 / 160) / 2))
    assert (fifo["suspends"], fifo["migrations"], fifo["packs"]) == (0, 0, 0)
    # backfill: c jumps ahead onto the idle GPU at 20
    assert backfill["mean_jct_s"] == pytest.approx((100 + 140 + 30) / 3)
    assert backfill["makespan_s"] == pytest.approx(150)


# ---- the installed command ----------------------------------------------------------------

GANDIVA = Path(sys.executable).with_name("gandiva")


@pytest.mark.skipif(not GANDIVA.exists(), reason="gandiva console script not installed")
def test_installed_command_exits_2_on_a_bad_row_without_traceback(tmp_path):
    trace = write(tmp_path / "bad.csv", HEADER + "a,0,1,100,resnet50\nb,10,x,50,resnet50\n")
    out = tmp_path / "m.json"
    proc = subprocess.run([str(GANDIVA), "simulate", str(trace), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "bad.csv line 3, field 'num_gpus'" in flat(proc.stderr)
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.skipif(not GANDIVA.exists(), reason="gandiva console script not installed")
def test_installed_command_runs_a_trace_file(tmp_path):
    trace = write(tmp_path / "three.csv", THREE_JOBS)
    out = tmp_path / "m.json"
    proc = subprocess.run([str(GANDIVA), "simulate", str(trace), "--policy", "fifo",
                           "--cluster", "1x2", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert math.isclose(read_json(out)["policies"]["fifo"]["mean_jct_s"], 400 / 3)


def test_the_simulator_and_the_cli_client_import_neither_torch_nor_the_server_stack():
    """What `pip install gandiva` (no extras) must be able to run."""
    import subprocess
    import sys

    probe = ("import sys, gandiva.cli, gandiva.sim.run, gandiva.traces, gandiva.report, "
             "gandiva.client, gandiva.server.jobspec\n"
             "gandiva.server.jobspec.parse('name: x\\ncommand: python t.py\\ngpus: 2')\n"
             "heavy = ('torch', 'fastapi', 'sqlalchemy', 'uvicorn', 'alembic', "
             "'prometheus_client', 'ray', 'psycopg', 'lightning', 'transformers')\n"
             "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_server_logs_as_json_are_one_object_per_line_with_level_and_logger():
    import io
    import logging
    import logging.config

    from gandiva.cli import log_config

    config = log_config("info", as_json=True)
    stream = io.StringIO()
    config["handlers"]["main"]["stream"] = stream
    loggers = [logging.getLogger(name) for name in config["loggers"]]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    try:
        logging.config.dictConfig(config)
        logging.getLogger("gandiva.server").info("taking up %d jobs", 3)
        logging.getLogger("gandiva.server").debug("not at info")
    finally:  # the rest of the test process logs as before
        for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "info", "gandiva.server", "taking up 3 jobs")


def test_the_demo_runs_real_jobs_under_each_policy_and_gandiva_takes_turns(tmp_path):
    """The README's first command, small: real PyTorch jobs of mixed lengths arriving over
    time, more jobs than slots, under fifo and gandiva; every job ends, and a summary per
    policy is written."""
    out = tmp_path / "demo.json"
    proc = subprocess.run([str(GANDIVA), "demo", "--jobs", "4", "--slots", "2", "--steps",
                           "500", "--arrival-gap", "0.5", "--quantum", "1", "--out",
                           str(tmp_path / "run"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = json.loads(out.read_text())
    assert set(summaries) == {"fifo", "gandiva:quantum=1"}
    for s in summaries.values():
        assert s["jobs"] == s["finished"] == 4 and s["failed"] == 0
        assert all(loss is not None for loss in s["final_losses"].values())
        assert 0 < s["max_first_feedback_s"] <= s["makespan_s"]  # every job gave feedback
    fifo, gandiva = summaries["fifo"], summaries["gandiva:quantum=1"]
    assert fifo["suspends"] == 0 < gandiva["suspends"]  # 2 short jobs behind 2 long: turns
    assert "against fifo, and why" in proc.stdout  # each metric read: wins or pays, and why
    assert len(list((tmp_path / "run").glob("timeline_*.png"))) == 2  # one per policy


def test_the_demo_submits_mixed_lengths_over_time_and_reads_each_metric_both_ways():
    """Two long jobs first, then short ones, a gap apart; a metric reads as a win where
    gandiva's value is better and as a price where it is worse."""
    from gandiva.demo import METRICS, DemoConfig, reading, search

    cfg = DemoConfig(steps=1000, arrival_gap=3.0)
    jobs = search(cfg, 7)
    assert [s.mini_batches for s, _ in jobs] == [1000, 600, 100, 50, 200, 50, 1000]
    assert [s.submit_time for s, _ in jobs] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0]
    assert cfg.feedback_steps < min(s.mini_batches for s, _ in jobs)  # every job gives one
    jct = next(m for m in METRICS if m.key == "mean_jct_s")
    assert reading(jct, {"mean_jct_s": 30.0}, {"mean_jct_s": 24.0}).startswith("wins 25%")
    assert reading(jct, {"mean_jct_s": 20.0}, {"mean_jct_s": 30.0}).startswith("pays 1.5x")
    util = next(m for m in METRICS if m.key == "utilization")
    assert reading(util, {"utilization": 0.9}, {"utilization": 0.8}).startswith("pays")
