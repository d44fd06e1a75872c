"""The gandiva policy's fair shares (``gandiva/policies/gandiva/fair.py``) on their own: the
``observe``, ``after_decision`` and ``order`` hooks called directly on a small cluster set
up by hand."""

import pytest
from conftest import carried_out

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva import Cycle
from gandiva.policies.gandiva.fair import USER_WEIGHT, FairShare
from gandiva.policies.gandiva.shared import Shared
from gandiva.shares import Shares
from gandiva.spec import JobSpec
from gandiva.state import Cluster


def came(c, fair, jid, user, gpus, t):
    spec = JobSpec(jid, t, gpus, "resnet50", user=user, duration=1e6)
    c.now = t
    event = E.Arrival(t, spec)
    c.observe(event)
    carried_out(c, fair.observe(c, event, Cycle(event)))
    return c.jobs[jid]


def decided(c, fair):
    carried_out(c, fair.after_decision(c, Cycle(E.Tick(c.now))))


def at(c, fair, t):
    c.now = t
    carried_out(c, fair.observe(c, E.Tick(t), Cycle(E.Tick(t))))


def test_a_team_is_charged_its_gpu_seconds_over_its_tickets():
    c = Cluster.build("1x4")
    c.shares = Shares({"big": 2, "small": 1}, {"ann": ("big", 1), "bo": ("small", 1)})
    fair = FairShare(Shared(60.0))
    a = came(c, fair, "a", "ann", 2, 0.0)
    b = came(c, fair, "b", "bo", 2, 0.0)
    c.apply(A.Place("a", (0, 1)))
    c.apply(A.Place("b", (2, 3)))
    decided(c, fair)
    at(c, fair, 100.0)
    assert fair.used == {"big": 200.0, "small": 200.0}
    # the same GPU-seconds, twice the tickets: half the pass, so "big" goes first
    assert fair.order(a, 100.0) == pytest.approx(100.0 + USER_WEIGHT * 200.0)
    assert fair.order(b, 100.0) == pytest.approx(200.0 + USER_WEIGHT * 200.0)


def test_a_packed_gpu_charges_each_of_its_jobs_half_and_a_suspended_job_nothing():
    c = Cluster.build("1x2")
    fair = FairShare(Shared(60.0))
    for jid, user in (("a", "ann"), ("b", "bo"), ("s", "cy")):
        came(c, fair, jid, user, 1, 0.0).memory_gb = 4.0  # (profiled: they may pack)
    c.apply(A.Place("a", (0,)))
    c.apply(A.Pack("b", (0,)))
    c.apply(A.Place("s", (1,)))
    decided(c, fair)
    at(c, fair, 60.0)
    assert fair.used == {"ann": 30.0, "bo": 30.0, "cy": 60.0}
    c.apply(A.Suspend("s"))
    decided(c, fair)
    at(c, fair, 120.0)
    assert fair.used == {"ann": 60.0, "bo": 60.0, "cy": 60.0}


def test_a_team_that_comes_back_joins_at_the_lowest_pass_of_those_with_jobs():
    c = Cluster.build("1x2")
    fair = FairShare(Shared(60.0))
    a = came(c, fair, "a", "ann", 1, 0.0)
    c.apply(A.Place("a", (0,)))
    decided(c, fair)
    at(c, fair, 1000.0)
    late = came(c, fair, "l", "lu", 1, 1000.0)
    assert fair.order(late, 1000.0) == pytest.approx(fair.order(a, 1000.0))
