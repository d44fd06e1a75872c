"""The performance model reproduces the paper's numbers and reads the bundled tables faithfully."""

from __future__ import annotations

import copy
import json
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gandiva.sim.perf import (
    MIN_INTERFERENCE,
    ModelProfile,
    PerfModel,
    UnknownGpuTypeError,
    UnknownModelError,
    default_perf_model,
)

DATA = resources.files("gandiva").joinpath("data")
MODELS: dict[str, Any] = json.loads(DATA.joinpath("models.json").read_text(encoding="utf-8"))
GAVEL: dict[str, Any] = json.loads(
    DATA.joinpath("gavel_throughputs.json").read_text(encoding="utf-8"))

PAPER_MODELS = {"vae", "superresolution", "rhn", "scrnn", "milstm", "lstm", "resnet50",
                "resnext50", "vgg16", "deepspeech", "wavenet"}
TIRESIAS_MODELS = {"vgg11", "vgg16", "vgg19", "alexnet", "googlenet", "inception3", "inception4",
                   "resnet50", "resnet101", "resnet152"}
CHRONUS_MODELS = {"alexnet", "vgg16", "resnet101", "mobilenet_v2", "inception_v3"}
POLLUX_MODELS = {"cifar10", "imagenet", "ncf", "deepspeech2", "yolov3", "bert"}


@pytest.fixture(scope="module")
def perf() -> PerfModel:
    return default_perf_model()


def gavel_jobs(scale: int = 1) -> list[str]:
    jobs = []
    for key in GAVEL["v100"]:
        job, sf = eval(key)  # noqa: S307 -- Gavel's keys are Python tuple literals
        if sf == scale:
            jobs.append(job)
    return jobs


def solo(worker: str, job: str) -> float:
    return GAVEL[worker][str((job, 1))]["null"]


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("names", [PAPER_MODELS, TIRESIAS_MODELS, CHRONUS_MODELS, POLLUX_MODELS],
                         ids=["paper", "tiresias", "chronus", "pollux"])
def test_every_trace_model_name_resolves(perf: PerfModel, names: set[str]) -> None:
    for name in names:
        assert perf.resolve(name) in perf.models


def test_every_model_key_and_alias_resolves(perf: PerfModel) -> None:
    for name in MODELS["models"]:
        assert perf.resolve(name) == name
    for alias, target in MODELS["aliases"].items():
        assert perf.resolve(alias) == target


def test_every_gavel_job_type_resolves_in_both_spellings(perf: PerfModel) -> None:
    for key in GAVEL["v100"]:
        job, _ = eval(key)  # noqa: S307
        assert perf.resolve(job) == job
        assert perf.resolve(key) == job


def test_names_are_case_space_and_punctuation_insensitive(perf: PerfModel) -> None:
    assert perf.resolve("ResNet-50") == perf.resolve(" resnet 50 ") == "resnet50"
    assert perf.resolve("VGG-16") == "vgg16"
    assert perf.resolve("resnet-50 (BATCH SIZE 64)") == "ResNet-50 (batch size 64)"


def test_trace_spellings_share_one_canonical_model(perf: PerfModel) -> None:
    assert perf.resolve("inception_v3") == perf.resolve("inception3")
    assert perf.resolve("inception_v4") == "inception4"
    assert perf.resolve("deepspeech2") != perf.resolve("deepspeech")


def test_unknown_model_lists_close_matches(perf: PerfModel) -> None:
    with pytest.raises(UnknownModelError) as err:
        perf.resolve("resnt50")
    assert isinstance(err.value, KeyError)
    assert "resnet50" in err.value.close_matches
    assert "resnet50" in str(err.value)


def test_unknown_gpu_type_is_a_key_error(perf: PerfModel) -> None:
    with pytest.raises(UnknownGpuTypeError, match="V100"):
        perf.step_time("resnet50", "H100")
    assert perf.step_time("resnet50", "v100") == perf.step_time("resnet50", "V100")


# -- profiles ----------------------------------------------------------------------------------


def test_gpu_types_carry_their_memory(perf: PerfModel) -> None:
    assert perf.gpu_types == {"V100": 16, "P100": 16, "K80": 12, "P40": 24, "T4": 16, "A100": 40}


@pytest.mark.parametrize("model, mb", [("wavenet", 8), ("resnet50", 98), ("vgg16", 528),
                                       ("deepspeech", 1405)])
def test_checkpoint_sizes_are_fig13s(perf: PerfModel, model: str, mb: float) -> None:
    assert perf.profile(model).checkpoint_mb == mb


def test_every_profile_is_well_formed(perf: PerfModel) -> None:
    for name in perf.models:
        p = perf.profile(name)
        assert isinstance(p, ModelProfile) and p.name == name
        assert p.family in {"cv", "nlp", "speech", "rec", "rl", "gan"}
        assert 0 < p.utilization <= 1 and p.memory_gb > 0 and p.checkpoint_mb > 0


def test_table1_utilisation_classes_follow_packing_gain(perf: PerfModel) -> None:
    low, mid, high = {"vae", "superresolution"}, {"rhn", "scrnn", "milstm"}, {"lstm", "resnet50",
                                                                             "resnext50"}
    assert all(perf.profile(m).utilization < 0.35 for m in low)
    assert all(0.35 <= perf.profile(m).utilization < 0.9 for m in mid)
    assert all(perf.profile(m).utilization >= 0.9 for m in high)


# -- speed -------------------------------------------------------------------------------------


def test_table1_rates_are_solo_p40_mini_batch_times(perf: PerfModel) -> None:
    assert perf.step_time("vae", "P40") == pytest.approx(1 / 81.8, rel=1e-4)
    assert perf.step_time("resnet50", "P40") == pytest.approx(1 / 10.3, rel=1e-4)


def test_gavel_step_time_is_inverse_steps_per_second(perf: PerfModel) -> None:
    job = "ResNet-50 (batch size 64)"
    for gpu, worker in [("V100", "v100"), ("P100", "p100"), ("K80", "k80")]:
        assert perf.step_time(job, gpu) == pytest.approx(1 / solo(worker, job))


def test_relative_speeds_are_medians_over_gavel(perf: PerfModel) -> None:
    for gpu, worker in [("P100", "p100"), ("K80", "k80")]:
        ratios = [solo(worker, j) / solo("v100", j) for j in gavel_jobs()]
        assert perf.gpu_speeds[gpu] == pytest.approx(statistics.median(ratios), abs=1e-4)
    assert perf.gpu_speeds["P40"] == perf.gpu_speeds["P100"]


def test_unmeasured_types_scale_by_relative_speed(perf: PerfModel) -> None:
    p40 = perf.step_time("resnet50", "P40")
    assert perf.step_time("resnet50", "P100") == pytest.approx(p40)  # same speed as P40
    assert perf.step_time("resnet50", "V100") == pytest.approx(p40 * perf.gpu_speeds["P40"])
    assert perf.step_time("resnet50", "A100") < perf.step_time("resnet50", "V100")


def test_every_model_has_a_positive_time_on_every_gpu(perf: PerfModel) -> None:
    for name in perf.models:
        for gpu in perf.gpu_types:
            assert perf.step_time(name, gpu) > 0


# -- locality ----------------------------------------------------------------------------------


def test_resnet50_locality_is_the_papers(perf: PerfModel) -> None:
    assert perf.locality("resnet50", 1, False) == 1.0
    assert perf.locality("resnet50", 2, False) == pytest.approx(565 / 780, abs=1e-3)
    assert perf.locality("resnet50", 4, False) == pytest.approx(325 / 780, abs=1e-3)


def test_vgg16_over_two_sockets_keeps_60_percent(perf: PerfModel) -> None:
    assert perf.locality("vgg16", 1, True) == 0.6


def test_server_counts_not_in_the_table_take_the_next_larger_or_largest(perf: PerfModel) -> None:
    assert perf.locality("resnet50", 3, False) == perf.locality("resnet50", 4, False)
    assert perf.locality("resnet50", 16, False) == perf.locality("resnet50", 4, False)


def test_chronus_and_pollux_locality_come_from_their_tables(perf: PerfModel) -> None:
    assert perf.locality("alexnet", 2, False) == pytest.approx(0.397, abs=1e-3)
    assert perf.locality("inception_v3", 4, False) == pytest.approx(0.964, abs=1e-3)
    assert perf.locality("bert", 2, False) == pytest.approx(0.452, abs=1e-3)


def test_gavel_locality_is_unconsolidated_over_consolidated(perf: PerfModel) -> None:
    job = "LM (batch size 20)"
    key = str((job, 2))
    expected = GAVEL["v100_unconsolidated"][key]["null"] / GAVEL["v100"][key]["null"]
    assert perf.locality(job, 2, False) == pytest.approx(expected)


def test_every_locality_is_a_fraction(perf: PerfModel) -> None:
    for name in perf.models:
        for servers in (1, 2, 3, 4, 8, 64):
            for cross in (False, True):
                assert 0 < perf.locality(name, servers, cross) <= 1


# -- packing -----------------------------------------------------------------------------------


def test_packed_vae_pair_barely_interferes(perf: PerfModel) -> None:
    assert all(f > 0.9 for f in perf.packed("vae", "vae", "P40"))


def test_packed_lstm_pair_is_worse_than_time_slicing(perf: PerfModel) -> None:
    assert all(f < 0.5 for f in perf.packed("lstm", "lstm", "P40"))


def test_gavel_pair_reads_the_measured_table(perf: PerfModel) -> None:
    a, b = "ResNet-50 (batch size 64)", "LM (batch size 20)"
    mine, theirs = GAVEL["v100"][str((a, 1))][str((b, 1))]
    assert perf.packed(a, b, "V100") == pytest.approx((mine / solo("v100", a),
                                                       theirs / solo("v100", b)))
    assert perf.packed(b, a, "V100") == pytest.approx((theirs / solo("v100", b),
                                                       mine / solo("v100", a)))


def test_p40_packing_reads_gavels_p100_table(perf: PerfModel) -> None:
    a, b = "Transformer (batch size 32)", "A3C"
    mine, _ = GAVEL["p100"][str((a, 1))][str((b, 1))]
    assert perf.packed(a, b, "P40")[0] == pytest.approx(mine / solo("p100", a))


def test_unmeasured_pairs_follow_utilisation(perf: PerfModel) -> None:
    ua, ub = perf.profile("vae").utilization, perf.profile("vgg16").utilization
    expected = (1 - MIN_INTERFERENCE) * min(1.0, 1 / (ua + ub))
    assert perf.packed("vae", "vgg16", "V100") == pytest.approx((expected, expected))


def test_every_packed_fraction_is_in_unit_interval(perf: PerfModel) -> None:
    for gpu in ("V100", "T4"):
        for a in perf.models:
            for b in perf.models:
                assert all(0 < f <= 1 for f in perf.packed(a, b, gpu))


# -- costs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mb, seconds", [(8, 0.22), (98, 0.43), (528, 1.15), (1405, 2.45)])
def test_migration_within_a_server_is_fig13(perf: PerfModel, mb: float, seconds: float) -> None:
    assert perf.migration_time(mb, False) == pytest.approx(seconds)


def test_migration_interpolates_and_extrapolates_linearly(perf: PerfModel) -> None:
    assert perf.migration_time(53, False) == pytest.approx((0.22 + 0.43) / 2)
    slope = (2.45 - 1.15) / (1405 - 528)
    assert perf.migration_time(2405, False) == pytest.approx(2.45 + 1000 * slope)


def test_migration_across_servers_scales_fig13(perf: PerfModel) -> None:
    assert perf.migration_time(1405, True) == pytest.approx(3.6)
    assert perf.migration_time(98, True) == pytest.approx(0.43 * 3.6 / 2.45, abs=1e-3)


def test_suspend_resume_is_fast_for_image_models_and_about_a_second_for_large(
        perf: PerfModel) -> None:
    assert perf.suspend_resume_time(perf.profile("resnet50").checkpoint_mb) < 0.1
    large = perf.suspend_resume_time(perf.profile("deepspeech").checkpoint_mb)
    assert 0.8 <= large <= 1.2 and large / 60 <= 0.02


# -- loading and validation -------------------------------------------------------------------


def test_default_model_is_loaded_once() -> None:
    assert default_perf_model() is default_perf_model()


def test_bundled_gavel_table_is_gavels_file() -> None:
    original = Path("/work/shared/traces/gavel/simulation_throughputs.json")
    if not original.exists():
        pytest.skip("shared traces not available")
    assert DATA.joinpath("gavel_throughputs.json").read_bytes() == original.read_bytes()


def write(tmp_path: Path, data: dict[str, Any]) -> str:
    data["gavel_models"]["table"] = str(DATA.joinpath("gavel_throughputs.json"))
    path = tmp_path / "models.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_copy_of_the_data_loads_from_a_path(tmp_path: Path) -> None:
    perf = PerfModel.load(write(tmp_path, copy.deepcopy(MODELS)))
    assert perf.models == default_perf_model().models


def broken(edit: str) -> dict[str, Any]:
    data = copy.deepcopy(MODELS)
    vae = data["models"]["vae"]
    if edit == "utilization":
        vae["utilization"]["value"] = 1.5
    elif edit == "family":
        del vae["family"]
    elif edit == "mini_batch_time":
        vae["mini_batch_time"]["P40"]["value"] = -1
    elif edit == "locality":
        vae["locality"] = {"cross_socket": {"value": 1.2, "source": "gandiva_paper"}}
    elif edit == "reason":
        del vae["memory_gb"]["reason"]
    return data


@pytest.mark.parametrize("edit, message", [
    ("utilization", "models.vae.utilization"),
    ("family", "models.vae: missing field 'family'"),
    ("mini_batch_time", "models.vae.mini_batch_time.P40"),
    ("locality", "models.vae.locality.cross_socket"),
    ("reason", "models.vae.memory_gb: an estimate needs a 'reason'"),
])
def test_invalid_data_names_the_model_and_field(tmp_path: Path, edit: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PerfModel.load(write(tmp_path, broken(edit)))


def test_table1_utilisations_say_they_are_derived_not_given() -> None:
    for model in ("vae", "superresolution", "rhn", "scrnn", "milstm", "lstm", "resnet50",
                  "resnext50"):
        u = MODELS["models"][model]["utilization"]
        assert u["source"] == "gandiva_paper" and u["kind"] == "derived"
        assert "Not given by the paper" in u["note"]


def test_a_sourced_number_must_say_whether_it_is_given_or_derived() -> None:
    data = copy.deepcopy(MODELS)
    del data["models"]["vae"]["utilization"]["kind"]
    with pytest.raises(ValueError, match="models.vae.utilization: 'kind' must be one of"):
        PerfModel.from_data(data, GAVEL)


def test_scaling_is_gavels_consolidated_rows_per_gpu_type(perf: PerfModel) -> None:
    for worker, gpu in (("v100", "V100"), ("p100", "P100"), ("k80", "K80")):
        for job in gavel_jobs(4):
            row = GAVEL[worker].get(str((job, 4)), {}).get("null", 0.0)
            if row > 0:
                assert perf.throughput(job, gpu, 4) == pytest.approx(row, rel=1e-12)


def test_pollux_scaling_is_one_node_step_times(perf: PerfModel) -> None:
    entry = MODELS["models"]["cifar10"]
    for n in (2, 3, 4):
        speedup = entry["scaling"][str(n)]["value"]
        assert perf.throughput("cifar10", "T4", n) == pytest.approx(
            speedup / entry["mini_batch_time"]["T4"]["value"], rel=1e-9)


def test_unmeasured_scaling_takes_the_named_default_and_holds_its_widest_efficiency(
        perf: PerfModel) -> None:
    default = {int(k): v["value"] for k, v in MODELS["defaults"]["scaling"].items()}
    step = perf.step_time("vgg16", "V100")
    for n, speedup in default.items():
        assert perf.throughput("vgg16", "V100", n) == pytest.approx(speedup / step)
    widest = max(default)
    assert perf.throughput("vgg16", "V100", 4 * widest) == pytest.approx(
        4 * default[widest] / step)
    assert perf.throughput("vgg16", "V100", 1) == pytest.approx(1 / step)


def test_an_alias_must_point_to_a_model() -> None:
    data = copy.deepcopy(MODELS)
    data["aliases"]["resnet-5O"] = "resnet5O"
    with pytest.raises(ValueError, match="aliases.resnet-5O"):
        PerfModel.from_data(data, GAVEL)


def test_every_number_in_models_json_carries_its_source() -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "value" in node:
                assert node.get("source") in {*MODELS["sources"], "estimate"}, where
                assert node["source"] != "estimate" or node.get("reason"), where
                if node["source"] != "estimate":
                    assert node.get("kind") in {"given", "derived"}, where
                    assert node["kind"] != "derived" or node.get("note"), where
                return
            for key, child in node.items():
                walk(child, f"{where}.{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{where}[{i}]")
        elif isinstance(node, int | float) and not isinstance(node, bool):
            # Only a migration point's x-coordinate is bare; its "seconds" names the source.
            assert where.endswith(".checkpoint_mb") and where.startswith(".costs."), where

    walk({k: v for k, v in MODELS.items() if k != "schema_version"}, "")
    assert all(v for v in MODELS["sources"].values())
