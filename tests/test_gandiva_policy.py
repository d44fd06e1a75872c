"""The Gandiva policy's mechanisms, each decided on a small hand-built cluster."""

import pytest
from conftest import drive, hand_state, jcts, job

from gandiva import actions as A
from gandiva import events as E
from gandiva.metrics import summarize
from gandiva.policies import make_policy
from gandiva.policies.gandiva import Gandiva
from gandiva.policies.gandiva.admission import LasAdmission
from gandiva.policies.gandiva.book import Book
from gandiva.policies.gandiva.config import PlacementSettings
from gandiva.policies.gandiva.placement import Placer, choose_server
from gandiva.policies.gandiva.shared import Shared
from gandiva.sim.engine import SimConfig, Simulator
from gandiva.sim.perf import default_perf_model
from gandiva.spec import JobSpec
from gandiva.state import Cluster, JobStatus

PERF = default_perf_model()


def run(cluster: str, policy: str, *jobs: JobSpec, **config):
    sim = Simulator(Cluster.build(cluster), make_policy(policy), jobs, reference_gpu="V100",
                    config=SimConfig(check_invariants=True, **config))
    return sim.run(), sim


def acts(result, kind, job_id=None):
    return [(t, a) for t, a, _ in result.actions
            if isinstance(a, kind) and (job_id is None or a.job_id == job_id)]


def servers(cluster: Cluster, action) -> set[int]:
    return cluster.servers_of(action.gpus)


# ---- Algorithm 1: affinity placement -------------------------------------------------------

def newcomer(c: Cluster, n: int) -> object:
    jid = f"new{len(c.jobs)}"
    c.observe(E.Arrival(99, JobSpec(jid, 99, n, "resnet50", duration=1)))
    return c.jobs[jid]


def test_affinity_first_least_loaded_then_empty_then_any_then_oversubscribe():
    # s0: two 1-GPU jobs, s1: one 1-GPU job, s2: one 2-GPU job, s3: empty
    c, book = hand_state("4x4", {"a": (1, (0,)), "b": (1, (1,)), "c": (1, (4,)),
                                 "d": (2, (8, 9))})
    assert choose_server(newcomer(c, 1), c, book, 3.0, True) == (1, True)  # same affinity, lower
    assert choose_server(newcomer(c, 2), c, book, 3.0, True) == (2, True)  # same affinity
    assert choose_server(newcomer(c, 4), c, book, 3.0, True) == (3, True)  # empty server
    # no empty server left and no same-affinity room: any server with free GPUs
    c, book = hand_state("2x4", {"a": (2, (0, 1)), "b": (2, (2, 3)), "c": (1, (4,))})
    assert choose_server(newcomer(c, 2), c, book, 3.0, True) == (1, True)
    # full cluster: over-subscribe the same-affinity server with the lowest height
    c, book = hand_state("2x2", {"a": (1, (0,)), "b": (1, (1,)), "c": (2, (2, 3))})
    assert choose_server(newcomer(c, 1), c, book, 3.0, True) == (0, False)
    # no server of its affinity at all: over-subscribe the lowest of another (ours)
    c, book = hand_state("2x2", {"a": (1, (0,)), "b": (1, (1,)), "c": (1, (2,)),
                                 "d": (1, (3,)), "e": (1, ())})
    book.assign(c.jobs["e"], (0,))
    assert choose_server(newcomer(c, 2), c, book, 3.0, True) == (1, False)
    assert choose_server(newcomer(c, 1), c, book, 3.0, False) is None  # -oversubscribe: queue
    assert choose_server(newcomer(c, 1), c, book, 1.0, True) is None  # height cap reached


def test_multi_server_job_gets_whole_servers_of_one_rack():
    result, sim = run("3x4", "gandiva", job("small", 0, 1, 5000), job("big", 1, 8, 1000))
    (_, place), = acts(result, A.Place, "big")
    assert servers(sim.cluster, place) == {1, 2}
    assert jcts(result)["big"] == pytest.approx(1000)


# ---- time-slicing --------------------------------------------------------------------------

def test_oversubscribed_server_time_slices_with_the_quantum():
    result, _ = run("1x1", "gandiva:-packing:slices.order=roundrobin", job("a", 0, 1, 600),
                    job("b", 10, 1, 600))
    # b waits for the next round (rounds fall on multiples of the 60 s quantum), then a and
    # b alternate every 60 s
    (t_b, _), = acts(result, A.Place, "b")
    assert t_b == pytest.approx(60)
    suspends = [t for t, _ in acts(result, A.Suspend)]
    assert suspends[:3] == pytest.approx([60, 120, 180])
    r = {x.spec.id: x for x in result.jobs}
    assert r["b"].first_feedback - 10 < 60 + 100 * PERF.step_time("resnet50", "V100") + 1
    # both finish, sharing the GPU: each takes about twice its solo time
    assert 1100 < jcts(result)["a"] < 1300 and 1100 < jcts(result)["b"] < 1300


def test_suspend_delay_is_charged_back_to_the_resumed_job():
    p = make_policy("gandiva")
    c, book = hand_state("1x1", {"a": (1, (0,)), "b": (1, ())}, policy=p)
    book.assign(c.jobs["b"], (0,))
    c.apply(A.Suspend("a"))
    c.jobs["a"].memory_gb = 10.0
    book.last_start["b"] = 0.0
    c.now = 60.0
    for action in p.slicing.rotate(c, {0}, tick=True):
        c.apply(action)
    assert c.jobs["a"].status.value == "running"  # a had the GPU least recently (never: -inf)
    assert book.last_start["a"] == pytest.approx(60.0 - (0.05 + 0.06 * 10.0))


def test_gang_is_suspended_and_resumed_whole():
    result, _ = run("1x2", "gandiva:-packing:-slices.keep_turn", job("g", 0, 2, 300),
                    job("h", 5, 2, 300))
    for _, a in acts(result, A.Resume, "g"):
        assert len(a.gpus) == 2
    assert acts(result, A.Suspend, "g") and acts(result, A.Suspend, "h")
    for t in {t for _, _, t, _, _ in result.timeline}:  # every slice holds a whole gang
        assert sum(1 for seg in result.timeline if seg[2] == t) == 2


def test_gang_wider_than_a_server_time_slices_across_its_servers():
    # a and b fill both 2-GPU servers; the 4-GPU gang g over-subscribes both and takes its
    # turn on both at the next round, instead of waiting for them to empty
    result, sim = run("2x2", "gandiva:-packing:-slices.keep_turn", job("a", 0, 2, 600),
                      job("b", 0, 2, 600), job("g", 10, 4, 300))
    (t, place), = acts(result, A.Place, "g")
    assert t == pytest.approx(60) and servers(sim.cluster, place) == {0, 1}
    assert [t for t, _ in acts(result, A.Suspend, "a")][0] == pytest.approx(60)
    assert [t for t, _ in acts(result, A.Suspend, "b")][0] == pytest.approx(60)
    assert [t for t, _ in acts(result, A.Suspend, "g")][0] == pytest.approx(120)
    for _, a in acts(result, A.Resume, "g"):
        assert len(a.gpus) == 4
    assert jcts(result)["g"] < 1000  # alone after a and b it would finish at 1,200+


def test_a_gang_takes_only_the_gpus_it_uses_on_its_servers_and_a_narrow_job_has_the_rest():
    # g (6 GPUs) holds 4 + 2 GPUs of two 4-GPU servers, n the other 2 of the second; x and
    # y take turns on a 1-GPU server, so every server has a round each minute. Taking its
    # servers whole, g's turn at a round suspends n and leaves 2 GPUs idle
    trace = (job("g", 0, 6, 500), job("n", 10, 2, 400), job("x", 20, 1, 600),
             job("y", 30, 1, 600))  # (g stays under the first level: 3,600 GPU-s)
    result, sim = run("2x4+1x1", "gandiva:-packing:gangs.share=used", *trace)
    (_, place), = acts(result, A.Place, "g")
    assert sorted(len(sim.cluster.nodes[s].gpus) for s in servers(sim.cluster, place)) == [4, 4]
    assert acts(result, A.Suspend, "g") == acts(result, A.Suspend, "n") == []
    assert jcts(result)["g"] == pytest.approx(500) and jcts(result)["n"] == pytest.approx(400)
    result, _ = run("2x4+1x1", "gandiva:-packing:gangs.share=whole", *trace)
    assert [t for t, _ in acts(result, A.Suspend, "n")][0] == pytest.approx(60)
    assert jcts(result)["n"] > 400


def test_a_waiting_job_takes_its_turn_off_a_running_gangs_servers_where_there_is_room():
    # g (8 GPUs) runs on servers 0 and 1, y (4 GPUs) on server 2; w, a newcomer, waits on
    # server 0. At its first turn it takes one GPU: on server 0 that stops all of g, on
    # server 2 (no gang's home) only y
    trace = (job("g", 0, 8, 3000), job("y", 1, 4, 3000), job("w", 1000, 1, 300))
    result, sim = run("3x4", "gandiva:-packing:balance.spare_gangs", *trace)
    (t, place), = acts(result, A.Place, "w")
    assert t == pytest.approx(1020) and servers(sim.cluster, place) == {2}
    assert acts(result, A.Suspend, "g") == []
    assert [t for t, _ in acts(result, A.Suspend, "y")] == [pytest.approx(1020)]
    result, sim = run("3x4", "gandiva:-packing:-balance.spare_gangs", *trace)
    (t, place), = acts(result, A.Place, "w")
    assert t == pytest.approx(1020) and servers(sim.cluster, place) == {0}
    assert [t for t, _ in acts(result, A.Suspend, "g")] == [pytest.approx(1020)]


@pytest.mark.parametrize("idle_to_gangs", [True, False])
def test_a_waiting_gang_with_no_room_at_home_takes_the_gpus_a_round_leaves_idle(idle_to_gangs):
    # g (8 GPUs, less service than w) runs on servers 0 and 1, where w (8 GPUs) waits. x, a
    # gang with more service, waits on servers 2 and 3, but y takes a GPU of server 3 for its
    # first turn: x does not fit, and servers 2 and 4 would sit idle through the round
    p = make_policy(f"gandiva:{'' if idle_to_gangs else '-'}balance.idle_to_gangs")
    c, book = hand_state("5x4", {"g": (8, tuple(range(8))), "w": (8, ()), "x": (8, ()),
                                 "y": (1, ())}, policy=p)
    for jid, home, served in (("w", (0, 1), 40_000.0), ("x", (2, 3), 50_000.0),
                              ("y", (3,), 0.0)):
        book.assign(c.jobs[jid], home)
        c.jobs[jid].attained = served
        if served:
            book.last_start[jid] = 0.0  # it has had turns
    book.last_start["g"] = 0.0
    c.now = 600.0  # g: 4,800 GPU-seconds
    every = set(range(5))
    decided = list(p.slicing.rotate(c, every, tick=True, ready=p.slicing.rebalance(c, every)))
    placed = {a.job_id: servers(c, a) for a in decided if isinstance(a, A.Place | A.Resume)}
    if idle_to_gangs:  # on the servers no gang calls home first, then the roomiest
        assert placed == {"y": {3}, "w": {2, 4}}
        assert book.home["w"] == (2, 4)
    else:
        assert placed == {"y": {3}}
        assert book.home["w"] == (0, 1)
    assert not [a for a in decided if isinstance(a, A.Suspend)]


def test_narrow_job_takes_turns_with_a_running_gang():
    result, _ = run("2x2", "gandiva:-packing:slices.order=roundrobin", job("g", 0, 4, 1000),
                    job("c", 10, 1, 300))
    (t, _), = acts(result, A.Place, "c")
    assert t == pytest.approx(60)
    assert [t for t, _ in acts(result, A.Suspend, "g")][0] == pytest.approx(60)
    assert jcts(result)["c"] < 1000


def test_priority_is_never_inverted():
    high = job("high", 0, 1, 600, priority=5)
    result, _ = run("1x1", "gandiva", high, job("low", 10, 1, 300))
    assert acts(result, A.Suspend, "high") == []
    assert jcts(result)["high"] == pytest.approx(600)
    # a higher-priority newcomer takes the GPU at the next round
    result, _ = run("1x1", "gandiva:-packing", job("low", 0, 1, 600),
                    job("high", 10, 1, 300, priority=5))
    (t, _), = acts(result, A.Suspend, "low")
    assert t == pytest.approx(60) and acts(result, A.Suspend, "high") == []


def test_priority_change_while_running_takes_effect_at_once():
    result, _ = run("1x1", "gandiva:-packing:quantum=1000", job("a", 0, 1, 600, priority=1),
                    job("b", 10, 1, 600), priority_changes=[(100.0, "b", 9)])
    (t, _), = acts(result, A.Suspend, "a")
    assert t == pytest.approx(100)
    assert acts(result, A.Suspend, "b") == []


def test_priority_changes_at_one_instant_are_carried_out_together():
    # a controller (a sweep promoting its top trials) raises b, then c above it, at once:
    # c takes the GPU; b, outranked before it ran a mini-batch, is not started and stopped
    result, _ = run("1x1", "gandiva:-packing:quantum=1000", job("a", 0, 1, 600),
                    job("b", 10, 1, 600), job("c", 20, 1, 600),
                    priority_changes=[(100.0, "b", 1), (100.0, "c", 2)])
    assert [t for t, _ in acts(result, A.Suspend, "a")] == [pytest.approx(100)]
    assert [t for t, _ in acts(result, A.Place, "c")] == [pytest.approx(100)]
    assert acts(result, A.Suspend, "b") == []
    assert [t for t, _ in acts(result, A.Place, "b")] == [pytest.approx(700)]  # after c


def test_lower_priority_job_migrates_away_instead_of_stopping():
    p = make_policy("gandiva")
    c, book = hand_state("2x1", {"low": (1, (0,)), "high": (1, ())}, policy=p)
    c.jobs["high"].priority = 5
    book.assign(c.jobs["high"], (0,))
    decided = []
    for action in p.slicing.rotate(c, {0}, tick=True):
        c.apply(action)
        decided.append(action)
    assert decided == [A.Migrate("low", (1,)), A.Place("high", (0,))]


# ---- introspection: packing ----------------------------------------------------------------

def test_packing_kept_when_it_beats_time_slicing():
    # (without keep_turn_in_level b, which takes the GPU for its first turn, is the guest)
    result, _ = run("1x1:P40", "gandiva:-slices.keep_turn", job("a", 0, 1, 900, model="vae"),
                    job("b", 10, 1, 900, model="vae"))
    assert acts(result, A.Pack, "b")
    assert acts(result, A.Unpack) == []
    # packed, both finish far sooner than the ~1,800 s time-slicing would take
    assert max(jcts(result).values()) < 1300


def test_a_packed_pair_stays_packed_through_the_rounds_its_gpu_mate_runs_on_if_not_above():
    """Rounds go on while y waits for x's GPU (they do not fit one together); on the other
    GPU a and b pack. A round gives that GPU's one place to a, and b is not suspended at every
    round only for packing to pack it again (a suspend and a resume each quantum)."""
    specs = (job("x", 0, 1, 1800, model="inception4"), job("a", 5, 1, 1800, model="vae"),
             job("y", 10, 1, 1800, model="inception4"), job("b", 15, 1, 1800, model="vae"))
    result, _ = run("2x1:K80", "gandiva:-slices.keep_turn", *specs)
    (t_pack, _), = acts(result, A.Pack, "b")  # once b has run alone (its profile)
    # until x reaches its next attained-service level (one GPU-hour), the rounds change
    # nothing, and go on
    assert t_pack < 600 and [t for t, _ in acts(result, A.Wake) if t_pack < t < 3600]
    assert [t for t, _ in acts(result, A.Suspend, "b") if t_pack < t < 3600] == []
    # but not beside a job of higher priority: raised, a slows down for nobody below it
    raised, _ = run("2x1:K80", "gandiva:-slices.keep_turn", *specs,
                    priority_changes=[(300.0, "a", 5)])
    assert [t for t, _ in acts(raised, A.Suspend, "b") if t_pack < t < 3600] == [300.0]
    assert len(acts(raised, A.Pack, "b")) == 1


def test_a_waiting_job_is_never_packed_onto_a_job_of_higher_priority():
    # low runs first (so it is profiled alone); high takes the GPU at the next round. The
    # pair packs well (test_packing_kept_when_it_beats_time_slicing), but packing low beside
    # high would slow high down for a lower job: low waits for the GPU instead
    high = job("high", 10, 1, 900, model="vae", priority=5)
    alone, _ = run("1x1:P40", "gandiva", high)
    result, _ = run("1x1:P40", "gandiva", job("low", 0, 1, 900, model="vae"), high)
    assert acts(result, A.Pack) == []
    (t, _), = acts(result, A.Suspend, "low")
    assert jcts(result)["high"] == pytest.approx(t - high.submit_time + jcts(alone)["high"])


def test_a_packed_job_out_of_its_memory_share_leaves_the_gpu_and_never_pairs_there_again():
    p = make_policy("gandiva")
    c, book = hand_state("1x2", {"a": (1, (0,)), "b": (1, ()), "c": (1, (1,))}, policy=p)
    for jid in "abc":
        c.jobs[jid].memory_gb, c.jobs[jid].utilization = 4.0, 0.3
    c.apply(A.Pack("b", (0,)))
    book.assign(c.jobs["b"], (0,))
    decided = []
    for action in p.decide(E.OutOfMemory(50.0, "b"), c):
        c.apply(action)
        decided.append(action)
    # it waits for its turn: its server takes a round at the next quantum
    assert decided == [A.Unpack("b"), A.Wake(60.0)]
    assert frozenset({"a", "b"}) in p.packing.bad_pairs
    assert not p.packing.may_pair(c.jobs["a"], c.jobs["b"], 16.0)  # never again...
    assert p.packing.may_pair(c.jobs["c"], c.jobs["b"], 16.0)  # ...there; elsewhere it may
    assert list(p.decide(E.OutOfMemory(60.0, "c"), c)) == []  # alone on its GPU: a crash


def test_jobs_of_unknown_utilisation_pack_on_memory_alone_after_those_known():
    """A MIG instance has no per-process utilisation: its jobs are packed on memory alone
    (least utilised first, the unknown after), and the trial still judges the pair."""
    p = make_policy("gandiva")
    c, book = hand_state("1x1", {"b": (1, (0,)), "a": (1, ()), "k": (1, ())}, policy=p)

    def sample(jid, utilization, memory=4.0):
        event = E.ProfileSample(c.now, jid, 0.1, memory, utilization, 10)
        c.observe(event)
        p.packing.record(c, event)

    for guest, utilization in (("b", None), ("k", 0.2)):  # each profiled running alone
        if guest != "b":
            c.apply(A.Place(guest, (0,)))
        sample(guest, utilization)
        c.apply(A.Suspend(guest))
        book.assign(c.jobs[guest], (0,))
    c.apply(A.Place("a", (0,)))
    book.assign(c.jobs["a"], (0,))
    sample("a", None)  # the host: its utilisation unknown too
    waiting = [c.jobs["b"], c.jobs["k"]]
    assert p.packing.guests(waiting) == waiting
    packs = [x for x in p.packing.try_pack(c, 0, waiting) if isinstance(x, A.Pack)]
    assert packs and packs[0].job_id == "k"  # known (0.2) before unknown
    c.jobs["k"].memory_gb = None  # memory unknown: never paired
    assert p.packing.guests([c.jobs["k"]]) == []


def test_packing_undone_when_it_does_not_pay():
    result, sim = run("1x1:P40", "gandiva:-slices.keep_turn", job("a", 0, 1, 900, model="lstm"),
                      job("b", 10, 1, 900, model="lstm"))
    (t_pack, _), = acts(result, A.Pack, "b")
    (t_unpack, _), = acts(result, A.Unpack, "b")
    assert t_unpack > t_pack
    assert frozenset({"a", "b"}) in sim.policy.packing.bad_pairs
    assert sim.policy.packing.gains[0] < 1.0


def test_a_packed_job_takes_a_gpu_that_stays_free_on_another_server():
    """``spread_packed``: b takes e's GPU for its first turn, and e packs beside c on server
    1. a ends on server 0; a quantum later, its GPU still free, e (the guest) resumes there
    beside d instead of running on packed beside c, and c and e end sooner. Without it the
    pair stays packed till a GPU of its own server comes free."""
    jobs = (job("a", 0, 1, 600, model="vae"), job("d", 0, 1, 4000, model="vae"),
            job("c", 1, 1, 3000, model="vae"), job("e", 1, 1, 4000, model="vae"),
            job("b", 10, 1, 3000, model="vae"))
    spread, _ = run("2x2:P40", "gandiva", *jobs)
    assert [a.gpus for _, a in acts(spread, A.Pack, "e")] == [(2,)]
    finish = {r.spec.id: r.finish for r in spread.jobs}
    (t, _), = acts(spread, A.Unpack, "e")
    assert t == pytest.approx(finish["a"] + 60)
    assert [(u, a.gpus) for u, a in acts(spread, A.Resume, "e")] == [(t, (0,))]
    packed, _ = run("2x2:P40", "gandiva:-packing.spread", *jobs)
    (t, _), = acts(packed, A.Unpack, "e")
    assert t > 3000
    for j in ("c", "e"):
        assert jcts(spread)[j] < jcts(packed)[j] - 100


def test_a_packed_job_leaves_a_freed_gpu_to_a_newcomer_and_an_empty_server_empty():
    """``spread_packed`` waits a quantum: f, arriving 12 s after a ends, takes a's GPU, and e
    stays packed till f ends too, a quantum after which it takes the GPU. And a server left
    empty stays empty (a gang may want it whole): c stays packed beside b to the end."""
    jobs = (job("a", 0, 1, 600, model="vae"), job("d", 0, 1, 4000, model="vae"),
            job("c", 1, 1, 3000, model="vae"), job("e", 1, 1, 4000, model="vae"),
            job("b", 10, 1, 3000, model="vae"), job("f", 750, 1, 1000, model="vae"))
    result, _ = run("2x2:P40", "gandiva", *jobs)
    finish = {r.spec.id: r.finish for r in result.jobs}
    assert finish["a"] < 750 < finish["a"] + 60
    assert [(t, a.gpus) for t, a in acts(result, A.Place, "f")] == [(750, (0,))]
    (t, _), = acts(result, A.Unpack, "e")
    assert t == pytest.approx(finish["f"] + 60)
    alone, _ = run("2x1:P40", "gandiva", job("a", 0, 1, 600, model="vae"),
                   job("c", 1, 1, 3000, model="vae"), job("b", 10, 1, 3000, model="vae"))
    assert acts(alone, A.Pack, "c") and acts(alone, A.Unpack) == []


def test_no_packing_when_memory_does_not_fit():
    result, _ = run("1x1:K80", "gandiva", job("a", 0, 1, 600, model="vgg16"),
                    job("b", 10, 1, 600, model="vgg16"))  # 9 GB each on a 12 GB GPU
    assert acts(result, A.Pack) == []


# ---- introspection: migration and defragmentation ------------------------------------------

def test_locality_migration_when_a_job_leaves():
    # s0 runs f (4 GPUs, until 500); s1 gets a, b, c, d; b and c leave at 100, so the 2-GPU
    # job e (150) lands across s1's two sockets; when f leaves, e moves onto one socket of s0
    trace = (job("f", 0, 4, 500), job("a", 1, 1, 5000), job("b", 2, 1, 98),
             job("c", 3, 1, 97), job("d", 4, 1, 5000), job("e", 150, 2, 3000, model="vgg16"))
    result, sim = run("2x4", "gandiva", *trace)
    (t, move), = acts(result, A.Migrate, "e")
    assert t == pytest.approx(500)
    sockets = {sim.cluster.gpus[g].socket for g in move.gpus}
    assert servers(sim.cluster, move) == {0} and len(sockets) == 1


def test_defragmentation_empties_a_server_for_a_waiting_gang():
    small = [job(n, i, 1, 5000 if n in "abef" else 100, model="vae")
             for i, n in enumerate("abcdefgh")]
    # without over-subscription the 4-GPU job must wait for a whole server
    result, sim = run("2x4", "gandiva:-placement.oversubscribe", *small, job("big", 200, 4, 1000))
    moves = acts(result, A.Migrate)
    assert {a.job_id for _, a in moves} == {"a", "b"}  # s0's survivors move to s1
    (t, place), = acts(result, A.Place, "big")
    assert t == pytest.approx(200 + 300)  # at the first defragmentation round
    assert servers(sim.cluster, place) == {0}
    # without defragmentation the gang waits for the long jobs
    result, _ = run("2x4", "gandiva:-placement.oversubscribe:-defrag", *small,
                    job("big", 200, 4, 1000))
    (t, _), = acts(result, A.Place, "big")
    assert t > 4000


# ---- introspection: grow and shrink --------------------------------------------------------

def test_grow_after_idle_timeout_then_shrink_at_once_for_new_work():
    elastic = job("e", 0, 1, 4000, min_gpus=1, max_gpus=4)
    result, sim = run("1x4", "gandiva", elastic, job("n", 1000, 2, 100))
    (t_grow, grow), *_ = acts(result, A.Grow, "e")
    assert t_grow == pytest.approx(300) and len(grow.gpus) == 4
    (t_shrink, shrink), *_ = acts(result, A.Shrink, "e")
    assert t_shrink == pytest.approx(1000) and len(shrink.gpus) == 1
    (t_n, _), = acts(result, A.Place, "n")
    assert t_n == pytest.approx(1000)
    assert jcts(result)["n"] == pytest.approx(100)
    # growing made the elastic job finish sooner than its 4,000 s alone on one GPU
    assert jcts(result)["e"] < 4000


# ---- failures ------------------------------------------------------------------------------

def test_job_on_a_failed_server_restarts_elsewhere_from_its_checkpoint():
    result, sim = run("2x1", "gandiva", job("a", 0, 1, 1000), failures=[(700.0, 0)],
                      checkpoint_interval=300.0)
    places = acts(result, A.Place, "a")
    assert [servers(sim.cluster, a) for _, a in places] == [{0}, {1}]
    restore = PERF.migration_time(PERF.profile("resnet50").checkpoint_mb, True)
    assert jcts(result)["a"] == pytest.approx(1000 + 100 + restore)


def test_every_bundled_mechanism_keeps_the_invariants_on_a_busy_cluster():
    trace = [job(f"j{i}", 7 * i, [1, 1, 1, 2, 4][i % 5], 300 + 37 * (i % 11),
                 model=["vae", "lstm", "resnet50", "superresolution", "rhn"][i % 5],
                 **({"min_gpus": 1, "max_gpus": 4} if i % 13 == 0 else {}))
             for i in range(120)]
    result, _ = run("3x4", "gandiva", *trace)  # check_invariants after every event
    s = summarize(result)
    assert s["finished"] == 120
    assert s["suspends"] > 0


# ---- servers joining ------------------------------------------------------------------------

def test_a_joining_server_takes_the_time_sliced_jobs_of_an_oversubscribed_one():
    sched, actions = drive("1x1", "gandiva", *(E.Arrival(t, job(jid, t, 1, 1000))
                                               for t, jid in enumerate("abc")), E.Tick(60.0))
    cluster, p = sched.cluster, sched.policy
    assert cluster.jobs["a"].status is JobStatus.SUSPENDED  # b's turn; c waits for one
    assert p.book.height(0) == 3.0
    before = len(actions)
    sched.handle(E.Join(70.0, 2, "V100", 16.0))
    cluster.check_invariants()
    moved = [(type(a), a.job_id, servers(cluster, a)) for a in actions[before:]]
    assert moved == [(A.Resume, "a", {1}), (A.Place, "c", {1})]
    assert p.book.size == [1, 2] and p.book.height(0) == 1.0 and p.book.height(1) == 1.0


def test_a_time_sliced_gang_moves_whole_onto_a_joining_server():
    sched, actions = drive("2x2", "gandiva", E.Arrival(0.0, job("g", 0, 4, 1000)),
                           E.Arrival(1.0, job("h", 1, 4, 1000)))
    p = sched.policy
    assert p.book.home["h"] == (0, 1) and sched.cluster.jobs["h"].status is JobStatus.QUEUED
    sched.handle(E.Join(10.0, 4, "V100", 16.0))
    (place,) = [a for a in actions if isinstance(a, A.Place) and a.job_id == "h"]
    assert servers(sched.cluster, place) == {2} and p.book.home["h"] == (2,)
    assert p.book.height(0) == p.book.height(1) == p.book.height(2) == 1.0


@pytest.mark.parametrize("policy", ["gandiva:placement.max_height=1",
                                    "gandiva:-placement.oversubscribe"])
def test_jobs_that_found_no_server_start_on_a_joining_one(policy):
    sched, _ = drive("1x1", policy, E.Arrival(0.0, job("a", 0, 1, 1000)),
                     E.Arrival(1.0, job("b", 1, 1, 1000)))
    assert "b" in sched.policy.waiting
    sched.handle(E.Join(10.0, 1, "V100", 16.0))
    b = sched.cluster.jobs["b"]
    assert b.status is JobStatus.RUNNING and sched.cluster.servers_of(b.gpus) == {1}
    assert "b" not in sched.policy.waiting and sched.policy.book.home["b"] == (1,)


def test_the_book_covers_a_server_that_joined_before_the_first_decision():
    sched, _ = drive("1x1", "gandiva", E.Join(0.0, 2, "V100", 16.0),
                     E.Arrival(1.0, job("a", 1, 2, 100)))
    assert sched.policy.book.size == [1, 2] and sched.policy.book.home["a"] == (1,)


def test_the_books_gang_index_names_on_each_server_exactly_its_members_that_span_servers():
    c = Cluster.build("3x2")
    book = Book.of(c)
    for i, n in enumerate((4, 1, 2, 4)):
        c.observe(E.Arrival(i, JobSpec(f"j{i}", i, n, "resnet50", duration=1e6)))

    def index_is_right() -> None:
        for s in range(3):
            spans = {j for j in book.members[s] if len(book.home[j]) > 1}
            assert set(book.gangs[s]) == spans

    book.assign(c.jobs["j0"], (0, 1))
    book.assign(c.jobs["j1"], (0,))
    book.assign(c.jobs["j2"], (2,))
    book.assign(c.jobs["j3"], (1, 2))
    index_is_right()
    assert set(book.gangs[1]) == {"j0", "j3"} and set(book.gangs[2]) == {"j3"}
    book.assign(c.jobs["j0"], (2, 0))  # a gang moved: its old server no longer names it
    index_is_right()
    assert set(book.gangs[1]) == {"j3"} and set(book.gangs[2]) == {"j0", "j3"}
    book.assign(c.jobs["j3"], (1,))  # a gang assigned to one server is no gang there
    book.release(c.jobs["j0"])
    index_is_right()
    assert book.gangs == [{}, {}, {}]


# ---- beyond the paper: least-attained-service admission ------------------------------------

def test_full_cluster_admits_a_newcomer_in_place_of_the_most_served_job():
    trace = (job("old", 0, 1, 10_000), job("new", 5000, 1, 600))
    result, _ = run("1x1", "gandiva:placement.max_height=1:admission.rule=las", *trace)
    (t, _), = acts(result, A.Suspend, "old")
    (t_new, _), = acts(result, A.Place, "new")
    assert t == t_new == pytest.approx(5000)
    assert jcts(result)["new"] == pytest.approx(600)
    # the paper's behaviour: the newcomer queues until the long job is done
    result, _ = run("1x1", "gandiva:placement.max_height=1:admission.rule=queue", *trace)
    assert acts(result, A.Suspend) == []
    assert jcts(result)["new"] == pytest.approx(5000 + 600)


def test_no_displacement_between_jobs_of_similar_age_or_of_higher_priority():
    young = (job("a", 0, 1, 10_000), job("b", 1000, 1, 600))  # a has only 1,000 GPU-s more
    result, _ = run("1x1", "gandiva:placement.max_height=1:admission.rule=las", *young)
    assert acts(result, A.Suspend) == []
    vip = (job("a", 0, 1, 10_000, priority=3), job("b", 5000, 1, 600))
    result, _ = run("1x1", "gandiva:placement.max_height=1:admission.rule=las", *vip)
    assert acts(result, A.Suspend) == []


def test_a_big_gang_with_no_place_sends_back_just_enough_long_served_jobs_to_get_one():
    # every server is at max_height: the gang at the head sends back the most served job of
    # each server it needs (the head may pass the cap by one GPU), not every job on them
    small = [job(f"s{i}", 0, 1, 20_000) for i in range(8)]
    result, sim = run("2x4", "gandiva:placement.max_height=1:admission.rule=las", *small,
                      job("gang", 5000, 8, 400))  # (under the first level: 3,600 GPU-s)
    sent_back = [a.job_id for t, a in acts(result, A.Suspend) if t == pytest.approx(5000)]
    assert len(sent_back) == 2
    (t, place), = acts(result, A.Place, "gang")
    assert t < 5000 + 60 and len(place.gpus) == 8  # at its first round
    assert jcts(result)["gang"] < 400 + 60
    assert len(jcts(result)) == 9


def test_a_long_served_gang_sent_back_for_a_newcomer_gang_leaves_all_its_servers():
    trace = (job("old", 0, 8, 20_000), job("new", 5000, 8, 1000))
    result, _ = run("2x4", "gandiva:placement.max_height=1:admission.rule=las", *trace)
    (t, _), = acts(result, A.Suspend, "old")
    (t_new, place), = acts(result, A.Place, "new")
    assert t == t_new == pytest.approx(5000) and len(place.gpus) == 8
    assert jcts(result)["new"] == pytest.approx(1000)
    assert jcts(result)["old"] == pytest.approx(21_000, rel=0.01)


def test_a_newcomer_displaces_a_long_served_job_of_its_width_on_a_server_of_another_affinity():
    # the server takes the 2-GPU job's affinity; the 1-GPU jobs fill its free GPUs, and
    # "new" finds no place under max_height. Displacing only on servers of the newcomer's own
    # affinity found no victim in 731,806 tries on gavel-philly-6c71a0 (long queue)
    trace = (job("wide", 0, 2, 40_000), job("old1", 10, 1, 40_000), job("old2", 20, 1, 40_000),
             job("new", 20_000, 1, 600))
    result, _ = run("1x4", "gandiva:placement.max_height=1:admission.rule=las", *trace)
    (t_new, _), = acts(result, A.Place, "new")
    assert t_new == pytest.approx(20_000)
    (t_old, _), = [a for a in acts(result, A.Suspend) if a[1].job_id.startswith("old")][:1]
    assert t_old == pytest.approx(20_000)
    assert jcts(result)["new"] == pytest.approx(600)
    assert len(jcts(result)) == 4  # the one sent back to the queue finished later


def test_a_big_gang_with_a_place_under_max_height_takes_its_turns_there_and_clears_nothing():
    # with room to over-subscribe, the gang time-slices as any job does: clearing servers is
    # for when there is no place at all (it changed short-queue cells where places abound)
    small = [job(f"s{i}", 0, 1, 20_000) for i in range(8)]
    result, _ = run("2x4", "gandiva:placement.max_height=2:admission.rule=las", *small,
                    job("gang", 5000, 8, 1000))
    (t, _), = acts(result, A.Place, "gang")
    assert t > 5000  # at its first round, not at its arrival
    assert not [a for a in acts(result, A.Suspend) if a[0] == pytest.approx(5000)]
    assert len(jcts(result)) == 9


# ---- the arrival shortcut ---------------------------------------------------------------------
def busy_jobs(trace_name: str, count: int, faster: float = 4):
    """The first ``count`` jobs of a bundled trace that run under an hour, arriving
    ``faster`` times as fast: a long queue on a small cluster, simulated in a second."""
    import dataclasses

    from gandiva.traces import load_trace

    jobs = sorted((j for j in load_trace(trace_name).jobs if (j.duration or 0) <= 3600),
                  key=lambda j: j.submit_time)[:count]
    t0 = jobs[0].submit_time
    return [dataclasses.replace(j, submit_time=(j.submit_time - t0) / faster) for j in jobs]


@pytest.mark.parametrize("trace_name,cluster,count", [("philly", "4x4", 300),
                                                      ("pollux-1", "4x4", 160)])
def test_an_arrival_after_a_scan_that_placed_nothing_decides_exactly_as_a_full_rescan(
        trace_name, cluster, count, monkeypatch):
    """Starting an arrival's scan at the newcomer (the jobs before it just failed in the
    same state) changes no decision: the same actions at the same times, the same JCTs."""
    jobs = busy_jobs(trace_name, count)

    def simulate():  # (the shortcut is off with admission.rule=las, the default)
        policy = make_policy("gandiva:admission.rule=queue")
        result = Simulator(Cluster.build(cluster), policy, jobs, reference_gpu="V100").run()
        return result, policy.scans_from_arrival

    fast, shortcuts = simulate()
    monkeypatch.setattr(Gandiva, "_scan_start", lambda self, cluster, arrived: 0)  # a full scan
    full, none = simulate()
    assert shortcuts > count // 5 and none == 0  # the queue was long: taken often
    assert fast.actions == full.actions
    assert jcts(fast) == jcts(full)


@pytest.mark.parametrize("trace_name,cluster,count", [("philly", "4x4", 300),
                                                      ("pollux-1", "4x4", 160)])
def test_a_scan_that_found_no_job_to_send_back_for_a_width_decides_as_one_that_looks_again(
        trace_name, cluster, count, monkeypatch):
    """Within a scan of the queue, a job finds no job to send back (``displace``) where one
    before it of its width, no lower priority and no more service, found none, until a job is
    placed: skipping the look changes no decision, and saves most looks."""
    jobs = busy_jobs(trace_name, count)
    looks = []
    real = LasAdmission.most_served

    def counted(self, cluster, job, floor):
        looks.append(job.id)
        return real(self, cluster, job, floor)

    monkeypatch.setattr(LasAdmission, "most_served", counted)

    def simulate():
        looks.clear()
        result = Simulator(Cluster.build(cluster), make_policy("gandiva"), jobs,
                           reference_gpu="V100").run()
        return result, len(looks)

    memo, n_memo = simulate()
    monkeypatch.setattr(LasAdmission, "found_none_before", lambda self, job, attained: False)
    full, n_full = simulate()
    assert n_memo < n_full / 2
    assert memo.actions == full.actions
    assert jcts(memo) == jcts(full)


def algorithm_1(job, c: Cluster, book: Book, max_height: float, head: bool):
    """Algorithm 1 as the paper states it, by looking at every server (the specification
    that the book's indexes must answer exactly as)."""
    n, groups = job.num_gpus, {k: [] for k in ("same", "empty", "other", "crowded", "mixed")}
    for node in c.nodes:
        s, free = node.id, len(c.free_gpus(node.id))
        if not node.up or node.size < n:
            continue
        aff = book.affinity(s)
        if aff is None and free == node.size:
            groups["empty"].append(s)
        elif free >= n:
            groups["same" if aff == n else "other"].append(s)
        elif (book.demand[s] + (1 if head else n)) / node.size <= max_height:
            groups["crowded" if aff == n else "mixed"].append(s)
    for kind, starts in (("same", True), ("empty", True), ("other", True), ("crowded", False),
                         ("mixed", False)):
        if groups[kind]:
            return min(groups[kind], key=lambda s: (book.height(s), s)), starts
    return None


@pytest.mark.parametrize("seed", range(30))
def test_indexed_placement_chooses_exactly_the_server_algorithm_1_chooses(seed):
    """The book indexes servers by height and affinity so that an arrival looks at few of
    them; on random busy states (some servers down) it picks what a scan of all would."""
    import random

    rng = random.Random(seed)
    c = Cluster.build(rng.choice(["6x4", "8x2", "5x8"]))
    book = Book.of(c)
    for i in range(rng.randint(5, 60)):
        n = rng.choice([1, 1, 1, 2, 4, c.nodes[0].size])
        c.observe(E.Arrival(i, JobSpec(f"j{i}", i, n, "resnet50", duration=1e6)))
        j = c.jobs[f"j{i}"]
        s = rng.randrange(len(c.nodes))
        free = c.free_gpus(s)
        if len(free) >= n and rng.random() < 0.6:
            c.apply(A.Place(j.id, tuple(free[:n])))
        book.assign(j, (s,))
        if rng.random() < 0.15:  # some leave again
            book.release(j)
    for node in c.nodes:
        if rng.random() < 0.1:
            c.observe(E.Failure(99, node.id))
    assert list(book.by_height) == sorted((book.height(s), s) for s in range(len(c.nodes)))
    for n in (1, 2, 4, c.nodes[0].size):
        for height in (1.0, 2.0, 8.0):
            for head in (False, True):
                want = algorithm_1(newcomer(c, n), c, book, height, head)
                assert choose_server(newcomer(c, n), c, book, height, True, head=head) == want
                # the scan the mechanisms' filters and scores take: Algorithm 1 when they
                # refuse nothing and score every server alike
                hooked = Placer(PlacementSettings(max_height=height),
                                Shared(60.0, filters=[lambda job, s, c: True]),
                                [lambda job, s, c: 1.0])
                assert hooked.choose(newcomer(c, n), c, book, head) == want


def test_judging_only_the_trials_whose_jobs_changed_decides_exactly_as_judging_all():
    """Packing trials are looked at only when one of their jobs changed (a packed sample, an
    action, a stop); looking at every trial after every event makes the same decisions."""
    import dataclasses

    from gandiva.policies.gandiva.packing import Trials
    from gandiva.traces import load_trace

    jobs = sorted((j for j in load_trace("philly").jobs if (j.duration or 0) <= 3600),
                  key=lambda j: j.submit_time)[:600]
    t0 = jobs[0].submit_time
    jobs = [dataclasses.replace(j, submit_time=(j.submit_time - t0) / 4) for j in jobs]

    class Every(Trials):
        def take_changed(self):
            super().take_changed()
            return list(self.host.items())

    looked = []

    class Counted(Trials):
        def take_changed(self):
            changed = super().take_changed()
            looked.append(len(changed))
            return changed

    def simulate(trials):
        policy = make_policy("gandiva")
        policy.trials = trials
        return Simulator(Cluster.build("4x4"), policy, jobs, reference_gpu="V100").run()

    fast, full = simulate(Counted()), simulate(Every())
    assert fast.counts["packs"] > 20 and fast.counts["unpacks"] > 0  # trials were judged
    assert fast.actions == full.actions
    assert jcts(fast) == jcts(full)


def test_slices_by_level_give_each_newcomer_a_turn_at_once_then_run_one_level_first_come_first():
    """``slice_order=levels``: a newcomer takes the GPU at the next round (from a job past 1
    GPU-hour, or from one of its own level: its first turn is its early feedback), but then
    jobs of one level run one after the other, not a quantum each in turn, so the first ends
    as soon as it would alone after its start, but for the second's first turn."""
    jobs = (job("long", 0, 1, 36_000), job("b", 7_200, 1, 600), job("c", 7_230, 1, 600))
    for order in ("levels", "roundrobin"):
        result, _ = run("1x1", f"gandiva:-packing:slices.order={order}"
                        + (":-slices.keep_turn" if order == "levels" else ""), *jobs)
        rec = {r.spec.id: r for r in result.jobs}
        assert rec["b"].start <= 7_260.0  # at the first round after its arrival
        assert rec["c"].first_feedback <= 7_320.0 + 60
        if order == "levels":
            assert rec["b"].finish < 7_260.0 + 600 + 60 + 5  # alone, but for c's first turn
            assert rec["c"].finish > rec["b"].finish
        else:  # round-robin shares the GPU a quantum at a time among all three
            assert rec["b"].finish > 7_260.0 + 1_200
    # seven 8-GPU gangs on 8 GPUs (gavel-philly-23dbec): at or below LAS, where round-robin
    # makes them all end late
    from gandiva.sim.run import simulate
    from gandiva.traces import load_trace

    trace = load_trace("gavel-philly-23dbec")
    mean = {p: summarize(simulate(trace, p, cluster="2x4:V100"))["mean_jct_s"]
            for p in ("las", "gandiva:slices.order=roundrobin", "gandiva:slices.order=levels")}
    assert mean["gandiva:slices.order=levels"] < 0.8 * mean["gandiva:slices.order=roundrobin"]
    assert mean["gandiva:slices.order=levels"] < 1.02 * mean["las"]  # (0.965 of it)


def test_a_job_keeps_its_turn_against_the_jobs_waiting_in_its_own_level():
    """``keep_turn_in_level``: b, a newcomer, takes the GPU from a (same level) for its first
    turn, and then keeps it till it ends, as a would have under LAS, instead of a taking it
    back at the next round and b waiting for a's whole first level (an hour)."""
    jobs = (job("a", 0, 1, 7_200), job("b", 10, 1, 300))
    held, _ = run("1x1", "gandiva:-packing:slices.keep_turn", *jobs)
    assert [t for t, _ in acts(held, A.Suspend)] == [pytest.approx(60)]  # a, for b
    assert jcts(held)["b"] == pytest.approx(60 - 10 + 300, abs=1)
    fcfs, _ = run("1x1", "gandiva:-packing:-slices.keep_turn", *jobs)
    assert [(t, a.job_id) for t, a in acts(fcfs, A.Suspend)][:2] == [
        (pytest.approx(60), "a"), (pytest.approx(120), "b")]
    assert jcts(fcfs)["b"] > 3_600


def test_past_tiresias_levels_a_job_holds_its_turn_till_its_service_grows_by_level_step():
    """``level_step``: a and b (4 GPUs each) are past 10 GPU-hours, the las policy's last
    level, when c, an 8-GPU gang, arrives. c runs first (a newcomer, then of lower levels)
    and holds its turn in their level, but at 10 x sqrt(10) GPU-hours it comes to the next
    one, and a and b, with less service, go first. With no levels beyond Tiresias'
    (``level_step=1``) c would hold its turn to its end, ahead of the jobs there before it."""
    jobs = (job("a", 0, 4, 20_000), job("b", 0, 4, 20_000), job("c", 10_000, 8, 20_000))
    levels, _ = run("2x4", "gandiva:-packing", *jobs)
    (t, _), = acts(levels, A.Suspend, "c")
    assert t == pytest.approx(10_020 + 36_000 * 10 ** 0.5 / 8, abs=60)
    finish = {r.spec.id: r.finish for r in levels.jobs}
    assert finish["a"] < finish["c"] and finish["b"] < finish["c"]
    held, _ = run("2x4", "gandiva:-packing:slices.level_step=1", *jobs)
    assert acts(held, A.Suspend, "c") == []
    finish = {r.spec.id: r.finish for r in held.jobs}
    assert finish["c"] < finish["a"] and finish["c"] < finish["b"]


def test_one_slice_order_across_servers_moves_a_waiting_job_where_it_ranks_high_enough():
    """``balance``: server 0 runs a, with b waiting behind it (both had one turn, under 1
    GPU-hour); server 1 runs c, past 1 GPU-hour. In one slice order across both servers b
    ranks above c, so b's home becomes server 1 (c is suspended there at the round), and a,
    running, keeps its server. Without ``balance`` each server keeps its own order."""
    c = Cluster.build("2x1")
    c.observe(E.Arrival(0.0, JobSpec("c", 0.0, 1, "resnet50", duration=1e6)))
    c.apply(A.Place("c", (1,)))
    for jid in ("a", "b"):
        c.observe(E.Arrival(4_000.0, JobSpec(jid, 4_000.0, 1, "resnet50", duration=1e6)))
    c.apply(A.Place("b", (0,)))
    c.observe(E.Tick(4_060.0))
    c.apply(A.Suspend("b"))
    c.apply(A.Place("a", (0,)))
    c.observe(E.Tick(4_120.0))
    p = make_policy("gandiva")
    assert p.config.balance.enabled and p.config.slices.order == "levels"  # the defaults
    p.attach(c)
    p.book.assign(c.jobs["c"], (1,))
    for jid in ("a", "b"):
        p.book.assign(c.jobs[jid], (0,))
    p.book.last_start.update(c=0.0, b=4_000.0, a=4_060.0)
    p.slicing.rebalance(c, {0, 1})
    assert p.book.home == {"c": (1,), "a": (0,), "b": (1,)}
    actions = list(p.slicing.rotate(c, {0, 1}, tick=True))
    assert [(type(x).__name__, x.job_id) for x in actions] == [("Suspend", "c"),
                                                               ("Resume", "b")]


@pytest.mark.parametrize("spread", [True, False])
def test_the_slice_order_spans_servers_that_do_not_time_slice_with_balance_all(spread):
    """``balance_all``: old (2 GPUs) has had 4 GPU-hours on server 0 alone when a, b and c
    (1 GPU, 1 h each) come; a and b take server 1 and c over-subscribes it. In one slice
    order across every server c, never run, ranks above old: at the first round old is
    suspended and c runs on server 0, as under LAS; old resumes when a and b end. With
    the order across time-slicing servers only, server 0 is not in the round: c waits for a
    and b's turns while old keeps its server."""
    jobs = (job("old", 0, 2, 36_000), job("a", 7_200, 1, 3_600), job("b", 7_200, 1, 3_600),
            job("c", 7_200, 1, 3_600))
    servers_ = "all" if spread else "rotating"
    result, sim = run("2x2", f"gandiva:-packing:-slices.keep_turn:balance.servers={servers_}",
                      *jobs)
    jct = jcts(result)
    c_places = acts(result, A.Place, "c")
    if spread:
        assert acts(result, A.Suspend, "old")[0][0] == pytest.approx(7_260)
        assert servers(sim.cluster, c_places[0][1]) == {0}
        assert jct["c"] < 3_700 and jct["old"] > 39_000
    else:
        assert not acts(result, A.Suspend, "old") and jct["old"] == pytest.approx(36_000)
        assert servers(sim.cluster, c_places[0][1]) == {1}
        assert jct["c"] > 7_000


def test_a_round_over_a_server_whose_gang_reaches_beyond_the_round_leaves_that_gang_be():
    """Gangs chain servers: g1 runs on servers 0 and 1, g2 waits for servers 1 and 2. A round
    on server 0 decides over servers 0 and 1 only; g2, with server 2 outside it, can take no
    turn in it, and nothing moves (this raised a KeyError in ``rebalance`` on the Philly
    list)."""
    c = Cluster.build("3x4")
    for jid in ("g1", "g2"):
        c.observe(E.Arrival(0.0, JobSpec(jid, 0.0, 8, "resnet50", duration=1e6)))
    c.apply(A.Place("g1", tuple(range(8))))
    c.observe(E.Tick(60.0))
    p = make_policy("gandiva")
    p.attach(c)
    p.book.assign(c.jobs["g1"], (0, 1))
    p.book.assign(c.jobs["g2"], (1, 2))
    p.book.last_start["g1"] = 0.0
    p.slicing.rebalance(c, {0})
    assert p.book.home == {"g1": (0, 1), "g2": (1, 2)}
    assert list(p.slicing.rotate(c, {0}, tick=True)) == []



@pytest.mark.parametrize("busy, dest", [((1,), 2), ((1, 2), 1)])
def test_a_job_the_slice_order_runs_off_its_server_goes_where_most_room_is_left(busy, dest):
    """``balance``: server 0 (2 GPUs) runs a and b, and w, never run, waits there. In the one
    slice order w comes first and takes a GPU at home, so b, running, has no room left at home
    and w goes instead (only waiting jobs move) to the server with the most room left after
    the jobs before it (the y jobs came first): server 2 when it is empty and server 1 runs a
    job; server 1, the first by id, when both run one."""
    c = Cluster.build("3x2")
    running = {**{f"y{s}": 2 * s for s in busy}, "a": 0, "b": 1}  # y first come: before b
    for jid in (*running, "w"):
        c.observe(E.Arrival(0.0, JobSpec(jid, 0.0, 1, "resnet50", duration=1e6)))
    for jid, gpu in running.items():
        c.apply(A.Place(jid, (gpu,)))
    c.observe(E.Tick(120.0))
    p = make_policy("gandiva")
    p.attach(c)
    for jid, gpu in running.items():
        p.book.assign(c.jobs[jid], (gpu // 2,))
        p.book.last_start[jid] = 0.0
    p.book.assign(c.jobs["w"], (0,))
    ready = p.slicing.rebalance(c, {0, 1, 2})
    assert p.book.home["w"] == (dest,)
    assert {k: v for k, v in p.book.home.items() if k != "w"} == {
        jid: (gpu // 2,) for jid, gpu in running.items()}
    actions = list(p.slicing.rotate(c, {0, 1, 2}, tick=True, ready=ready))
    assert [(type(x).__name__, x.job_id) for x in actions] == [("Place", "w")]
    assert c.gpus[actions[0].gpus[0]].node == dest


@pytest.mark.parametrize("spec", ["6x4", "3x4+2x8+3x2"])
def test_the_quick_test_for_consolidated_room_never_denies_what_best_fit_would_find(spec):
    """``placement.may_consolidate`` spares ``lower_height`` a ``best_fit`` for a gang when
    the fullest servers cannot hold it unspread. On random occupancies of uniform and mixed
    servers it must say True wherever ``best_fit`` finds GPUs that are not spread, and it must
    say False somewhere (else it spares nothing)."""
    import random

    from gandiva.policies.gandiva.placement import is_spread, may_consolidate
    from gandiva.policies.placement import best_fit

    rng, denied = random.Random(7), 0
    for trial in range(300):
        c = Cluster.build(spec)
        for g in rng.sample(range(len(c.gpus)), rng.randrange(len(c.gpus))):
            jid = f"j{g}"
            c.observe(E.Arrival(0.0, JobSpec(jid, 0.0, 1, "resnet50", duration=1e6)))
            c.apply(A.Place(jid, (g,)))
        for count in range(2, 17):
            gpus = best_fit(c, count)
            found = gpus is not None and not is_spread(c, count, gpus)
            assert may_consolidate(c, count) or not found, (trial, count, gpus)
            denied += not may_consolidate(c, count) and gpus is not None
    assert denied
