"""Hollow nodes drive the real loop with no processes, and a stalled node holds up no one."""

import threading
import time

import pytest

from gandiva.backends.driver import Driver
from gandiva.backends.hollow import START_S, HollowNodes, hollow_launch
from gandiva.policies import make_policy
from gandiva.spec import JobSpec

MODEL = "lstm"  # ~78 steps/s on one V100 in the performance model


def steps_for(nodes: HollowNodes, seconds: float) -> int:
    return int(seconds * nodes.perf.throughput(MODEL, "V100", 1))


def test_hollow_nodes_run_more_jobs_than_gpus_to_the_end_taking_turns(tmp_path):
    nodes = HollowNodes(servers=2, gpus=2, seed=1)
    backend = Driver(make_policy("gandiva:quantum=1:-pack"), tmp_path, nodes=nodes,
                           feedback_steps=10)
    settled: list[tuple[str, int, float]] = []
    backend.observer.settled = lambda ev, n, s: settled.append((type(ev).__name__, n, s))
    work = steps_for(nodes, 1.5)
    for i in range(8):
        backend.submit(JobSpec(f"j{i}", 0.0, 1, MODEL, mini_batches=work),
                       hollow_launch(MODEL, work))
    t0 = time.monotonic()
    result = backend.run(timeout=120)
    took = time.monotonic() - t0
    assert [j.status for j in result.jobs] == ["done"] * 8
    assert all(j.steps == work for j in result.jobs)
    kinds = {type(a).__name__ for _, a, _ in result.actions}
    assert {"Place", "Suspend", "Resume"} <= kinds  # 8 jobs on 4 GPUs: they took turns
    # nothing runs faster than its work: 8 jobs of ~1.5 s on 4 GPUs, after a start
    assert took >= 8 * (work / nodes.perf.throughput(MODEL, "V100", 1)) / 4 + START_S
    assert all(j.first_feedback is not None for j in result.jobs)
    # a round (a Tick's suspends and resumes) settles once its last action is carried out,
    # which takes at least the suspend's wait for a mini-batch boundary
    rounds = [(n, s) for kind, n, s in settled if kind == "Tick"]
    assert rounds and all(n >= 2 and s > 0 for n, s in rounds)


def test_a_job_of_an_unknown_model_fails_naming_it_and_the_rest_run(tmp_path):
    nodes = HollowNodes(servers=1, gpus=2)
    backend = Driver(make_policy("fifo"), tmp_path, nodes=nodes)
    backend.submit(JobSpec("bad", 0.0, 1, MODEL), hollow_launch("no-such-net", 10))
    backend.submit(JobSpec("good", 0.0, 1, MODEL), hollow_launch(MODEL, 10))
    result = backend.run(timeout=60)
    by_id = {j.spec.id: j for j in result.jobs}
    assert by_id["good"].status == "done"
    assert by_id["bad"].status == "failed" and "no-such-net" in by_id["bad"].reason


class StalledServer(HollowNodes):
    """Hollow nodes where every action on server 0 waits until ``release`` is set."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.release = threading.Event()
        self.stalled: set[str] = set()

    def _stall(self, job_id: str, devices=()) -> None:
        job = self.jobs.get(job_id)
        on = set(devices) | set(job.devices if job else ())
        if any(d // self._per_server == 0 for d in on):
            self.stalled.add(job_id)
            self.release.wait()

    def start(self, job_id, launch, devices):
        self._stall(job_id, devices)
        return super().start(job_id, launch, devices)

    def suspend(self, job_id):
        self._stall(job_id)
        return super().suspend(job_id)

    def resume(self, job_id, devices):
        self._stall(job_id, devices)
        return super().resume(job_id, devices)

    def restart(self, job_id, devices):
        self._stall(job_id, devices)
        return super().restart(job_id, devices)


@pytest.mark.timeout(120)
def test_a_node_that_stalls_every_action_holds_up_neither_the_loop_nor_other_servers(tmp_path):
    nodes = StalledServer(servers=3, gpus=2, seed=2)
    backend = Driver(make_policy("gandiva:quantum=1:-pack"), tmp_path, nodes=nodes,
                           feedback_steps=10)
    work = steps_for(nodes, 1.0)
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    try:
        for i in range(12):  # 12 jobs on 6 GPUs: every server's jobs take turns
            backend.submit(JobSpec(f"j{i}", 0.0, 1, MODEL, mini_batches=work),
                           hollow_launch(MODEL, work))
        deadline = time.monotonic() + 60
        while not (nodes.stalled and sum(r.status == "done" for r in backend.records.values())
                   >= 6):
            assert time.monotonic() < deadline, {r.spec.id: r.status
                                                 for r in backend.records.values()}
            time.sleep(0.1)
        # server 0 has not carried out a single action, yet the others ran jobs to the end,
        # taking turns (suspends confirmed on servers 1 and 2), and the loop answers
        assert not nodes.release.is_set() and nodes.stalled
        done_on = {d // 2 for r in backend.records.values() if r.status == "done"
                   for d in r.devices}
        assert done_on and 0 not in done_on
        confirmed = [a for _, a, _ in backend.actions if type(a).__name__ == "Suspend"]
        assert confirmed
        assert backend.cluster.transitions  # server 0's jobs: decided, not confirmed
    finally:
        nodes.release.set()
    deadline = time.monotonic() + 60
    while not all(r.status == "done" for r in backend.records.values()):  # then all end
        assert time.monotonic() < deadline, {r.spec.id: r.status
                                             for r in backend.records.values()}
        time.sleep(0.1)
    backend.stop()
    loop.join(timeout=30)
    assert not loop.is_alive()


def test_the_cluster_view_shows_the_head_of_a_long_queue_and_its_length(tmp_path):
    from gandiva.backends.explain import QUEUE_SHOWN

    nodes = HollowNodes(servers=1, gpus=1)
    backend = Driver(make_policy("fifo"), tmp_path, nodes=nodes)
    count = QUEUE_SHOWN + 50
    for i in range(count):
        backend.submit(JobSpec(f"j{i:03d}", 0.0, 1, MODEL), hollow_launch(MODEL, 10**9))
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while backend.view()["queue_length"] != count - 1:  # one runs, the rest wait
            assert time.monotonic() < deadline, backend.view()["queue_length"]
            time.sleep(0.05)
        view = backend.view()
        assert view["queue"] == [f"j{i:03d}" for i in range(1, QUEUE_SHOWN + 1)]
        assert backend.explain(f"j{count - 1:03d}")["queue_position"] == count - 1
    finally:
        backend.stop()
        loop.join(timeout=30)


def test_the_cluster_view_is_rebuilt_only_where_devices_changed(tmp_path):
    nodes = HollowNodes(servers=3, gpus=2)
    backend = Driver(make_policy("fifo"), tmp_path, nodes=nodes)
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()

    def placed(count: int) -> dict:
        deadline = time.monotonic() + 30
        while True:
            view = backend.view()
            on = {j for n in view["nodes"] for d in n["devices"] for j in d["jobs"]}
            if len(on) == count:
                return view
            assert time.monotonic() < deadline, view
            time.sleep(0.05)
    try:
        backend.submit(JobSpec("a", 0.0, 2, MODEL), hollow_launch(MODEL, 10**9))
        before = placed(1)
        backend.submit(JobSpec("b", 0.0, 2, MODEL), hollow_launch(MODEL, 10**9))
        after = placed(2)
        changed = [i for i, (x, y) in enumerate(zip(before["nodes"], after["nodes"],
                                                    strict=True)) if x is not y]
        assert len(changed) == 1  # b's server; the other two are the same objects as before
        node = after["nodes"][changed[0]]
        assert [d["jobs"] for d in node["devices"]] == [["b"], ["b"]]
        assert before["nodes"][changed[0]]["devices"][0]["jobs"] == []  # as it was then
    finally:
        backend.stop()
        loop.join(timeout=30)


def test_a_cancel_is_on_record_before_its_node_is_told(tmp_path):
    """A server that crashed between the two must not find the job running and bring it
    back: the change is stored (on_flush) before the kill is handed to the node."""
    nodes = HollowNodes(servers=1, gpus=1)
    backend = Driver(make_policy("fifo"), tmp_path, nodes=nodes)
    changes: list[str] = []
    stored: list[str] = []
    at_send: list[list[str]] = []
    backend.on_change = lambda rec, what: changes.append(what)
    backend.on_flush = lambda: (stored.extend(changes), changes.clear())
    send = backend.courier.send

    def spy(what, run, keys):  # the loop hands the node its kill here
        if what[1] == "cancelled":
            at_send.append(list(stored))
        return send(what, run, keys)
    backend.courier.send = spy
    backend.submit(JobSpec("a", 0.0, 1, MODEL), hollow_launch(MODEL, 10**9))
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while "a" not in nodes.jobs:  # started on its node
            assert time.monotonic() < deadline
            time.sleep(0.05)
        backend.cancel("a")
        while not at_send:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "cancelled" in at_send[0]
        while "a" in nodes.jobs:  # and the node did stop it
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert backend.records["a"].status == "cancelled"
    finally:
        backend.stop()
        loop.join(timeout=30)


def test_a_hold_and_new_priorities_asked_together_start_no_job_they_then_stop(tmp_path):
    """As a sweep pauses a trial and promotes others in one step: x is held, a and b raised,
    b above a. b takes x's GPU; neither a nor w (the next by the old priorities) is started
    on it and suspended again."""
    nodes = HollowNodes(servers=1, gpus=1)
    backend = Driver(make_policy("gandiva:quantum=1000:-pack"), tmp_path, nodes=nodes)
    for name in ("x", "w", "a", "b"):
        backend.submit(JobSpec(name, 0.0, 1, MODEL), hollow_launch(MODEL, 10**9))
    loop = threading.Thread(target=backend.run, kwargs={"until_idle": False})
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while "x" not in nodes.jobs or len(backend.cluster.jobs) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with backend.requests._lock:  # one step's requests, in the order a sweep asks them
            backend.requests._asked += [("hold", "x", None), ("priority", "a", 1),
                                        ("priority", "b", 2)]
        backend.set_priority("x", 0)  # (wakes the loop; x keeps its priority)
        while "b" not in nodes.jobs:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # what a late decision would still have sent
        started = {type(a).__name__ + ":" + a.job_id for _, a, _ in backend.actions}
        assert not started & {"Place:a", "Place:w", "Resume:a", "Resume:w"}
        assert backend.records["x"].status == "held"
    finally:
        backend.stop()
        loop.join(timeout=30)
