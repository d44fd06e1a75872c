"""The gandiva policy's packing mechanism (``gandiva/policies/gandiva/packing.py``) on its own:
votes on samples, its hooks called directly on a small cluster set up by hand, a row per case."""

import pytest
from conftest import hand_state

from gandiva import events as E
from gandiva.policies import make_policy


@pytest.mark.parametrize("before, memory, running, solo_known, votes", [
    (None, 4.0, True, True, True),  # a first profile
    ((4.0, 0.5), 4.0, True, True, False),  # the same again, profiled alone: no news
    ((4.0, 0.5), 6.0, True, True, True),  # its memory moved: may pack differently
    ((4.0, 0.5), 4.0, True, False, True),  # no solo time yet: a pack may follow
    (None, 4.0, False, True, False),  # not running: packing ignores it
])
def test_packing_votes_a_sample_news_only_when_it_may_pack_or_unpack(
        before, memory, running, solo_known, votes):
    p = make_policy("gandiva")
    c, _ = hand_state("1x1", {"a": (1, (0,) if running else ())}, policy=p)
    c.jobs["a"].memory_gb, c.jobs["a"].utilization = memory, 0.5
    if before is not None:
        p.packing.profiled["a"] = before
    if solo_known:
        p.packing.solo_mbt["a"] = 0.1
    sample = E.ProfileSample(1.0, "a", 0.1, memory, 0.5, 10)
    assert p.packing.may_change(c, sample) is votes
    assert p.packing.profiled["a"] == (memory, 0.5)  # it notes what it saw
