"""The gandiva policy's hooks (``gandiva/policies/gandiva/framework.py``), each held to its
contract by a mechanism written here, outside the package (``toy_mechanisms.py``), with no
file under ``gandiva/policies/gandiva/`` edited for it."""

import pytest
import toy_mechanisms as toy
from conftest import job

from gandiva import actions as A
from gandiva.policies import make_policy
from gandiva.policies.gandiva import Gandiva, Mechanism, framework
from gandiva.policies.gandiva.config import parse
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.sim.engine import SimConfig, Simulator
from gandiva.state import Cluster

TWO_TYPES = "1x4:V100+1x4:K80"  # server 0 of V100s, server 1 of K80s


def run(cluster: str, policy: Gandiva | str, *jobs, **config):
    policy = make_policy(policy) if isinstance(policy, str) else policy
    sim = Simulator(Cluster.build(cluster), policy, jobs, reference_gpu="V100",
                    config=SimConfig(check_invariants=True, **config))
    return sim.run(), sim


def first_start(result, jid: str) -> tuple[float, tuple[int, ...]]:
    """When ``jid`` first got GPUs, and which."""
    return next((t, a.gpus) for t, a, _ in result.actions
                if isinstance(a, A.Place | A.Resume) and a.job_id == jid)


def plugged(*mechanisms: Mechanism, spec: str = "gandiva") -> Gandiva:
    name, *options = spec.split(":")
    return Gandiva(parse(name, options), plugins=mechanisms)


# ---- plugged in by name, from a spec ----------------------------------------------------

def test_a_scorer_plugged_in_by_name_sends_jobs_to_the_gpu_type_it_prefers():
    jobs = [job("a", 0, 1, 600), job("b", 10, 2, 600)]
    plain, _ = run(TWO_TYPES, "gandiva", *jobs)
    scored, sim = run(TWO_TYPES, "gandiva:plugins=prefer-k80", *jobs)
    k80 = set(sim.cluster.nodes[1].gpus)
    assert not set(first_start(plain, "a")[1]) & k80  # Algorithm 1: the lowest server id
    assert set(first_start(scored, "a")[1]) <= k80 and set(first_start(scored, "b")[1]) <= k80
    assert type(sim.policy.mechanisms[-1]).__name__ == "PreferType"


def test_a_per_user_order_plugged_in_by_name_lets_users_take_turns_in_the_queue():
    """Alice's second job arrived before Bob's first: in the queue (no over-subscription)
    Bob's goes first when the GPU frees."""
    jobs = [job("a1", 0, 1, 100, user="alice"), job("a2", 1, 1, 100, user="alice"),
            job("b1", 2, 1, 100, user="bob")]
    queue = "gandiva:-placement.oversubscribe:admission.rule=queue"
    plain, _ = run("1x1", queue, *jobs)
    turns, _ = run("1x1", queue + ":plugins=users-take-turns", *jobs)
    assert first_start(plain, "a2")[0] < first_start(plain, "b1")[0]
    assert first_start(turns, "b1")[0] < first_start(turns, "a2")[0]


def test_a_per_user_order_sets_the_slice_order_among_jobs_of_a_priority():
    """Over-subscribed, the three take turns on one GPU: Bob's first job takes the first
    turn that Alice's second would have had."""
    jobs = [job("a1", 0, 1, 1000, user="alice"), job("a2", 1, 1, 1000, user="alice"),
            job("b1", 2, 1, 1000, user="bob")]
    plain, _ = run("1x1", "gandiva:-packing", *jobs)
    turns, _ = run("1x1", "gandiva:-packing:plugins=users-take-turns", *jobs)
    assert first_start(plain, "a2")[0] < first_start(plain, "b1")[0]
    assert first_start(turns, "b1")[0] < first_start(turns, "a2")[0]


def test_an_unknown_plugin_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="plugins: no mechanism named 'nope'; known: .*prefer-k80"):
        make_policy("gandiva:plugins=nope")


# ---- each hook's contract ---------------------------------------------------------------

def test_filter_keeps_a_job_off_the_servers_it_refuses_even_when_they_are_free():
    """Algorithm 1 would start the second job at once on the free K80s; the filter lets it
    only on the V100 server, where it time-slices."""
    jobs = [job("a", 0, 4, 600, model="vgg16"), job("b", 10, 4, 600, model="vgg16")]
    result, sim = run(TWO_TYPES, plugged(toy.Only("vgg16", "V100")), *jobs)
    v100 = set(sim.cluster.nodes[0].gpus)
    gpus = {g for _, a, _ in result.actions if isinstance(a, A.Place | A.Resume) for g in a.gpus}
    assert gpus <= v100
    assert result.counts["suspends"] > 0  # they took turns
    assert all(r.finish is not None for r in result.jobs)


def test_permit_holds_a_job_in_the_queue_and_the_scan_goes_on_past_it():
    jobs = [job("a1", 0, 1, 100, user="alice"), job("a2", 1, 1, 100, user="alice"),
            job("b1", 2, 1, 100, user="bob")]
    result, _ = run("1x4", "gandiva:plugins=one-per-user", *jobs)
    assert first_start(result, "b1")[0] == 2  # past a2, held back
    assert first_start(result, "a2")[0] == pytest.approx(100, abs=1)  # once a1 left


def test_make_room_is_asked_with_the_choice_made_and_the_policy_chooses_again():
    """No server has a place for Bob's job (no over-subscription): the toy suspends Alice's,
    and Bob's starts on the GPU it freed; asked again later, Alice's is placed."""
    evict = toy.Evict()
    spec = "gandiva:-placement.oversubscribe:admission.rule=queue"
    jobs = [job("a", 0, 1, 1000, user="alice"), job("b", 10, 1, 100, user="bob")]
    result, _ = run("1x1", plugged(evict, spec=spec), *jobs)
    assert ("b", None) in evict.asked
    assert first_start(result, "b")[0] == 10
    suspended = [t for t, a, _ in result.actions if isinstance(a, A.Suspend) and a.job_id == "a"]
    assert suspended == [10]
    assert all(r.finish is not None for r in result.jobs)


def test_observe_acted_forget_and_after_decision_see_every_event_action_and_job():
    log = toy.Log()
    jobs = [job("a", 0, 1, 300), job("b", 5, 1, 300), job("c", 6, 2, 200)]
    result, sim = run("1x2", plugged(log), *jobs)
    assert log.events.count("Arrival") == 3 and log.events.count("Departure") == 3
    assert sorted(log.forgot) == ["a", "b", "c"]
    made = [type(a).__name__ for _, a, _ in result.actions if not isinstance(a, A.Control)]
    assert log.actions == made
    news = log.events.count("ProfileSample")  # news for the mechanisms alone: no placing
    assert log.decisions == len(log.events) - news > 0


def test_a_timer_kind_has_one_owner():
    class Grows(Mechanism):
        timers = {TimerKind.GROW: "grow"}

    with pytest.raises(ValueError, match="timer 'grow' has two owners: Elastic and Grows"):
        plugged(Grows())


def test_a_mechanism_that_says_nothing_of_time_or_samples_keeps_every_round_and_the_run():
    """Quiet puts a round off only when every mechanism votes that nothing but the slice
    order's levels moves with time: one that keeps the default votes keeps every round, and
    the decisions are those of the run that puts rounds off."""
    jobs = [job(f"j{i}", 30 * i, 1, 3000 + 500 * i) for i in range(12)]
    config = {"timeline": False}
    quiet, q = run("2x2", "gandiva:-packing", *jobs, **config)
    kept, k = run("2x2", plugged(toy.Log(), spec="gandiva:-packing"), *jobs, **config)
    assert q.policy.quiet.servers_put_off > 0 and k.policy.quiet.servers_put_off == 0
    assert kept.events > quiet.events
    assert {r.spec.id: r.finish for r in kept.jobs} == pytest.approx(
        {r.spec.id: r.finish for r in quiet.jobs})


def test_a_filter_holds_wherever_a_job_gets_gpus_moves_included_on_a_busy_cluster():
    """A busy stretch of Philly (gangs, packing, balancing moves, lowering heights,
    defragmentation, locality) on two GPU types: no job of the filtered models ever gets a
    GPU of the other type, by any action, and every job still finishes."""
    from test_quiet import philly_stretch

    jobs = philly_stretch(2500, 2800)
    models = ("milstm", "deepspeech", "scrnn")
    plugins = [toy.Only(m, "V100") for m in models]
    result, sim = run("3x4:V100+3x4:K80", plugged(*plugins), *jobs)
    k80 = {g.id for g in sim.cluster.gpus if g.type == "K80"}
    model = {j.id: j.model for j in jobs}
    kept = [(a.job_id, a.gpus) for _, a, _ in result.actions
            if model.get(getattr(a, "job_id", None)) in models and getattr(a, "gpus", ())]
    assert kept and not [x for x in kept if set(x[1]) & k80]
    servers: dict[str, set[int]] = {}
    for jid, gpus in kept:
        servers.setdefault(jid, set()).update(sim.cluster.servers_of(gpus))
    assert [jid for jid, on in servers.items() if len(on) > 1]  # some moved, and stayed in
    assert result.counts["packs"] > 0
    assert all(r.finish is not None for r in result.jobs)


def test_an_installed_package_s_mechanism_is_found_by_its_entry_point(tmp_path, monkeypatch):
    """A package declares ``[project.entry-points."gandiva.mechanisms"]``: a spec naming it
    plugs it in, with nothing registered by hand (as the CLI and the server find it)."""
    (tmp_path / "kind_mechanisms.py").write_text(
        "from gandiva.policies.gandiva import Mechanism\n"
        "class PreferK80(Mechanism):\n"
        "    def __init__(self, shared):\n"
        "        self.s = shared\n"
        "    def score(self, job, server, cluster):\n"
        "        return float(cluster.gpus[cluster.nodes[server].gpus[0]].type == 'K80')\n")
    info = tmp_path / "kind_mechanisms-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kind-mechanisms\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gandiva.mechanisms]\nkind-k80 = kind_mechanisms:PreferK80\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(framework.PLUGINS, "kind-k80", raising=False)
    result, sim = run(TWO_TYPES, "gandiva:plugins=kind-k80", job("a", 0, 1, 600))
    assert set(first_start(result, "a")[1]) <= set(sim.cluster.nodes[1].gpus)
    assert sim.policy.mechanisms[-1].s is sim.policy.s  # made on the policy's own state
    framework.PLUGINS.pop("kind-k80")
