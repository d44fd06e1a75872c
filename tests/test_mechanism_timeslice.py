"""The gandiva policy's time-slicing mechanism (``gandiva/policies/gandiva/timeslice.py``) on its
own: how long rounds stay the same, its hooks called directly on a small cluster set up by hand,
a row per case."""

import math

import pytest
from conftest import hand_state

from gandiva.policies import make_policy


@pytest.mark.parametrize("spec, dependent", [
    ("gandiva", False),  # levels, balanced: only a running job's level moves with time
    ("gandiva:slices.order=las", True),  # attained service moves every round
    ("gandiva:-balance", True),  # rounds per server: not put off
])
def test_time_slicing_votes_whether_its_rounds_move_with_time(spec, dependent):
    assert make_policy(spec).slicing.time_dependent() is dependent


@pytest.mark.parametrize("started, until", [
    (0.0, 3600.0),  # 1 GPU-hour to the next level, from 0 service at 0
    (1790.0, None),  # began its turn under half a quantum ago: the next round may change
])
def test_time_slicing_says_rounds_stay_the_same_until_a_running_job_changes_level(
        started, until):
    p = make_policy("gandiva")
    c, book = hand_state("1x1", {"a": (1, (0,))}, policy=p)
    book.last_start["a"] = started
    c.now = 1800.0
    got = p.slicing.steady_until(c, {0})
    if until is None:
        assert got is None
    else:
        assert got == pytest.approx(until, abs=1.0) and got < math.inf
