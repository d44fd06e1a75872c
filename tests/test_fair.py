"""Fair shares by tickets (gandiva:fair, ``policies/gandiva/fair.py``) and the measure of them
(``fairness.py``): water-filling, a late user's turn, tickets, the three-team mix."""

import pytest

from gandiva import actions as A
from gandiva.fairness import report, windows
from gandiva.shares import Shares, fair_shares, water_fill
from gandiva.sim.engine import SimConfig
from gandiva.sim.run import simulate
from gandiva.spec import JobSpec, Trace

HOUR = 3600.0


def run(jobs, policy, cluster, shares=None):
    shares = shares or Shares()
    result = simulate(Trace("t", jobs), policy, cluster=cluster, shares=shares,
                      config=SimConfig(timeline=True))
    return result, report(result, shares)


def jct_h(result, jid):
    r = next(r for r in result.jobs if r.spec.id == jid)
    return (r.finish - r.spec.submit_time) / HOUR


def test_water_filling_caps_by_demand_and_shares_the_rest_by_tickets():
    assert water_fill(10, {"a": 1, "b": 100, "c": 100}, {"a": 1, "b": 1, "c": 2}) == \
        {"a": 1, "b": 3.0, "c": 6.0}
    assert water_fill(10, {"a": 2, "b": 3}, {"a": 1, "b": 1}) == {"a": 2, "b": 3}
    assert water_fill(10, {"a": 0, "b": 30}, {"a": 5, "b": 1}) == {"a": 0.0, "b": 10.0}


def test_a_fair_share_is_split_between_teams_first_then_between_their_users():
    shares = Shares({"big": 1, "small": 1}, {"u1": ("big", 1), "u2": ("big", 1),
                                             "u3": ("big", 2), "v": ("small", 1)})
    owed = fair_shares(12, {"u1": 100, "u2": 100, "u3": 100, "v": 100}, shares)
    assert owed == pytest.approx({"u1": 1.5, "u2": 1.5, "u3": 3.0, "v": 6.0})


def alice_and_bob():
    return [*(JobSpec(f"a{i}", 0, 1, "resnet50", user="alice", duration=10 * HOUR)
              for i in range(8)),
            JobSpec("b", 60, 1, "resnet50", user="bob", duration=10 * HOUR)]


def test_a_user_who_comes_second_gets_a_share_at_once_not_after_the_first_users_jobs():
    unfair, measured = run(alice_and_bob(), "gandiva", "1x4")
    assert jct_h(unfair, "b") > 25  # turns go to jobs: bob's one job of nine waits
    assert measured["users"]["bob"]["received_over_fair"] < 0.5
    fair, measured = run(alice_and_bob(), "gandiva:fair", "1x4")
    assert jct_h(fair, "b") < 10.5  # one GPU of four from the start: as if alone
    assert measured["within"] == 1.0 and measured["jain"] > 0.99


def test_tickets_weigh_the_shares():
    jobs = [JobSpec(f"{u}{i}", 0, 1, "resnet50", user=u, duration=20 * HOUR)
            for u in ("rich", "poor") for i in range(4)]
    shares = Shares({"rich": 3, "poor": 1}, {"rich": ("rich", 1), "poor": ("poor", 1)})
    result, measured = run(jobs, "gandiva:fair", "1x4", shares)
    ws = windows(result, shares)
    both = [w for w in ws.received if len(ws.demand[w]) == 2 and w < 20]
    got = sum(ws.received[w]["rich"] for w in both) / sum(ws.received[w]["poor"] for w in both)
    assert 2.7 < got < 3.3
    assert measured["within"] >= 0.9


def test_time_away_is_not_saved_up_to_hold_the_cluster_later():
    # early runs alone for 10 h; late comes then: it gets half, not all until it catches up
    jobs = [*(JobSpec(f"e{i}", 0, 1, "resnet50", user="early", duration=30 * HOUR)
              for i in range(4)),
            *(JobSpec(f"l{i}", 10 * HOUR, 1, "resnet50", user="late", duration=10 * HOUR)
              for i in range(4))]
    result, measured = run(jobs, "gandiva:fair", "1x4")
    assert measured["users"]["early"]["received_over_fair"] > 0.95
    assert measured["within"] >= 0.9


def test_the_forty_job_team_gets_no_more_than_its_share_of_the_three_team_mix():
    jobs = [JobSpec(f"sweep{i}", i, 1, "resnet50", user="sweeps", duration=3 * HOUR)
            for i in range(40)]
    jobs += [JobSpec(f"gang{i}", 40 + i, 8, "resnet50", user="gangs", duration=8 * HOUR)
             for i in range(4)]
    jobs.append(JobSpec("solo", 50, 1, "resnet50", user="solo", duration=40 * HOUR))
    _, unfair = run(jobs, "gandiva", "4x4")
    assert unfair["teams"]["sweeps"]["received_gpu_h"] > \
        1.3 * unfair["teams"]["sweeps"]["fair_gpu_h"]
    _, fair = run(jobs, "gandiva:fair", "4x4")
    t = fair["teams"]
    assert t["sweeps"]["received_gpu_h"] <= 1.05 * t["sweeps"]["fair_gpu_h"]
    assert t["solo"]["received_gpu_h"] >= 0.95 * t["solo"]["fair_gpu_h"]
    assert fair["jain"] > 0.95 and fair["within"] > unfair["within"] + 0.3


def gang_waits(result, jid):
    """The waits of job ``jid`` between its turns, from its arrival on (seconds)."""
    waits, since = [], next(r.spec.submit_time for r in result.jobs if r.spec.id == jid)
    for t, action, _ in result.actions:
        if getattr(action, "job_id", None) != jid:
            continue
        if isinstance(action, A.Suspend):
            since = t
        elif isinstance(action, (A.Place, A.Resume)):
            waits.append(t - since)
    return waits


def test_a_gang_that_waited_the_stated_time_reserves_its_servers_and_runs_at_the_next_round():
    # on two servers of 4, 16 one-GPU jobs of two users; bob's 8-GPU gang needs both servers
    # free of every job before it, and his own jobs, with less service, go before it
    jobs = [JobSpec(f"{u}{i}", 0, 1, "resnet50", user=u, duration=10 * HOUR)
            for u in ("alice", "bob") for i in range(8)]
    jobs.append(JobSpec("gang", 60, 8, "resnet50", user="bob", duration=HOUR))
    starved, _ = run(jobs, "gandiva:fair:fair.gang_wait=1e9", "2x4")
    assert max(gang_waits(starved, "gang")) > 10 * HOUR
    reserved, measured = run(jobs, "gandiva:fair", "2x4")  # fair.gang_wait: 1800 s
    waits = gang_waits(reserved, "gang")
    assert len(waits) > 10 and max(waits) <= 1800 + 60  # the wait, then the next round
    assert jct_h(reserved, "gang") < jct_h(starved, "gang") - 3
    # its turns are charged to bob: alice still gets her share
    assert measured["users"]["alice"]["received_over_fair"] > 0.95


def test_a_priority_orders_only_its_users_own_jobs_inside_the_users_share():
    # alice's priority 50 (the ceiling) does not hold bob's job behind hers; between alice's
    # own jobs it does order: her 50 runs before her 0
    jobs = [JobSpec("a-hi", 0, 1, "resnet50", user="alice", duration=4 * HOUR, priority=50),
            JobSpec("a-lo", 0, 1, "resnet50", user="alice", duration=4 * HOUR),
            JobSpec("b", 60, 1, "resnet50", user="bob", duration=4 * HOUR)]
    unfair, _ = run(jobs, "gandiva", "1x1")
    assert jct_h(unfair, "b") > 7.9  # behind both of alice's: the 50 first, then the turns
    fair, measured = run(jobs, "gandiva:fair", "1x1")
    assert jct_h(fair, "b") < 8.3  # half the GPU from the start
    assert jct_h(fair, "a-hi") < jct_h(fair, "a-lo") - 3.5  # alice's 50 before her 0
    assert measured["within"] >= 0.9


def test_the_admins_class_above_the_ceiling_goes_before_every_share():
    jobs = [JobSpec("a", 0, 1, "resnet50", user="alice", duration=4 * HOUR),
            JobSpec("urgent", 60, 1, "resnet50", user="bob", duration=2 * HOUR, priority=51)]
    result, _ = run(jobs, "gandiva:fair", "1x1")
    assert jct_h(result, "urgent") < 2.1  # alone, at once
    assert jct_h(result, "a") > 5.9


def owners_quota(gpus):
    """Two teams of one ticket each: olga's owners with a quota of ``gpus``, gus's guests."""
    return Shares({"owners": 1, "guests": 1}, {"olga": ("owners", 1), "gus": ("guests", 1)},
                  {"owners": gpus})


def test_a_teams_quota_is_taken_back_from_borrowers_at_the_next_round_and_kept():
    # guests borrow all four GPUs; the owners' three jobs come an hour later: at the next
    # round (a quantum: 60 s) they run, guests' jobs suspended, and they keep their three
    guests = [JobSpec(f"g{i}", 0, 1, "resnet50", user="gus", duration=10 * HOUR)
              for i in range(4)]
    owners = [JobSpec(f"o{i}", HOUR + 7, 1, "resnet50", user="olga", duration=2 * HOUR)
              for i in range(3)]
    shares = owners_quota(3)
    result, _ = run(guests + owners, "gandiva:fair", "1x4", shares)
    for r in result.jobs:
        if r.spec.user == "olga":
            assert r.start - r.spec.submit_time <= 60
            assert jct_h(result, r.spec.id) < 2 + 2 / 60  # never given back: ran throughout
    # without the quota the owners share by tickets: two GPUs for three jobs, taking turns
    result, _ = run(guests + owners, "gandiva:fair", "1x4",
                    Shares(shares.teams, shares.users))
    assert max(jct_h(result, f"o{i}") for i in range(3)) > 2.5


def test_a_job_that_cannot_checkpoint_runs_within_its_teams_quota_never_on_borrowed_gpus():
    shares = owners_quota(1)
    jobs = [JobSpec("own", 0, 1, "resnet50", user="olga", duration=HOUR, checkpoints=False),
            JobSpec("own2", 0, 1, "resnet50", user="olga", duration=HOUR, checkpoints=False),
            JobSpec("guest", 0, 1, "resnet50", user="gus", duration=HOUR, checkpoints=False),
            JobSpec("ok", 0, 1, "resnet50", user="gus", duration=HOUR)]
    result, _ = run(jobs, "gandiva:fair", "1x4", shares)
    start = {r.spec.id: r.start for r in result.jobs}
    assert start["own"] == 0 and start["ok"] == 0  # within the quota; one that checkpoints
    assert start["own2"] >= HOUR and start["guest"] is None  # past the quota; borrowed: never


def guests_then_owners(guests, owners, width):
    """gus's ``guests`` 1-GPU jobs of 10 h at 0; an hour later, a second apart, olga's
    ``owners`` jobs of ``width`` GPUs and 2 h."""
    return [*(JobSpec(f"g{i}", 0, 1, "resnet50", user="gus", duration=10 * HOUR)
              for i in range(guests)),
            *(JobSpec(f"o{i}", HOUR + i, width, "resnet50", user="olga", duration=2 * HOUR)
              for i in range(owners))]


def test_a_quota_is_held_by_as_many_of_the_teams_jobs_as_fit_and_they_take_turns_in_it():
    # quota 4, two 4-GPU jobs: one holds it at a time (both would not fit), and they take
    # turns in it (each ran 2 h of 4 by the end), while the guests keep the other server
    result, _ = run(guests_then_owners(8, 2, 4), "gandiva:fair", "2x4", owners_quota(4))
    for r in result.jobs:
        if r.spec.user == "olga":
            assert r.start - r.spec.submit_time <= 120
            assert 3.5 < jct_h(result, r.spec.id) < 4.1


def test_a_teams_jobs_take_turns_inside_its_quota_not_the_first_ones_holding_it():
    # the whole server is the owners' quota; their eight 2-hour jobs come while guests borrow
    # it: all eight run within two rounds, in turns, and end together after 4 h (the first
    # four holding it until they end would leave the other four waiting 2 h)
    result, _ = run(guests_then_owners(4, 8, 1), "gandiva:fair", "1x4", owners_quota(4))
    for r in result.jobs:
        if r.spec.user == "olga":
            assert r.start - r.spec.submit_time <= 120
            assert 3.9 < jct_h(result, r.spec.id) < 4.1
        else:
            assert jct_h(result, r.spec.id) > 14  # the quota was taken back for 4 h
