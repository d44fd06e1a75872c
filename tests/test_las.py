"""The las policy: Tiresias' 2D-LAS, gangs placed consolidated (decision 0035)."""

from conftest import drive, job

from gandiva import actions as A
from gandiva import events as E


def servers(sched, jid: str) -> set[int]:
    c = sched.cluster
    return {c.gpus[g].node for g in c.jobs[jid].gpus}


def test_a_gang_waits_for_one_server_while_the_jobs_behind_it_go_ahead():
    sched, actions = drive("2x4", "las",
                           E.Arrival(0, job("a", 0, 3, 1000)), E.Arrival(1, job("b", 1, 3, 1000)),
                           E.Arrival(2, job("g", 2, 2, 1000)), E.Arrival(3, job("c", 3, 1, 1000)))
    assert servers(sched, "a") == {0} and servers(sched, "b") == {1}
    assert not sched.cluster.jobs["g"].gpus, "two free GPUs on two servers: the gang waits"
    assert sched.cluster.jobs["c"].gpus, "a job behind the waiting gang takes a free GPU"
    sched.handle(E.Departure(4, "a"))
    assert servers(sched, "g") == {0}


def test_a_gang_that_outranks_running_jobs_suspends_the_lowest_ranked_on_one_server():
    # a and c share server 0, b and d server 1; all have used their first level (100
    # GPU-seconds) when g arrives, so g outranks them all. Two GPUs on one server cost the
    # jobs of server 1, b (ranked second) and d (fourth), rather than a (first) and c.
    sched, actions = drive("2x4", "las:queue_limits=100",
                           E.Arrival(0.0, job("a", 0.0, 3, 1e5)),
                           E.Arrival(0.1, job("b", 0.1, 3, 1e5)),
                           E.Arrival(0.2, job("c", 0.2, 1, 1e5)),
                           E.Arrival(0.3, job("d", 0.3, 1, 1e5)))
    assert servers(sched, "a") == servers(sched, "c") == {0}
    assert servers(sched, "b") == servers(sched, "d") == {1}
    actions.clear()
    sched.handle(E.Arrival(1000, job("g", 1000, 2, 1e5)))
    assert servers(sched, "g") == {1}
    assert {a.job_id for a in actions if isinstance(a, A.Suspend)} == {"b", "d"}
    assert sched.cluster.jobs["a"].gpus and sched.cluster.jobs["c"].gpus


def test_a_gang_wider_than_a_server_takes_whole_servers_or_waits():
    sched, _ = drive("5x4", "las", *(E.Arrival(t, job(jid, t, 3, 1000))
                                     for t, jid in enumerate("abcd")),
                     E.Arrival(4, job("g", 4, 8, 1000)))
    # eight GPUs free, but on five servers: the gang of eight waits for two
    assert sched.cluster.free_count() == 8 and not sched.cluster.jobs["g"].gpus
    sched.handle(E.Departure(5, "a"))
    assert servers(sched, "g") == {0, 4}
