"""The gandiva policy's defrag mechanism (``gandiva/policies/gandiva/migration.py``) on its own: a
timer while jobs wait on fragmented GPUs, its hooks called directly on a small cluster set up by
hand, a row per case."""

import pytest
from conftest import arrive, carried_out, hand_state

from gandiva import events as E
from gandiva.policies import make_policy
from gandiva.policies.gandiva import Cycle
from gandiva.policies.gandiva.timers import TimerKind


@pytest.mark.parametrize("free_split, armed", [
    (True, True),  # 2 free GPUs, one per server: a 2-GPU job waits on fragmentation
    (False, False),  # 2 free GPUs on one server: it is not blocked by fragmentation
])
def test_defrag_arms_its_timer_only_when_a_waiting_job_is_blocked_by_fragmentation(
        free_split, armed):
    p = make_policy("gandiva")
    held = {"a": (1, (0,)), "b": (1, (2,))} if free_split else {"a": (1, (0,)), "b": (1, (1,))}
    c, _ = hand_state("2x2", held, policy=p)
    p.waiting.add(arrive(c, "wide", 2))
    carried_out(c, p.defrag.after_decision(c, Cycle(E.Tick(0.0))))
    when = p.s.timers.when(TimerKind.DEFRAG)
    assert (when == p.defrag.interval) if armed else when is None
