"""The gandiva policy's elastic mechanism (``gandiva/policies/gandiva/elastic.py``) on its own:
make_room, its hooks called directly on a small cluster set up by hand, a row per case."""

import pytest
from conftest import arrive, carried_out, hand_state

from gandiva import actions as A
from gandiva.policies import make_policy


@pytest.mark.parametrize("grown, choice, shrinks", [
    (True, None, True),  # no server: shrink
    (True, (0, False), True),  # it would only time-slice: shrink, so that it starts
    (True, (0, True), False),  # it starts at once: nothing to do
    (False, None, False),  # nobody grown: nothing to shrink
])
def test_elastic_makes_room_by_shrinking_unless_the_job_starts_at_once(grown, choice, shrinks):
    p = make_policy("gandiva")
    c, book = hand_state("1x2", {}, policy=p)
    e = arrive(c, "e", 1, min_gpus=1, max_gpus=2)
    p.elastic.jobs["e"] = None
    c.apply(A.Place("e", (0,)))
    book.assign(e, (0,))
    if grown:
        c.apply(A.Grow("e", (0, 1)))
    new = arrive(c, "new", 1)
    *actions, made = carried_out(c, p.elastic.make_room(c, new, choice))
    assert made is shrinks
    assert actions == ([A.Shrink("e", (0,))] if shrinks else [])
