"""Trace loaders: every bundled trace on its real file, our own format, errors, mixes, selection."""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter
from datetime import datetime
from functools import cache
from importlib.resources import files
from pathlib import Path

import pytest

from gandiva.spec import JobSpec, Trace
from gandiva.traces import (
    FORMATS,
    MIXES,
    TraceError,
    assign_models,
    bundled_traces,
    detect_format,
    load_trace,
)
from gandiva.traces.bundled import BUNDLED
from gandiva.traces.mix import GAVEL_JOB_TYPES

DATA = Path(str(files("gandiva.traces").joinpath("data")))
SHARED = Path("/work/shared/traces")

GAVEL_PHYSICAL = {
    "artifact_evaluation": 15,
    "debug": 14,
    "debug_v2": 14,
    "highmem_test": 8,
    "max_min_fairness": 96,
    "medium_test": 20,
    "minimize_makespan": 100,
    "small_test": 20,
}
GAVEL_PHILLY = {
    "0e4a51": 1181,
    "103959": 986,
    "11cb48": 2000,
    "23dbec": 9,
    "2869ce": 533,
    "51b7ef": 18,
    "6214e9": 2000,
    "6c71a0": 2000,
    "795a4c": 3,
    "7f04ca": 972,
    "925e2b": 4,
    "b436b2": 2000,
    "e13805": 607,
    "ed69ec": 951,
    "ee9e8c": 2000,
}
EXPECTED_JOBS = {
    "philly": 82_247,
    "chronus-mix1": 30_940 - 184,  # rows with num_gpu = 0 dropped
    "chronus-slo": 30_940 - 205,
    "tiresias-60": 60,
    **{f"gavel-{stem}": n for stem, n in GAVEL_PHYSICAL.items()},
    **{f"gavel-philly-{vc}": n for vc, n in GAVEL_PHILLY.items()},
    **{f"pollux-{n}": 160 for n in range(1, 9)},
    **{f"pollux-realistic-{n}": 160 for n in range(1, 9)},
    "alibaba-2023": 8_152 - 1_088 - 861,  # 0-GPU pods, then GPU pods never scheduled
}


@cache
def bundled(name: str) -> Trace:
    """Each bundled trace is read once per test session (philly alone takes most of a second)."""
    return load_trace(name)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- bundled traces, on the real files ---------------------------------------------------


def test_bundled_names_are_the_documented_ones() -> None:
    assert set(bundled_traces()) == set(EXPECTED_JOBS)
    assert all(description for description in bundled_traces().values())


@pytest.mark.parametrize("name", sorted(EXPECTED_JOBS))
def test_each_bundled_trace_loads_with_its_documented_job_count(name: str) -> None:
    trace = bundled(name)
    assert trace.name == name
    assert len(trace.jobs) == EXPECTED_JOBS[name] == BUNDLED[name].jobs
    assert trace.source
    assert len({job.id for job in trace.jobs}) == len(trace.jobs)
    assert all(job.model and job.num_gpus >= 1 and job.submit_time >= 0 for job in trace.jobs)
    assert all((job.duration is None) != (job.mini_batches is None) for job in trace.jobs)
    times = [job.submit_time for job in trace.jobs]
    assert times == sorted(times)


def test_philly_times_are_seconds_since_first_submission_and_users_are_vcs() -> None:
    trace = bundled("philly")
    assert trace.reference_gpu == "P100"
    assert trace.jobs[0].submit_time == 0
    last = datetime(2017, 12, 22, 8, 2, 11) - datetime(2017, 9, 4, 10, 30, 41)  # naive times
    assert trace.jobs[-1].submit_time == last.total_seconds()
    assert Counter(job.num_gpus for job in trace.jobs) == {
        1: 76_627,
        4: 1_870,
        2: 1_818,
        8: 1_643,
        16: 199,
        32: 67,
        12: 7,
        24: 7,
        64: 6,
        128: 3,
    }
    assert len({job.user for job in trace.jobs}) == 15
    assert all(job.user.startswith("vc_") for job in trace.jobs)
    with (DATA / "philly" / "philly.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert sum(job.duration or 0 for job in trace.jobs) == sum(float(r["duration"]) for r in rows)
    first_row = next(job for job in trace.jobs if job.id == "0")  # 2017-10-09 07:01:55,66.0,1
    assert (first_row.duration, first_row.num_gpus, first_row.user) == (66.0, 1, "vc_11cb48")
    paper_models = {m for models in MIXES["paper"]["models"].values() for m in models}
    assert {job.model for job in trace.jobs} <= paper_models


def test_chronus_times_are_minutes_converted_to_seconds() -> None:
    trace = bundled("chronus-mix1")
    first = next(job for job in trace.jobs if job.id == "0")
    # 0,vc_6214e9,1,8555,5049,vgg16,747,14,1105,10,0,strict
    assert first == JobSpec(
        id="0",
        submit_time=8555 * 60,
        num_gpus=1,
        model="vgg16",
        user="vc_6214e9",
        duration=747 * 60,
    )
    assert trace.reference_gpu == "P100"
    assert any("dropped 184 of 30940 rows" in note for note in trace.notes)
    assert {job.model for job in trace.jobs} == set(MIXES["chronus"]["models"]["all"])
    assert any("dropped 205 of 30940 rows" in note for note in bundled("chronus-slo").notes)


def test_tiresias_times_are_seconds_and_models_kept() -> None:
    trace = bundled("tiresias-60")
    assert trace.jobs[0] == JobSpec(id="0", submit_time=0, num_gpus=1, model="vgg19", duration=164)
    assert trace.jobs[1] == JobSpec(id="1", submit_time=30, num_gpus=8, model="vgg11", duration=147)
    assert Counter(job.num_gpus for job in trace.jobs) == {1: 30, 2: 10, 4: 10, 8: 10}
    assert not any("mix" in note for note in trace.notes)


def test_gavel_physical_cluster_row_becomes_a_mini_batch_job() -> None:
    trace = bundled("gavel-small_test")
    # Transformer (batch size 128), ..., 346 (steps), 2 (scale factor), 1 (priority), 0 (arrival)
    assert trace.jobs[0] == JobSpec(
        id="0",
        submit_time=0,
        num_gpus=2,
        model="Transformer (batch size 128)",
        mini_batches=346,
        priority=1,
    )
    assert trace.reference_gpu == "V100"


def test_gavel_philly_keeps_gpu_counts_missing_from_throughput_tables() -> None:
    counts: Counter[int] = Counter()
    for vc in GAVEL_PHILLY:
        counts.update(job.num_gpus for job in bundled(f"gavel-philly-{vc}").jobs)
    assert sum(counts.values()) == 15_264
    assert {7, 12, 16, 20, 24, 32, 64} <= set(counts)
    first = bundled("gavel-philly-11cb48").jobs[0]
    assert (first.model, first.mini_batches, first.submit_time) == (
        "Transformer (batch size 128)",
        13_407_515,
        0,
    )


def test_gavel_mix_is_exactly_the_job_types_of_the_gavel_traces() -> None:
    names = [f"gavel-{stem}" for stem in GAVEL_PHYSICAL] + [
        f"gavel-philly-{v}" for v in GAVEL_PHILLY
    ]
    found = {job.model for name in names for job in bundled(name).jobs}
    assert len(GAVEL_JOB_TYPES) == 26
    assert found == set(GAVEL_JOB_TYPES) == set(MIXES["gavel"]["models"]["all"])


def test_pollux_applications_get_the_documented_assumed_durations() -> None:
    tuned, realistic = bundled("pollux-1"), bundled("pollux-realistic-1")
    assert tuned.jobs[0] == JobSpec(
        id="cifar10-0", submit_time=107, num_gpus=6, model="cifar10", duration=1800
    )
    assert realistic.jobs[0].num_gpus == 1
    assert tuned.reference_gpu == "T4"
    assert any(note.startswith("ASSUMPTION") for note in tuned.notes)
    hours = {job.model: job.duration / 3600 for job in tuned.jobs if job.duration}
    assert hours == {
        "cifar10": 0.5,
        "ncf": 0.5,
        "deepspeech2": 2,
        "bert": 2,
        "yolov3": 6,
        "imagenet": 12,
    }


def test_alibaba_pods_drop_cpu_only_and_never_scheduled_and_count_fractions() -> None:
    trace = bundled("alibaba-2023")
    pod = next(job for job in trace.jobs if job.id == "openb-pod-0001")
    # openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061
    assert (pod.submit_time, pod.duration, pod.num_gpus, pod.user) == (
        427_061,
        12_902_960 - 427_061,
        1,
        "LS",
    )
    assert "openb-pod-0061" not in {job.id for job in trace.jobs}  # Pending, never scheduled
    notes = " | ".join(trace.notes)
    assert "dropped 1088 of 8152 rows: num_gpu = 0" in notes
    assert "dropped 861 of 8152 rows: empty scheduled_time" in notes
    assert "2573 pods request a fraction of one GPU" in notes
    assert "Weng et al." in notes
    assert Counter(job.num_gpus for job in trace.jobs) == {1: 6129, 8: 44, 2: 15, 4: 15}


def test_bundled_data_is_byte_identical_and_has_provenance() -> None:
    for sub in ("philly", "pollux", "chronus", "tiresias", "gavel", "alibaba"):
        assert (DATA / sub / "PROVENANCE.md").is_file()
    assert "ATC'23" in (DATA / "alibaba" / "PROVENANCE.md").read_text()
    if not SHARED.is_dir():
        pytest.skip("source traces not present")
    copies = {
        "philly/philly.csv": "pollux/traces/philly.csv",
        "chronus/trace_job_Philly_SLO.csv": "chronus/trace_job_Philly_SLO.csv",
        "gavel/msr_philly_per_vc/11cb48.trace": "gavel/msr_philly_per_vc/seed=0/11cb48.trace",
        "alibaba/openb_pod_list_default.csv": "alibaba-gpu-v2023/openb_pod_list_default.csv",
        "pollux/workloads-realistic/workload-8.csv": "pollux/workloads-realistic/workload-8.csv",
    }
    for ours, theirs in copies.items():
        assert _sha(DATA / ours) == _sha(SHARED / theirs), ours


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "name",
    [
        "philly",
        "chronus-mix1",
        "tiresias-60",
        "gavel-debug",
        "gavel-philly-795a4c",
        "pollux-3",
        "alibaba-2023",
    ],
)
def test_format_is_detected_from_the_file_itself(name: str) -> None:
    assert detect_format(DATA / BUNDLED[name].file) == BUNDLED[name].format


# --- our own format ----------------------------------------------------------------------

OWN_CSV = """\
job_id,submit_time,num_gpus,duration,mini_batches,model,user,priority,min_gpus,max_gpus
a,0,1,3600,,resnet50,alice,,,
b,30,4,,200000,lstm,bob,1,2,8
c,75.5,2,1800,,vgg16,,-2,,

"""
OWN_JOBS = [
    JobSpec(id="a", submit_time=0, num_gpus=1, model="resnet50", user="alice", duration=3600),
    JobSpec(
        id="b",
        submit_time=30,
        num_gpus=4,
        model="lstm",
        user="bob",
        mini_batches=200_000,
        priority=1,
        min_gpus=2,
        max_gpus=8,
    ),
    JobSpec(id="c", submit_time=75.5, num_gpus=2, model="vgg16", duration=1800, priority=-2),
]


def test_own_csv_reads_exact_jobs(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "mine.csv", OWN_CSV))
    assert trace.jobs == OWN_JOBS
    assert trace.name == "mine"
    assert trace.jobs[1].elastic and not trace.jobs[0].elastic


def test_own_csv_needs_only_the_required_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "short.csv", "num_gpus,job_id,submit_time,duration\n2,x,5,60\n")
    [job] = load_trace(path, mix="chronus", seed=3).jobs
    assert job == JobSpec(id="x", submit_time=5, num_gpus=2, model=job.model, duration=60)
    assert job.model in MIXES["chronus"]["models"]["all"]


@pytest.mark.parametrize("wrap", [False, True])
def test_own_json_reads_exact_jobs(tmp_path: Path, wrap: bool) -> None:
    jobs = [
        {
            "job_id": "a",
            "submit_time": 0,
            "num_gpus": 1,
            "duration": 3600,
            "model": "resnet50",
            "user": "alice",
        },
        {
            "job_id": "b",
            "submit_time": 30,
            "num_gpus": 4,
            "mini_batches": 200000,
            "model": "lstm",
            "user": "bob",
            "priority": 1,
            "min_gpus": 2,
            "max_gpus": 8,
        },
        {
            "job_id": "c",
            "submit_time": 75.5,
            "num_gpus": 2,
            "duration": 1800,
            "model": "vgg16",
            "user": None,
            "priority": -2,
        },
    ]
    path = write(tmp_path, "mine.json", json.dumps({"jobs": jobs} if wrap else jobs))
    assert load_trace(path).jobs == OWN_JOBS


# --- malformed input raises TraceError naming file, line and field -----------------------

HEADER = "job_id,submit_time,num_gpus,duration,mini_batches,min_gpus,max_gpus\n"
BAD_OWN_CSV = {
    # name: (file text, line, field, what the message says)
    "bad int": (HEADER + "a,0,1,60,,,\nb,0,x,60,,,\n", 3, "num_gpus", "positive integer, got 'x'"),
    "zero gpus": (HEADER + "a,0,0,60,,,\n", 2, "num_gpus", "positive integer, got '0'"),
    "missing column": ("job_id,num_gpus,duration\na,1,60\n", 1, "submit_time", "missing required"),
    "unknown column": (
        HEADER.strip() + ",colour\na,0,1,60,,,,red\n",
        1,
        "colour",
        "unknown field(s) ['colour']",
    ),
    "negative time": (HEADER + "a,-5,1,60,,,\n", 2, "submit_time", "non-negative number, got '-5'"),
    "nan time": (HEADER + "a,nan,1,60,,,\n", 2, "submit_time", "non-negative number"),
    "both kinds of work": (HEADER + "a,0,1,60,100,,\n", 2, "duration", "mini_batches, got both"),
    "no work": (HEADER + "a,0,1,,,,\n", 2, "duration", "mini_batches, got neither"),
    "zero duration": (HEADER + "a,0,1,0,,,\n", 2, "duration", "positive number, got '0'"),
    "fractional batches": (HEADER + "a,0,1,,2.5,,\n", 2, "mini_batches", "integer, got '2.5'"),
    "duplicate id": (
        HEADER + "a,0,1,60,,,\nb,1,1,60,,,\na,2,1,60,,,\n",
        4,
        "job_id",
        "duplicate job id 'a'",
    ),
    "min > max": (HEADER + "a,0,2,60,,8,4\n", 2, "min_gpus", "min_gpus <= num_gpus (2), got 8"),
    "max < num": (HEADER + "a,0,4,60,,2,3\n", 2, "max_gpus", "max_gpus >= num_gpus (4), got 3"),
    "short row": (HEADER + "a,0,1,60\n", 2, None, "expected 7 fields, got 4"),
    "empty id": (HEADER + ",0,1,60,,,\n", 2, "job_id", "required, got nothing"),
}


@pytest.mark.parametrize(("text", "line", "field", "says"), BAD_OWN_CSV.values(), ids=BAD_OWN_CSV)
def test_bad_own_csv_raises_trace_error(
    tmp_path: Path, text: str, line: int, field: str | None, says: str
) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    error = caught.value
    assert (Path(error.file).name, error.line, error.field) == ("bad.csv", line, field)
    assert says in str(error)
    assert str(error).startswith(f"bad.csv line {line}")


GOOD = {"job_id": "a", "submit_time": 0, "num_gpus": 1, "duration": 1}
BAD_OWN_JSON = {
    # name: (jobs, job index, field, what the message says)
    "float gpus": ([GOOD, {**GOOD, "job_id": "b", "num_gpus": 1.5}], 2, "num_gpus", "got 1.5"),
    "bool gpus": ([{**GOOD, "num_gpus": True}], 1, "num_gpus", "positive integer, got True"),
    "unknown key": ([{**GOOD, "gpu": "V100"}], 1, "gpu", "unknown field(s) ['gpu']"),
    "missing key": ([{"job_id": "a", "num_gpus": 1, "duration": 1}], 1, "submit_time", "required"),
    "not an object": ([["a", 0, 1, 1]], 1, None, "expected a JSON object"),
}


@pytest.mark.parametrize(("jobs", "line", "field", "says"), BAD_OWN_JSON.values(), ids=BAD_OWN_JSON)
def test_bad_own_json_raises_with_the_job_index_as_line(
    tmp_path: Path, jobs: list[object], line: int, field: str | None, says: str
) -> None:
    with pytest.raises(TraceError) as caught:
        load_trace(write(tmp_path, "bad.json", json.dumps(jobs)))
    assert (caught.value.line, caught.value.field) == (line, field)
    assert says in str(caught.value)


def test_bad_json_document_raises(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="invalid JSON"):
        load_trace(write(tmp_path, "broken.json", '[{"job_id": '))
    with pytest.raises(TraceError, match="expected a list of jobs"):
        load_trace(write(tmp_path, "other.json", '{"tasks": []}'))


def _real_rows(relative: str, count: int) -> list[str]:
    with (DATA / relative).open(newline="") as file:
        return [file.readline() for _ in range(count)]


def test_philly_error_message_names_file_line_and_field(tmp_path: Path) -> None:
    lines = _real_rows("philly/philly.csv", 18)  # header + 17 good rows
    lines[16] = "2017-10-09 07:01:55,66.0,x,66.0,11cb48\n"  # line 17
    path = write(tmp_path, "philly.csv", "".join(lines))
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value) == (
        "philly.csv line 17, field 'num_gpus': expected a positive integer, got 'x'"
    )
    assert isinstance(caught.value, ValueError)  # the CLI maps TraceError to exit code 2


PHILLY, CHRONUS = "philly/philly.csv", "chronus/trace_job_Philly_MIX1.csv"
POLLUX, ALIBABA = "pollux/workloads/workload-1.csv", "alibaba/openb_pod_list_default.csv"
BAD_FOREIGN_ROWS = {
    # name: (bundled file whose header and first rows to reuse, bad 4th line, field, message)
    "philly month 13": (PHILLY, "2017-13-09 07:01:55,66.0,1,66.0,c\n", "timestamp", "a time"),
    "philly negative duration": (PHILLY, "2017-10-09 07:01:55,-1,1,1,c\n", "duration", "positive"),
    "chronus negative gpus": (
        CHRONUS,
        "9,vc_a,-1,5,1,vgg16,30,1,1,10,0,strict\n",
        "num_gpu",
        "non-negative integer",
    ),
    "chronus no model": (CHRONUS, "9,vc_a,1,5,1,,30,1,1,10,0,strict\n", "model_name", "required"),
    "tiresias zero gpus": ("tiresias/60_job.csv", "60,0,5,10,vgg16,30,1\n", "num_gpu", "got '0'"),
    "pollux unknown app": (POLLUX, "x-1,5,resnet,1,128\n", "application", "one of cifar10"),
    "pollux duplicate": (POLLUX, "cifar10-0,5,cifar10,1,128\n", "name", "duplicate job id"),
    "alibaba ends early": (
        ALIBABA,
        "p,1,1,1,1000,,LS,Running,10,5,10\n",
        "deletion_time",
        "> scheduled_time 10",
    ),
    "alibaba shared 2-GPU": (ALIBABA, "p,1,1,2,500,,LS,Running,0,5,1\n", "gpu_milli", "1-GPU pods"),
}


@pytest.mark.parametrize(
    ("relative", "row", "field", "says"), BAD_FOREIGN_ROWS.values(), ids=BAD_FOREIGN_ROWS
)
def test_bad_rows_in_foreign_formats_raise(
    tmp_path: Path, relative: str, row: str, field: str, says: str
) -> None:
    lines = _real_rows(relative, 3) + [row]
    path = write(tmp_path, Path(relative).name, "".join(lines))
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert (caught.value.line, caught.value.field) == (4, field)
    assert says in str(caught.value)


def test_gavel_rows_must_all_have_the_first_rows_width(tmp_path: Path) -> None:
    lines = _real_rows("gavel/physical_cluster/small_test.trace", 2)
    path = write(tmp_path, "t.trace", "".join(lines) + "ResNet-18\tcmd\t1\t2\n")
    with pytest.raises(TraceError, match=r"t.trace line 3: expected 10 fields like the first row"):
        load_trace(path)
    bad_steps = lines[0].split("\t")
    bad_steps[5] = "many"
    with pytest.raises(TraceError, match="field 'total_steps'"):
        load_trace(write(tmp_path, "u.trace", "\t".join(bad_steps)))


def test_format_can_be_forced_and_unknown_inputs_are_refused(tmp_path: Path) -> None:
    lines = _real_rows("chronus/trace_job_Philly_MIX1.csv", 2)
    path = write(tmp_path, "c.csv", "".join(lines))
    assert load_trace(path).jobs[0].submit_time == 8555 * 60
    assert load_trace(path, format="tiresias").jobs[0].submit_time == 8555  # seconds
    gavel_txt = write(
        tmp_path,
        "g.txt",
        "".join(_real_rows("gavel/physical_cluster/debug.trace", 3)),
    )
    assert len(load_trace(gavel_txt).jobs) == 3
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        load_trace(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    with pytest.raises(TraceError, match="neither a bundled trace"):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="did you mean philly"):
        load_trace("phily")
    with pytest.raises(ValueError, match="known formats: csv, json, philly"):
        load_trace(path, format="yaml")
    with pytest.raises(ValueError, match="in format 'tiresias', not 'csv'"):
        load_trace("tiresias-60", format="csv")
    assert set(FORMATS) == {
        "csv",
        "json",
        "philly",
        "tiresias",
        "chronus",
        "gavel",
        "pollux",
        "alibaba",
    }


# --- model mixes -------------------------------------------------------------------------


def _blank_jobs(n: int) -> list[JobSpec]:
    return [JobSpec(id=str(i), submit_time=i, num_gpus=1, model="", duration=60) for i in range(n)]


def test_mix_assignment_is_deterministic_and_changes_with_the_seed() -> None:
    jobs = _blank_jobs(200)
    first = [job.model for job in assign_models(jobs, "paper", seed=7)]
    assert first == [job.model for job in assign_models(jobs, "paper", seed=7)]
    assert first != [job.model for job in assign_models(jobs, "paper", seed=8)]


def test_paper_mix_follows_its_weights_over_10000_jobs() -> None:
    kind = {m: k for k, models in MIXES["paper"]["models"].items() for m in models}
    shares = Counter(kind[job.model] for job in assign_models(_blank_jobs(10_000), "paper", 0))
    assert 0.55 <= shares["nlp"] / 10_000 <= 0.65
    assert 0.25 <= shares["speech"] / 10_000 <= 0.35
    assert 0.07 <= shares["cv"] / 10_000 <= 0.13


def test_mix_only_fills_empty_models_and_refuses_unknown_mixes() -> None:
    jobs = [*_blank_jobs(2), JobSpec(id="k", submit_time=0, num_gpus=1, model="bert", duration=1)]
    filled = assign_models(jobs, "gavel", 1)
    assert filled[2] is jobs[2]
    assert all(job.model in GAVEL_JOB_TYPES for job in filled[:2])
    assert [job.id for job in filled] == ["0", "1", "k"]
    with pytest.raises(ValueError, match="known mixes: paper, gavel, chronus"):
        assign_models(jobs, "cloud", 0)
    with pytest.raises(ValueError, match="unknown model mix 'cloud'"):
        load_trace("tiresias-60", mix="cloud")


def test_models_do_not_depend_on_the_selection() -> None:
    full = bundled("alibaba-2023")
    assert load_trace("alibaba-2023", jobs=50).jobs == full.jobs[:50]
    reseeded = load_trace("alibaba-2023", jobs=50, seed=1).jobs
    assert [j.model for j in reseeded] != [j.model for j in full.jobs[:50]]


# --- selection: sort, window, first N, arrival scale ---------------------------------------

UNSORTED = """\
job_id,submit_time,num_gpus,duration,model
d,30,1,60,lstm
a,0,1,60,lstm
c,20,1,60,lstm
b,10,1,60,lstm
b2,10,1,60,lstm
e,40,1,60,lstm
"""


def _times(trace: Trace) -> list[tuple[str, float]]:
    return [(job.id, job.submit_time) for job in trace.jobs]


def test_jobs_are_sorted_by_submit_time_stably(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "u.csv", UNSORTED))
    assert _times(trace) == [("a", 0), ("b", 10), ("b2", 10), ("c", 20), ("d", 30), ("e", 40)]


def test_window_keeps_start_to_end_and_maps_start_to_zero(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "u.csv", UNSORTED), window=(10, 30))
    assert _times(trace) == [("b", 0), ("b2", 0), ("c", 10)]
    assert any("window [10, 30) s kept 3 of 6 jobs" in note for note in trace.notes)
    shifted = load_trace(tmp_path / "u.csv", window=(5, 35))
    assert _times(shifted) == [("b", 5), ("b2", 5), ("c", 15), ("d", 25)]


def test_jobs_keeps_the_first_n_after_the_window(tmp_path: Path) -> None:
    path = write(tmp_path, "u.csv", UNSORTED)
    assert _times(load_trace(path, jobs=2)) == [("a", 0), ("b", 10)]
    assert _times(load_trace(path, window=(15, 100), jobs=2)) == [("c", 5), ("d", 15)]
    assert len(load_trace(path, jobs=100).jobs) == 6


def test_arrival_scale_divides_submit_times_last(tmp_path: Path) -> None:
    path = write(tmp_path, "u.csv", UNSORTED)
    assert _times(load_trace(path, jobs=3, arrival_scale=2)) == [("a", 0), ("b", 5), ("b2", 5)]
    assert _times(load_trace(path, window=(20, 50), jobs=2, arrival_scale=0.5)) == [
        ("c", 0),
        ("d", 20),
    ]
    assert load_trace(path, arrival_scale=4).jobs[-1].duration == 60  # work is untouched


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"jobs": 0}, "jobs must be a positive integer"),
        ({"jobs": 2.5}, "jobs must be a positive integer"),
        ({"arrival_scale": 0}, "arrival_scale must be a finite number > 0"),
        ({"arrival_scale": -1.0}, "arrival_scale must be a finite number > 0"),
        ({"window": (30, 30)}, "window start must be before its end"),
        ({"window": (40, 10)}, "window start must be before its end"),
        ({"window": (0,)}, "window must be (start, end)"),
        ({"window": (1000, 2000)}, "keeps no job"),
    ],
)
def test_bad_selection_arguments_are_refused(
    tmp_path: Path, options: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError) as caught:
        load_trace(write(tmp_path, "u.csv", UNSORTED), **options)  # type: ignore[arg-type]
    assert says in str(caught.value)
    assert not isinstance(caught.value, TraceError)
