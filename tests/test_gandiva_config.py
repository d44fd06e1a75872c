"""The gandiva policy's settings (``gandiva/policies/gandiva/config.py``): what a spec may say,
what it is refused, and, for every tunable, a small simulated run in which two of its values
(everything else the same) make different decisions."""

import sys

import pytest
import test_fair as fair_tests
import test_framework as framework_tests
import test_gandiva_policy as policy_tests
from conftest import jcts, job

from gandiva import actions as A
from gandiva.policies import make_policy
from gandiva.policies.gandiva import Gandiva
from gandiva.policies.gandiva import config as C
from gandiva.policies.gandiva.config import RENAMED, SWITCHED, Config
from gandiva.sim.engine import SimConfig, Simulator
from gandiva.state import Cluster


def run(cluster: str, spec: str, *jobs, **config):
    sim = Simulator(Cluster.build(cluster), make_policy(spec), jobs, reference_gpu="V100",
                    config=SimConfig(check_invariants=True, **config))
    return sim.run(), sim


def acts(result, kind, job_id=None):
    return [(t, a) for t, a, _ in result.actions
            if isinstance(a, kind) and (job_id is None or a.job_id == job_id)]


def times(result, kind, job_id=None):
    return [t for t, _ in acts(result, kind, job_id)]


def decisions(result):
    """What the policy did, and when (the simulator's wake-ups left out)."""
    return [(t, type(a).__name__, a.job_id, getattr(a, "gpus", None))
            for t, a, _ in result.actions if not isinstance(a, A.Wake)]


def flat(config: Config) -> dict[str, object]:
    """A config as {dotted path: value}."""
    out = {}
    for key, value in config.model_dump().items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def setting_paths() -> list[str]:
    """Every tunable, by its dotted path, from the config's own fields."""
    paths = []
    for name, field in Config.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, C.Section):
            paths += [f"{name}.{f}" for f in section.model_fields]
        else:
            paths.append(name)
    return paths


# ==== configuration =========================================================================

@pytest.mark.parametrize("preset", ["gandiva", "gandiva-paper"])
def test_both_presets_build_into_a_gandiva_policy_of_their_name(preset):
    policy = make_policy(preset)
    assert isinstance(policy, Gandiva)
    assert policy.name == preset and isinstance(policy.config, Config)
    assert policy.config == Config.model_validate(C.PRESETS[preset])


def test_the_default_preset_is_the_configs_defaults():
    assert make_policy("gandiva").config == Config()


def test_the_paper_preset_differs_from_the_default_exactly_in_its_five_settings():
    default, paper = flat(make_policy("gandiva").config), flat(make_policy("gandiva-paper").config)
    assert default.keys() == paper.keys() == set(setting_paths())
    differ = {k: (default[k], paper[k]) for k in default if default[k] != paper[k]}
    assert differ == {"slices.order": ("levels", "roundrobin"),
                      "balance.enabled": (True, False),
                      "admission.rule": ("las", "queue"),
                      "gangs.share": ("used", "whole"),
                      "packing.spread": (True, False)}


def test_a_spec_sets_values_by_dotted_path_over_its_preset():
    c = make_policy("gandiva:quantum=30:-packing:slices.order=las:placement.max_height=2").config
    assert c.quantum == 30 and c.slices.order == "las" and c.placement.max_height == 2
    assert c.packing == C.PackingSettings(enabled=False)
    assert flat(c).keys() == set(setting_paths())
    rest = {k: v for k, v in flat(c).items() if k not in (
        "quantum", "slices.order", "placement.max_height", "packing.enabled", "packing.min_gain",
        "packing.spread")}
    assert rest == {k: v for k, v in flat(Config()).items() if k in rest}
    # booleans: "-a.b" false, "a.b" true; "section" alone switches it on
    c = make_policy("gandiva-paper:-placement.oversubscribe:balance:-slices.keep_turn"
                    ":slices.order=levels").config
    assert c.placement.oversubscribe is False and c.balance.enabled is True
    assert c.slices.keep_turn is False and c.admission.rule == "queue"  # the preset's stays


# every setting that has an effect only under another: (section, the values that make it
# idle, the setting, a value for it, what the error says it needs)
IDLE = [
    ("slices", {"order": "las"}, "keep_turn", False, "order=levels"),
    ("slices", {"order": "roundrobin"}, "keep_turn", True, "order=levels"),
    ("slices", {"order": "las"}, "level_step", 1.0, "order=levels"),
    ("slices", {"order": "roundrobin"}, "level_step", 5.0, "order=levels"),
    ("balance", {"enabled": False}, "servers", "rotating", "balance is on"),
    ("balance", {"enabled": False}, "servers", "all", "balance is on"),  # the default, too
    ("balance", {"enabled": False}, "spare_gangs", False, "balance is on"),
    ("balance", {"enabled": False}, "idle_to_gangs", True, "balance is on"),
    ("admission", {"rule": "queue"}, "displace_margin", 0.0, "rule=las"),
    ("packing", {"enabled": False}, "min_gain", 0.2, "packing is on"),
    ("packing", {"enabled": False}, "spread", False, "packing is on"),
    ("migration", {"enabled": False}, "max_moves", 2, "migration is on"),
    ("defrag", {"enabled": False}, "interval", 60.0, "defrag is on"),
    ("defrag", {"enabled": False}, "max_move_s", 5.0, "defrag is on"),
    ("elastic", {"enabled": False}, "grow_idle_s", 10.0, "elastic is on"),
    ("fair", {"enabled": False}, "gang_wait", 600.0, "fair is on"),
]


def spec_part(section: str, key: str, value: object) -> str:
    if key == "enabled" and value is False:
        return f"-{section}"
    if isinstance(value, bool):
        return f"{'' if value else '-'}{section}.{key}"
    return f"{section}.{key}={value}"


def refused_message(excinfo) -> str:
    return str(excinfo.value)


def test_every_setting_of_a_switched_section_is_listed_as_idle_when_it_is_off():
    """(So that a new setting of a section with ``enabled`` is checked below.)"""
    for section in SWITCHED:
        fields = set(Config.model_fields[section].annotation.model_fields) - {"enabled"}
        listed = {f for s, base, f, *_ in IDLE if s == section and base == {"enabled": False}}
        assert listed == fields, section


@pytest.mark.parametrize("section, base, field, value, needs", IDLE,
                         ids=[f"{s}.{f}={v}" for s, _, f, v, _ in IDLE])
def test_a_setting_with_no_effect_is_refused_naming_it_and_the_fix(section, base, field, value,
                                                                   needs):
    idle = [spec_part(section, k, v) for k, v in base.items()]
    make_policy(":".join(["gandiva", *idle]))  # the base alone is fine
    with pytest.raises(ValueError) as e:
        make_policy(":".join(["gandiva", *idle, spec_part(section, field, value)]))
    msg = refused_message(e)
    assert section in msg and field in msg and needs in msg and "leave it out" in msg
    # the order of the parts does not matter
    with pytest.raises(ValueError, match=field):
        make_policy(":".join(["gandiva", spec_part(section, field, value), *idle]))


@pytest.mark.parametrize("section, base, field, value, needs", IDLE,
                         ids=[f"{s}.{f}={v}" for s, _, f, v, _ in IDLE])
def test_a_setting_with_no_effect_is_refused_in_a_config_built_in_python(section, base, field,
                                                                         value, needs):
    cls = type(getattr(Config(), section))
    Config(**{section: cls(**base)})  # the base alone is fine
    with pytest.raises(ValueError) as e:  # (pydantic's ValidationError is a ValueError)
        cls(**base, **{field: value})
    assert field in str(e.value) and needs in str(e.value) and "leave it out" in str(e.value)
    with pytest.raises(ValueError) as e:
        Config(**{section: {**base, field: value}})
    assert section in str(e.value) and field in str(e.value) and needs in str(e.value)
    with pytest.raises(ValueError, match=field):
        Config.model_validate({"quantum": 30, section: {**base, field: value}})


@pytest.mark.parametrize("spec, field", [
    ("gandiva-paper:slices.keep_turn", "keep_turn"),  # its order is round-robin
    ("gandiva-paper:slices.level_step=5", "level_step"),
    ("gandiva-paper:balance.spare_gangs", "spare_gangs"),  # its balance is off
    ("gandiva-paper:balance.servers=rotating", "servers"),
    ("gandiva-paper:admission.displace_margin=0", "displace_margin"),  # it queues
    ("gandiva-paper:-packing:packing.min_gain=0.1", "min_gain"),
])
def test_a_setting_with_no_effect_under_the_paper_preset_is_refused(spec, field):
    with pytest.raises(ValueError, match=f"{field} has no effect unless .*: leave it out"):
        make_policy(spec)


def test_switching_a_section_off_over_a_preset_that_set_values_in_it_works():
    # gandiva-paper sets packing.spread=false: switched off, packing drops it
    c = make_policy("gandiva-paper:-packing").config
    assert c.packing == C.PackingSettings(enabled=False)
    assert flat(c) == {**flat(make_policy("gandiva-paper").config), "packing.enabled": False,
                       "packing.spread": True}
    # and on again, the preset's value stays
    c = make_policy("gandiva-paper:packing").config
    assert c.packing.enabled is True and c.packing.spread is False
    # gandiva-paper sets balance.enabled=false: off again is no conflict
    assert make_policy("gandiva-paper:-balance").config == make_policy("gandiva-paper").config
    # switching sections off over the default preset
    c = make_policy("gandiva:-migration:-defrag:-elastic:-balance").config
    assert not (c.migration.enabled or c.defrag.enabled or c.elastic.enabled
                or c.balance.enabled)


@pytest.mark.parametrize("old, new", [
    ("-pack", "packing"), ("pack", "packing"), ("-migrate", "migration"),
    ("slice_order=las", "slices.order"), ("las_admission", "admission.rule=las|queue"),
    ("-las_admission", "admission.rule=las|queue"), ("las-admission", "admission.rule"),
    ("max_height=2", "placement.max_height"), ("-oversubscribe", "placement.oversubscribe"),
    ("scan_depth=8", "placement.scan_depth"), ("-keep_turn_in_level", "slices.keep_turn"),
    ("level_step=1", "slices.level_step"), ("-balance_all", "balance.servers=all|rotating"),
    ("-spare_gangs", "balance.spare_gangs"), ("-idle_to_gangs", "balance.idle_to_gangs"),
    ("-gang_shares", "gangs.share=used|whole"), ("displace_margin=0", "admission.displace_margin"),
    ("pack_min_gain=0.1", "packing.min_gain"), ("-spread_packed", "packing.spread"),
    ("grow_idle_s=10", "elastic.grow_idle_s"), ("defrag_interval=60", "defrag.interval"),
    ("defrag_max_move_s=1", "defrag.max_move_s"), ("max_moves=1", "migration.max_moves"),
])
def test_an_old_flat_name_is_refused_naming_its_new_spelling(old, new):
    with pytest.raises(ValueError, match="is now") as e:
        make_policy(f"gandiva:{old}")
    assert new in str(e.value)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_every_old_name_points_at_a_setting_that_exists(old):
    new = RENAMED[old].split("=")[0]
    section, _, field = new.partition(".")
    assert section in Config.model_fields
    assert (field or "enabled") in Config.model_fields[section].annotation.model_fields
    with pytest.raises(ValueError, match=f"is now '{RENAMED[old]}'".replace("|", r"\|")):
        make_policy(f"gandiva-paper:-{old}")


@pytest.mark.parametrize("spec, names", [
    ("gandiva:nonsense", "nonsense"),
    ("gandiva:-nonsense", "nonsense"),
    ("gandiva:nonsense=3", "nonsense"),
    ("gandiva:placement.nonsense=1", "placement.nonsense"),
    ("gandiva:slices.order.deep=las", "slices.order.deep"),
    ("gandiva:gangs", "gangs"),  # a section with no switch
    ("gandiva:-gangs", "gangs"),
])
def test_an_unknown_setting_is_refused(spec, names):
    with pytest.raises(ValueError) as e:
        make_policy(spec)
    assert names in str(e.value)


@pytest.mark.parametrize("spec, names", [
    ("gandiva:quantum=0", "quantum"), ("gandiva:quantum=-30", "quantum"),
    ("gandiva:-quantum", "quantum"), ("gandiva:quantum=soon", "quantum"),
    ("gandiva:slices.order=random", "slices.order"), ("gandiva:slices.order=", "slices.order"),
    ("gandiva:slices.level_step=1.1", "level_step"), ("gandiva:slices.level_step=0.5",
                                                      "level_step"),
    ("gandiva:slices.level_step=inf", "level_step"), ("gandiva:slices.level_step=0",
                                                      "level_step"),
    ("gandiva:placement.max_height=0", "placement.max_height"),
    ("gandiva:placement.scan_depth=0", "placement.scan_depth"),
    ("gandiva:placement.scan_depth=2.5", "placement.scan_depth"),
    ("gandiva:admission.rule=fifo", "admission.rule"),
    ("gandiva:admission.displace_margin=-1", "admission.displace_margin"),
    ("gandiva:balance.servers=some", "balance.servers"),
    ("gandiva:gangs.share=half", "gangs.share"),
    ("gandiva:migration.max_moves=0", "migration.max_moves"),
    ("gandiva:defrag.interval=0", "defrag.interval"),
    ("gandiva:defrag.max_move_s=-1", "defrag.max_move_s"),
    ("gandiva:elastic.grow_idle_s=-1", "elastic.grow_idle_s"),
    ("gandiva:packing.spread=maybe", "packing.spread"),
])
def test_a_bad_value_is_refused_naming_the_setting(spec, names):
    with pytest.raises(ValueError) as e:
        make_policy(spec)
    assert names in str(e.value)


def test_the_level_steps_at_the_edges_of_the_range_are_taken():
    assert make_policy("gandiva:slices.level_step=1").config.slices.level_step == 1
    least = C.LEAST_STEP
    assert make_policy(f"gandiva:slices.level_step={least!r}").config.slices.level_step == least
    assert make_policy("gandiva:slices.level_step=1000").config.slices.level_step == 1000


def test_an_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown policy 'gandiva-nonsense'"):
        make_policy("gandiva-nonsense")


# ==== no tunable without a test that it changes a decision ==================================

# every setting -> the test (here, or in test_gandiva_policy.py) where two of its values,
# everything else the same, make different decisions
HERE = sys.modules[__name__]
DECIDES = {
    "quantum": (HERE, "test_quantum_sets_when_time_slices_turn"),
    "plugins": (framework_tests,
                "test_a_scorer_plugged_in_by_name_sends_jobs_to_the_gpu_type_it_prefers"),
    "placement.oversubscribe": (
        HERE, "test_oversubscribe_time_slices_a_newcomer_instead_of_queueing_it"),
    "placement.max_height": (HERE, "test_max_height_caps_how_many_jobs_share_a_server"),
    "placement.scan_depth": (HERE, "test_scan_depth_limits_how_far_down_the_queue_a_job_is_placed"),
    "slices.order": (
        HERE, "test_slices_order_las_runs_a_newcomer_till_it_catches_up_round_robin_a_quantum"),
    "slices.keep_turn": (policy_tests,
                         "test_a_job_keeps_its_turn_against_the_jobs_waiting_in_its_own_level"),
    "slices.level_step": (policy_tests, "test_past_tiresias_levels_a_job_holds_its_turn_till_its_"
                                        "service_grows_by_level_step"),
    "balance.enabled": (
        HERE, "test_balance_suspends_a_long_served_job_on_another_server_for_a_newcomer"),
    "balance.servers": (policy_tests, "test_the_slice_order_spans_servers_that_do_not_time_slice_"
                                      "with_balance_all"),
    "balance.spare_gangs": (policy_tests, "test_a_waiting_job_takes_its_turn_off_a_running_gangs_"
                                          "servers_where_there_is_room"),
    "balance.idle_to_gangs": (policy_tests, "test_a_waiting_gang_with_no_room_at_home_takes_the_"
                                            "gpus_a_round_leaves_idle"),
    "gangs.share": (policy_tests, "test_a_gang_takes_only_the_gpus_it_uses_on_its_servers_and_a_"
                                  "narrow_job_has_the_rest"),
    "admission.rule": (policy_tests,
                       "test_full_cluster_admits_a_newcomer_in_place_of_the_most_served_job"),
    "admission.displace_margin": (
        HERE, "test_displace_margin_is_how_much_more_service_a_job_sent_back_has"),
    "packing.enabled": (HERE, "test_packing_packs_a_waiting_job_instead_of_time_slicing_it"),
    "packing.min_gain": (
        HERE, "test_packing_min_gain_undoes_a_pair_that_does_not_beat_time_slicing_by_it"),
    "packing.spread": (policy_tests,
                       "test_a_packed_job_takes_a_gpu_that_stays_free_on_another_server"),
    "migration.enabled": (HERE, "test_migration_moves_a_job_spread_over_sockets_when_a_job_leaves"),
    "migration.max_moves": (HERE, "test_migration_max_moves_caps_the_moves_one_departure_makes"),
    "defrag.enabled": (policy_tests, "test_defragmentation_empties_a_server_for_a_waiting_gang"),
    "defrag.interval": (HERE, "test_defrag_interval_is_how_long_a_blocked_job_waits_for_a_try"),
    "defrag.max_move_s": (HERE, "test_defrag_max_move_s_leaves_dearer_moves_unmade"),
    "elastic.enabled": (
        HERE, "test_elastic_grows_a_job_into_idle_gpus_and_shrinks_it_for_new_work"),
    "elastic.grow_idle_s": (
        HERE, "test_elastic_grow_idle_s_is_how_long_gpus_stay_idle_before_a_grow"),
    "fair.enabled": (fair_tests, "test_a_user_who_comes_second_gets_a_share_at_once_not_after_"
                                 "the_first_users_jobs"),
    "fair.gang_wait": (fair_tests, "test_a_gang_that_waited_the_stated_time_reserves_its_servers_"
                                   "and_runs_at_the_next_round"),
}


def test_every_tunable_has_a_test_that_it_changes_a_decision():
    """A new setting without an entry here (and its test) fails this; so does an entry whose
    test was renamed or deleted."""
    assert sorted(DECIDES) == sorted(setting_paths())
    for path, (module, name) in DECIDES.items():
        assert callable(getattr(module, name, None)), f"{path}: no test {name} in {module.__name__}"
        assert name.startswith("test_")


def test_quantum_sets_when_time_slices_turn():
    jobs = (job("a", 0, 1, 300), job("b", 10, 1, 300))
    minute, _ = run("1x1", "gandiva:-packing:slices.order=roundrobin:quantum=60", *jobs)
    half, _ = run("1x1", "gandiva:-packing:slices.order=roundrobin:quantum=30", *jobs)
    assert times(minute, A.Place, "b") == [60] and times(half, A.Place, "b") == [30]
    assert times(minute, A.Suspend)[:4] == [60, 120, 180, 240]
    assert times(half, A.Suspend)[:4] == [30, 60, 90, 120]
    assert len(times(half, A.Suspend)) > 1.5 * len(times(minute, A.Suspend))


def test_oversubscribe_time_slices_a_newcomer_instead_of_queueing_it():
    jobs = (job("a", 0, 1, 600), job("b", 10, 1, 300))
    over, _ = run("1x1", "gandiva:-packing:placement.oversubscribe", *jobs)
    queue, _ = run("1x1", "gandiva:-packing:-placement.oversubscribe", *jobs)
    assert times(over, A.Place, "b") == [60] and times(over, A.Suspend, "a") == [60]
    assert times(queue, A.Place, "b") == [600] and times(queue, A.Suspend) == []
    assert jcts(over)["b"] == pytest.approx(350) and jcts(queue)["b"] == pytest.approx(890)


def test_max_height_caps_how_many_jobs_share_a_server():
    jobs = (job("a", 0, 1, 600), job("b", 10, 1, 300))
    two, _ = run("1x1", "gandiva:-packing:admission.rule=queue:placement.max_height=2", *jobs)
    one, _ = run("1x1", "gandiva:-packing:admission.rule=queue:placement.max_height=1", *jobs)
    assert times(two, A.Place, "b") == [60] and times(two, A.Suspend, "a") == [60]
    assert times(one, A.Place, "b") == [600] and times(one, A.Suspend) == []


def test_scan_depth_limits_how_far_down_the_queue_a_job_is_placed():
    # a runs on one GPU of two; g (2 GPUs) waits for it at the head of the queue; c (1 GPU)
    # fits the free GPU, but only a scan that looks past the head finds it
    jobs = (job("a", 0, 1, 1000), job("g", 10, 2, 500), job("c", 20, 1, 300))
    spec = "gandiva:-placement.oversubscribe:admission.rule=queue:placement.scan_depth="
    deep, _ = run("1x2", spec + "2", *jobs)
    head, _ = run("1x2", spec + "1", *jobs)
    assert times(deep, A.Place, "c") == [20]
    assert times(head, A.Place, "c") == [1500]  # after g, which starts when a ends
    assert times(deep, A.Place, "g") == times(head, A.Place, "g") == [1000]


def test_slices_order_las_runs_a_newcomer_till_it_catches_up_round_robin_a_quantum():
    # a and b have had two turns each when c comes: least attained service runs c for two
    # quanta (to their service), round-robin for one, and levels (all under 1 GPU-hour; a
    # newcomer first, then first come first served, keeping its turn) to its end
    jobs = (job("a", 0, 1, 1200), job("b", 10, 1, 1200), job("c", 200, 1, 300))
    result = {order: run("1x1", f"gandiva:-packing:slices.order={order}", *jobs)[0]
              for order in ("las", "roundrobin", "levels")}
    for r in result.values():
        assert times(r, A.Place, "c") == [240]
    assert times(result["las"], A.Suspend, "c")[0] == 360
    assert times(result["roundrobin"], A.Suspend, "c")[0] == 300
    assert times(result["levels"], A.Suspend, "c") == []
    assert jcts(result["levels"])["c"] < jcts(result["las"])["c"] < jcts(result["roundrobin"])["c"]


def test_balance_suspends_a_long_served_job_on_another_server_for_a_newcomer():
    # c has run alone on server 1 for over an hour; a (just started) and b (new) share
    # server 0. With one order across the servers b ranks above c and takes c's server at
    # the round; without, b takes its turn from a, on their own server
    jobs = (job("x", 0, 1, 100), job("c", 1, 1, 20_000), job("a", 3990, 1, 1000),
            job("b", 4000, 1, 1000))
    one, sim = run("2x1", "gandiva:-packing:balance", *jobs)
    own, _ = run("2x1", "gandiva:-packing:-balance", *jobs)
    (t, place), = acts(one, A.Place, "b")
    assert t == 4020 and sim.cluster.servers_of(place.gpus) == {1}
    assert times(one, A.Suspend) == [4020] and times(one, A.Suspend, "c") == [4020]
    (t, place), = acts(own, A.Place, "b")
    assert t == 4020 and sim.cluster.servers_of(place.gpus) == {0}
    assert times(own, A.Suspend) == [4020] and times(own, A.Suspend, "a") == [4020]
    assert jcts(one)["a"] == pytest.approx(1000) and jcts(own)["a"] > 1900
    assert jcts(own)["c"] == pytest.approx(20_000) and jcts(one)["c"] > 20_900


def test_displace_margin_is_how_much_more_service_a_job_sent_back_has():
    # a has 1,000 GPU-seconds more than b when b arrives at a full cluster
    jobs = (job("a", 0, 1, 10_000), job("b", 1000, 1, 600))
    spec = "gandiva:placement.max_height=1:admission.rule=las:admission.displace_margin="
    wide, _ = run("1x1", spec + "3600", *jobs)
    narrow, _ = run("1x1", spec + "500", *jobs)
    assert times(wide, A.Suspend) == [] and times(wide, A.Place, "b") == [10_000]
    assert times(narrow, A.Suspend, "a") == [1000] and times(narrow, A.Place, "b") == [1000]
    assert jcts(narrow)["b"] == pytest.approx(600)


VAE_PAIR = (job("a", 0, 1, 900, model="vae"), job("b", 10, 1, 900, model="vae"))


def test_packing_packs_a_waiting_job_instead_of_time_slicing_it():
    packed, _ = run("1x1:P40", "gandiva:-slices.keep_turn:packing", *VAE_PAIR)
    sliced, _ = run("1x1:P40", "gandiva:-slices.keep_turn:-packing", *VAE_PAIR)
    assert times(packed, A.Pack, "b") == [120] and acts(packed, A.Unpack) == []
    assert acts(sliced, A.Pack) == [] and times(sliced, A.Resume, "b")[0] > 1000
    assert max(jcts(packed).values()) < 1300 < max(jcts(sliced).values())


def test_packing_min_gain_undoes_a_pair_that_does_not_beat_time_slicing_by_it():
    kept, sim = run("1x1:P40", "gandiva:-slices.keep_turn:packing.min_gain=0.05", *VAE_PAIR)
    (gain,) = sim.policy.packing.gains  # the pair's summed normalised throughput
    assert 1.5 < gain < 2.4
    undone, sim = run("1x1:P40", "gandiva:-slices.keep_turn:packing.min_gain=1.4", *VAE_PAIR)
    assert sim.policy.packing.gains == [pytest.approx(gain)]  # measured the same
    assert times(kept, A.Pack, "b") == times(undone, A.Pack, "b") == [120]
    assert acts(kept, A.Unpack) == []
    (t, _), = acts(undone, A.Unpack, "b")
    assert t > 120
    assert frozenset({"a", "b"}) in sim.policy.packing.bad_pairs
    assert max(jcts(undone).values()) > max(jcts(kept).values()) + 300


# s0 runs f (4 GPUs) till 500; s1 and s2 each run four 1-GPU jobs, two of which leave at
# about 100, so e1 and e2 (2 GPUs each) land across the two sockets of s1 and s2. When f
# leaves, both could move onto one socket of s0 each
SPREAD = (job("f", 0, 4, 500), job("a", 1, 1, 5000), job("b", 2, 1, 98), job("c", 3, 1, 97),
          job("d", 4, 1, 5000), job("g", 5, 1, 5000), job("h", 6, 1, 96), job("i", 7, 1, 95),
          job("j", 8, 1, 5000), job("e1", 150, 2, 3000, model="vgg16"),
          job("e2", 151, 2, 3000, model="vgg16"))


def test_migration_moves_a_job_spread_over_sockets_when_a_job_leaves():
    on, sim = run("3x4", "gandiva:migration", *SPREAD)
    off, _ = run("3x4", "gandiva:-migration", *SPREAD)
    assert decisions(on)[:11] == decisions(off)  # the same, till f leaves
    for e in ("e1", "e2"):
        (_, place), = acts(on, A.Place, e)
        assert sim.cluster.splits_sockets(place.gpus)
        (t, move), = acts(on, A.Migrate, e)
        assert t == 500 and sim.cluster.servers_of(move.gpus) == {0}
        assert not sim.cluster.splits_sockets(move.gpus)
    assert acts(off, A.Migrate) == []
    assert jcts(off)["e1"] > jcts(on)["e1"] + 1000  # vgg16 across sockets runs slower


def test_migration_max_moves_caps_the_moves_one_departure_makes():
    four, _ = run("3x4", "gandiva:migration.max_moves=4", *SPREAD)
    one, _ = run("3x4", "gandiva:migration.max_moves=1", *SPREAD)
    assert [(t, a.job_id) for t, a in acts(four, A.Migrate)] == [(500, "e1"), (500, "e2")]
    moves = [(t, a.job_id) for t, a in acts(one, A.Migrate)]
    assert moves[0] == (500, "e1")
    assert moves[1][1] == "e2" and moves[1][0] > 3000  # at a later departure (e1's)
    assert jcts(one)["e2"] > jcts(four)["e2"] + 500


# 2x4, no over-subscription: s0 and s1 each keep two long jobs after four short ones leave at
# about 100; big (4 GPUs), arriving at 200, could run if s0's two moved to s1's free GPUs
FRAGMENTED = (*(job(n, i, 1, 5000 if n in "abef" else 100, model="vae")
                for i, n in enumerate("abcdefgh")), job("big", 200, 4, 1000))


def test_defrag_interval_is_how_long_a_blocked_job_waits_for_a_try():
    spec = "gandiva:-placement.oversubscribe:defrag.interval="
    slow, _ = run("2x4", spec + "300", *FRAGMENTED)
    fast, _ = run("2x4", spec + "100", *FRAGMENTED)
    for r, t in ((slow, 500), (fast, 300)):
        assert [(u, a.job_id) for u, a in acts(r, A.Migrate)] == [(t, "a"), (t, "b")]
        assert times(r, A.Place, "big") == [t]
    assert jcts(fast)["big"] == pytest.approx(jcts(slow)["big"] - 200)


def test_defrag_max_move_s_leaves_dearer_moves_unmade():
    # a vae's move costs about 2 s (its profiled memory, Fig 13's slope)
    spec = "gandiva:-placement.oversubscribe:defrag.max_move_s="
    cheap, _ = run("2x4", spec + "10", *FRAGMENTED)
    dear, _ = run("2x4", spec + "1", *FRAGMENTED)
    assert {a.job_id for _, a in acts(cheap, A.Migrate)} == {"a", "b"}
    assert times(cheap, A.Place, "big") == [500]
    assert acts(dear, A.Migrate) == []
    assert times(dear, A.Place, "big")[0] > 5000  # when a and b end


ELASTIC = (job("e", 0, 1, 4000, min_gpus=1, max_gpus=4), job("n", 1000, 2, 100))


def test_elastic_grows_a_job_into_idle_gpus_and_shrinks_it_for_new_work():
    on, _ = run("1x4", "gandiva:elastic", *ELASTIC)
    off, _ = run("1x4", "gandiva:-elastic", *ELASTIC)
    (t, grow), *_ = acts(on, A.Grow, "e")
    assert t == 300 and len(grow.gpus) == 4
    assert times(on, A.Shrink, "e")[0] == 1000
    assert acts(off, A.Grow) == acts(off, A.Shrink) == []
    assert times(on, A.Place, "n") == times(off, A.Place, "n") == [1000]
    assert jcts(off)["e"] == pytest.approx(4000) and jcts(on)["e"] < 3000


def test_elastic_grow_idle_s_is_how_long_gpus_stay_idle_before_a_grow():
    late, _ = run("1x4", "gandiva:elastic.grow_idle_s=300", *ELASTIC)
    soon, _ = run("1x4", "gandiva:elastic.grow_idle_s=100", *ELASTIC)
    assert [t for t, _ in acts(late, A.Grow)] == [300, 1300]  # again after n ends, idle 300 s
    assert [t for t, _ in acts(soon, A.Grow)] == [100, 1100]
    assert times(late, A.Shrink) == times(soon, A.Shrink) == [1000]
    assert jcts(soon)["e"] < jcts(late)["e"] - 100
