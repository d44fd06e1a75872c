"""Cluster state: construction, indexes and the invariants every action must keep."""

import pytest

from gandiva import actions as A
from gandiva import events as E
from gandiva.spec import JobSpec
from gandiva.state import Cluster, InvariantError, JobStatus


def arrive(c: Cluster, jid: str, gpus: int = 1, t: float = 0.0, **kw) -> None:
    c.observe(E.Arrival(t, JobSpec(jid, t, gpus, "resnet50", duration=10.0, **kw)))


def test_build_topology_and_types():
    c = Cluster.build("2x4:P100+1x8:P40")
    assert c.total_gpus == 16
    assert [g.type for g in c.gpus[:4]] == ["P100"] * 4
    assert c.gpus[-1].type == "P40" and c.gpus[-1].memory_gb == 24.0
    assert [c.gpus[g].socket for g in c.nodes[0].gpus] == [0, 0, 1, 1]
    assert c.free_count() == 16


@pytest.mark.parametrize("bad", ["", "4", "0x4", "2x4:Z9", "2x4x4"])
def test_bad_cluster_spec_names_the_fix(bad):
    with pytest.raises(ValueError, match="cluster"):
        Cluster.build(bad)


def test_gang_is_placed_whole():
    c = Cluster.build("1x4")
    arrive(c, "a", gpus=2)
    with pytest.raises(InvariantError, match="placed whole"):
        c.apply(A.Place("a", (0,)))
    c.apply(A.Place("a", (0, 1)))
    assert c.jobs["a"].status is JobStatus.RUNNING
    assert c.free_count() == 2
    c.check_invariants()


def test_exclusive_place_refuses_busy_gpu_and_leaves_state_unchanged():
    c = Cluster.build("1x2")
    arrive(c, "a")
    arrive(c, "b")
    c.apply(A.Place("a", (0,)))
    with pytest.raises(InvariantError, match="in use"):
        c.apply(A.Place("b", (0,)))
    assert c.jobs["b"].status is JobStatus.QUEUED and len(c.queue) == 1
    c.check_invariants()


def test_packing_requires_profiled_memory_that_fits():
    c = Cluster.build("1x1:V100")  # 16 GB
    arrive(c, "a")
    arrive(c, "b")
    c.apply(A.Place("a", (0,)))
    with pytest.raises(InvariantError, match="before profiling"):
        c.apply(A.Pack("b", (0,)))
    c.observe(E.ProfileSample(1.0, "a", 0.1, 10.0, 0.5, 5))
    c.jobs["b"].memory_gb = 7.0
    with pytest.raises(InvariantError, match="17.0 GB"):
        c.apply(A.Pack("b", (0,)))
    c.jobs["b"].memory_gb = 5.0
    c.apply(A.Pack("b", (0,)))
    assert c.gpus[0].jobs == ["a", "b"]
    c.check_invariants()
    c.apply(A.Unpack("b"))
    assert c.jobs["b"].status is JobStatus.SUSPENDED and c.gpus[0].jobs == ["a"]


def test_attained_service_counts_gpu_seconds():
    c = Cluster.build("1x4")
    arrive(c, "a", gpus=2)
    c.apply(A.Place("a", (0, 1)))
    c.now = 10.0
    assert c.jobs["a"].attained_at(10.0) == 20.0
    c.apply(A.Suspend("a"))
    c.now = 50.0
    assert c.jobs["a"].attained_at(50.0) == 20.0
    c.apply(A.Resume("a", (2, 3)))
    assert c.jobs["a"].attained_at(55.0) == 30.0


def test_resize_only_for_elastic_jobs_within_range():
    c = Cluster.build("1x4")
    arrive(c, "rigid", gpus=1)
    arrive(c, "elastic", gpus=1, min_gpus=1, max_gpus=2)
    c.apply(A.Place("rigid", (0,)))
    c.apply(A.Place("elastic", (1,)))
    with pytest.raises(InvariantError, match="range"):
        c.apply(A.Grow("rigid", (0, 2)))
    assert c.jobs["rigid"].gpus == (0,)
    with pytest.raises(InvariantError, match="range"):
        c.apply(A.Grow("elastic", (1, 2, 3)))
    c.apply(A.Grow("elastic", (1, 2)))
    c.apply(A.Shrink("elastic", (2,)))
    assert c.jobs["elastic"].gpus == (2,)
    c.check_invariants()


def test_failure_requeues_the_whole_gang_and_takes_the_server_out():
    c = Cluster.build("2x2")
    arrive(c, "gang", gpus=4)
    c.apply(A.Place("gang", (0, 1, 2, 3)))
    c.observe(E.Failure(5.0, 1))
    assert c.jobs["gang"].status is JobStatus.QUEUED
    assert c.free_count() == 2 and c.allocated_count() == 0
    with pytest.raises(InvariantError, match="down server"):
        c.apply(A.Place("gang", (0, 1, 2, 3)))
    c.check_invariants()


def test_join_adds_a_server_of_free_gpus_numbered_after_all_others():
    c = Cluster.build("2x2")
    c.observe(E.Join(5.0, 2, "T4", 16.0))
    node = c.nodes[2]
    assert (node.id, node.rack, node.gpus, node.up) == (2, c.nodes[1].rack, [4, 5], True)
    assert [(g.node, g.index, g.socket, g.type, g.memory_gb) for g in c.gpus[4:]] == [
        (2, 0, 0, "T4", 16.0), (2, 1, 0, "T4", 16.0)]
    assert c.total_gpus == 6 and c.free_count() == 6 and c.free_gpus(2) == [4, 5]
    assert list(c.nodes_with_free(2)) == [0, 1, 2]
    c.check_invariants()
    arrive(c, "a", gpus=2)
    c.apply(A.Place("a", (4, 5)))
    assert c.allocated_count() == 2 and list(c.nodes_with_free(0)) == [2]
    c.check_invariants()


def test_a_server_bigger_than_any_before_grows_the_free_buckets():
    c = Cluster.build("2x2")
    c.observe(E.Join(1.0, 8, "A100", 40.0))
    assert c.max_free_bucket == 8 and list(c.nodes_with_free(8)) == [2]
    arrive(c, "wide", gpus=8)
    c.apply(A.Place("wide", tuple(range(4, 12))))
    c.check_invariants()
    c.observe(E.Departure(2.0, "wide"))
    assert list(c.nodes_with_free(8)) == [2] and c.free_count() == 12
    c.check_invariants()
    with pytest.raises(InvariantError, match="at least one GPU"):
        c.observe(E.Join(3.0, 0, "A100", 40.0))
    assert len(c.nodes) == 3 and c.total_gpus == 12


def test_a_failed_server_comes_back_as_a_new_one():
    c = Cluster.build("2x2")
    arrive(c, "a", gpus=2)
    c.apply(A.Place("a", (2, 3)))
    c.observe(E.Failure(5.0, 1))
    c.observe(E.Join(9.0, 2, "V100", 16.0))
    assert [n.up for n in c.nodes] == [True, False, True]
    assert c.nodes[2].gpus == [4, 5]  # the down server keeps its ids; none is reused
    assert c.total_gpus == 6 and c.free_count() == 4 and c.allocated_count() == 0
    c.check_invariants()
    c.apply(A.Place("a", (4, 5)))
    assert c.allocated_count() == 2
    c.check_invariants()


def test_departure_frees_gpus_and_counts():
    c = Cluster.build("1x2")
    arrive(c, "a")
    c.apply(A.Place("a", (1,)))
    c.observe(E.Departure(3.0, "a"))
    assert c.jobs["a"].status is JobStatus.DONE and c.jobs["a"].finish_time == 3.0
    assert c.free_gpus(0) == [0, 1] and c.finished == 1


def test_where_nodes_confirm_actions_a_job_is_in_transition_until_they_do():
    c = Cluster.build("2x2")
    c.confirms = True  # a real backend's state
    for jid in "ab":
        arrive(c, jid)
    c.apply(A.Place("a", (0,)))
    c.apply(A.Place("b", (2,)))
    assert c.transitions == {"a": "starting", "b": "starting"}
    c.observe(E.Confirmed(1.0, "a"))
    c.apply(A.Suspend("a"))
    assert c.transitions == {"a": "suspending", "b": "starting"}
    c.apply(A.Resume("a", (1,)))
    assert c.transitions["a"] == "resuming"  # the latest action is what it is doing
    c.observe(E.Departure(2.0, "a"))
    c.observe(E.Failure(3.0, 1))  # b's node is gone: nothing will confirm its start
    assert c.transitions == {}
    sim = Cluster.build("1x2")  # the simulator's: actions take effect at once
    arrive(sim, "a")
    sim.apply(A.Place("a", (0,)))
    assert sim.transitions == {}
