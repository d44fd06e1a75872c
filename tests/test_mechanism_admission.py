"""The gandiva policy's admission mechanism (``gandiva/policies/gandiva/admission.py``) on its own:
make_room, by attained service, its hooks called directly on a small cluster set up by hand, a
row per case."""

import pytest
from conftest import arrive, carried_out, hand_state

from gandiva import actions as A
from gandiva.policies import make_policy


@pytest.mark.parametrize("served_s, choice, victim", [
    (7200.0, None, "old"),  # more service than the newcomer by over the margin: sent back
    (1800.0, None, None),  # within the margin: stays
    (7200.0, (0, False), None),  # a server was found: nobody is sent back
])
def test_las_admission_sends_back_the_most_served_job_only_when_no_server_was_found(
        served_s, choice, victim):
    p = make_policy("gandiva:admission.displace_margin=3600")
    c, book = hand_state("1x1", {"old": (1, (0,))}, policy=p)
    c.now = served_s  # it has run since 0
    new = arrive(c, "new", 1, t=served_s)
    *actions, made = carried_out(c, p.admission.make_room(c, new, choice))
    assert made is (victim is not None)
    assert actions == ([A.Suspend(victim)] if victim else [])
    assert ("old" in p.waiting) is (victim is not None)  # back in the queue, by its service
