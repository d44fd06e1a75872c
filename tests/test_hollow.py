"""Hollow nodes drive the real loop with no processes, and a stalled node holds up no one.

Every test runs in virtual time: the loop and the nodes share a ``VirtualClock``, which moves
to the next deadline whenever both wait with nothing to do; nothing sleeps."""

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from gandiva.backends.clock import VirtualClock
from gandiva.backends.driver import Driver
from gandiva.backends.hollow import START_S, HollowNodes, hollow_launch
from gandiva.backends.requests import Request
from gandiva.policies import make_policy
from gandiva.spec import JobSpec

MODEL = "lstm"  # ~78 steps/s on one V100 in the performance model


def steps_for(nodes: HollowNodes, seconds: float) -> int:
    return int(seconds * nodes.perf.throughput(MODEL, "V100", 1))


def hollow(policy: str, tmp_path, nodes: type[HollowNodes] = HollowNodes, feedback_steps=100,
           **kw) -> tuple[Driver, HollowNodes, VirtualClock]:
    """A driver on hollow nodes (``kw``: theirs), both on one virtual clock."""
    clock = VirtualClock()
    made = nodes(clock=clock, **kw)
    return (Driver(make_policy(policy), tmp_path, nodes=made, clock=clock,
                   feedback_steps=feedback_steps), made, clock)


def in_background(work: Callable[[], object]) -> tuple[threading.Thread, dict]:
    """``work`` on a thread of its own; what it returned (``result``) or raised (``error``)."""
    out: dict = {}

    def call() -> None:
        try:
            out["result"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
    thread = threading.Thread(target=call)
    thread.start()
    return thread, out


def run_to_the_end(backend: Driver, clock: VirtualClock, timeout: float):
    loop, out = in_background(lambda: backend.run(timeout=timeout))
    clock.run_until(lambda: not loop.is_alive())
    if "error" in out:
        raise out["error"]
    return out["result"]


def stop(backend: Driver, clock: VirtualClock, loop: threading.Thread) -> None:
    """Stop the loop; the actions under way end (in virtual time) as it closes."""
    backend.stop()
    clock.run_until(lambda: not loop.is_alive())


def test_hollow_nodes_run_more_jobs_than_gpus_to_the_end_taking_turns(tmp_path):
    backend, nodes, clock = hollow("gandiva:quantum=1:-packing", tmp_path, servers=2, gpus=2,
                                   seed=1, feedback_steps=10)
    settled: list[tuple[str, int, float]] = []
    backend.observer.settled = lambda ev, n, s: settled.append((type(ev).__name__, n, s))
    work = steps_for(nodes, 1.5)
    for i in range(8):
        backend.submit(JobSpec(f"j{i}", 0.0, 1, MODEL, mini_batches=work),
                       hollow_launch(MODEL, work))
    t0 = clock.now()
    result = run_to_the_end(backend, clock, timeout=120)
    took = clock.now() - t0
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
    backend, _, clock = hollow("fifo", tmp_path, servers=1, gpus=2)
    backend.submit(JobSpec("bad", 0.0, 1, MODEL), hollow_launch("no-such-net", 10))
    backend.submit(JobSpec("good", 0.0, 1, MODEL), hollow_launch(MODEL, 10))
    result = run_to_the_end(backend, clock, timeout=60)
    by_id = {j.spec.id: j for j in result.jobs}
    assert by_id["good"].status == "done"
    assert by_id["bad"].status == "failed" and "no-such-net" in by_id["bad"].reason


class StalledServer(HollowNodes):
    """Hollow nodes where server 0 carries out no action until ``release()``: each is a
    future that its node completes only after that, as a node that stopped answering."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.released = False
        self.stalled: set[str] = set()
        self._held: list[Callable[[], None]] = []
        self._hold_lock = threading.Lock()

    def release(self) -> None:
        """Server 0 answers again: what it held is carried out now, on this thread (so
        before the test moves the clock on)."""
        with self._hold_lock:
            self.released, held = True, self._held
        for carry_out in held:
            carry_out()

    def _stall(self, job_id: str, devices, act: Callable[[], Future | None]) -> Future | None:
        job = self.jobs.get(job_id)
        on = set(devices) | set(job.devices if job else ())
        if not any(self.server_of(d) == 0 for d in on):
            return act()
        answer: Future = Future()

        def carry_out() -> None:
            try:
                later = act()
            except Exception as e:  # noqa: BLE001 - the action's error, as a node gives it
                answer.set_exception(e)
                return
            if later is None:
                answer.set_result(None)
            else:
                later.add_done_callback(lambda f: answer.set_exception(f.exception())
                                        if f.exception() else answer.set_result(None))
        with self._hold_lock:
            if not self.released:
                self.stalled.add(job_id)
                self._held.append(carry_out)
                return answer
        carry_out()
        return answer

    def start(self, job_id, launch, devices):
        return self._stall(job_id, devices,
                           lambda: HollowNodes.start(self, job_id, launch, devices))

    def suspend(self, job_id):
        return self._stall(job_id, (), lambda: HollowNodes.suspend(self, job_id))

    def resume(self, job_id, devices):
        return self._stall(job_id, devices, lambda: HollowNodes.resume(self, job_id, devices))

    def restart(self, job_id, devices):
        return self._stall(job_id, devices, lambda: HollowNodes.restart(self, job_id, devices))


@pytest.mark.timeout(120)
def test_a_node_that_stalls_every_action_holds_up_neither_the_loop_nor_other_servers(tmp_path):
    backend, nodes, clock = hollow("gandiva:quantum=1:-packing", tmp_path, StalledServer,
                                   servers=3, gpus=2, seed=2, feedback_steps=10)
    work = steps_for(nodes, 1.0)
    loop, _ = in_background(lambda: backend.run(until_idle=False))
    try:
        for i in range(12):  # 12 jobs on 6 GPUs: every server's jobs take turns
            backend.submit(JobSpec(f"j{i}", 0.0, 1, MODEL, mini_batches=work),
                           hollow_launch(MODEL, work))
        clock.run_until(lambda: nodes.stalled and sum(
            r.status == "done" for r in backend.records.values()) >= 6, limit=60)
        # server 0 has not carried out a single action, yet the others ran jobs to the end,
        # taking turns (suspends confirmed on servers 1 and 2), and the loop answers
        assert not nodes.released and nodes.stalled
        done_on = {d // 2 for r in backend.records.values() if r.status == "done"
                   for d in r.devices}
        assert done_on and 0 not in done_on
        confirmed = [a for _, a, _ in backend.actions if type(a).__name__ == "Suspend"]
        assert confirmed
        assert backend.cluster.transitions  # server 0's jobs: decided, not confirmed
    finally:
        nodes.release()
    clock.run_until(lambda: all(r.status == "done" for r in backend.records.values()),
                    limit=60)  # then all end
    stop(backend, clock, loop)


def test_the_cluster_view_shows_the_head_of_a_long_queue_and_its_length(tmp_path):
    from gandiva.backends.explain import QUEUE_SHOWN

    backend, _, clock = hollow("fifo", tmp_path, servers=1, gpus=1)
    count = QUEUE_SHOWN + 50
    for i in range(count):
        backend.submit(JobSpec(f"j{i:03d}", 0.0, 1, MODEL), hollow_launch(MODEL, 10**9))
    loop, _ = in_background(lambda: backend.run(until_idle=False))
    try:
        clock.run_until(lambda: backend.view()["queue_length"] == count - 1)  # one runs
        view = backend.view()
        assert view["queue"] == [f"j{i:03d}" for i in range(1, QUEUE_SHOWN + 1)]
        assert backend.explain(f"j{count - 1:03d}")["queue_position"] == count - 1
    finally:
        stop(backend, clock, loop)


def test_the_cluster_view_is_rebuilt_only_where_devices_changed(tmp_path):
    backend, _, clock = hollow("fifo", tmp_path, servers=3, gpus=2)
    loop, _ = in_background(lambda: backend.run(until_idle=False))

    def placed(count: int) -> dict:
        def on() -> set[str]:
            return {j for n in backend.view()["nodes"] for d in n["devices"] for j in d["jobs"]}
        clock.run_until(lambda: len(on()) == count)
        return backend.view()
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
        stop(backend, clock, loop)


class Recording(HollowNodes):
    """Hollow nodes that note what the server had stored (``stored``) when told to kill."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.stored: list[str] = []
        self.at_kill: list[list[str]] = []

    def kill(self, job_id):
        self.at_kill.append(list(self.stored))
        return super().kill(job_id)


def test_a_cancel_is_on_record_before_its_node_is_told(tmp_path):
    """A server that crashed between the two must not find the job running and bring it
    back: the change is stored (on_flush) before the kill is handed to the node."""
    backend, nodes, clock = hollow("fifo", tmp_path, Recording, servers=1, gpus=1)
    changes: list[str] = []
    backend.on_change = lambda rec, what: changes.append(what)
    backend.on_flush = lambda: (nodes.stored.extend(changes), changes.clear())
    backend.submit(JobSpec("a", 0.0, 1, MODEL), hollow_launch(MODEL, 10**9))
    loop, _ = in_background(lambda: backend.run(until_idle=False))
    try:
        clock.run_until(lambda: "a" in nodes.jobs)  # started on its node
        backend.cancel("a")
        clock.run_until(lambda: "a" not in nodes.jobs)  # the node stopped it
        assert len(nodes.at_kill) == 1 and "cancelled" in nodes.at_kill[0]
        assert backend.records["a"].status == "cancelled"
    finally:
        stop(backend, clock, loop)


def test_a_hold_and_new_priorities_asked_together_start_no_job_they_then_stop(tmp_path):
    """As a sweep pauses a trial and promotes others in one step: x is held, a and b raised,
    b above a. b takes x's GPU; neither a nor w (the next by the old priorities) is started
    on it and suspended again."""
    backend, nodes, clock = hollow("gandiva:quantum=1000:-packing", tmp_path, servers=1, gpus=1)
    for name in ("x", "w", "a", "b"):
        backend.submit(JobSpec(name, 0.0, 1, MODEL), hollow_launch(MODEL, 10**9))
    loop, _ = in_background(lambda: backend.run(until_idle=False))
    try:
        clock.run_until(lambda: "x" in nodes.jobs and len(backend.cluster.jobs) == 4)
        # one step's requests, in the order a sweep asks them
        backend.ask(Request("hold", "x"), Request("priority", "a", 1),
                    Request("priority", "b", 2))
        clock.run_until(lambda: "b" in nodes.jobs)
        later = clock.now() + 5.0  # what a late decision would still have sent
        clock.run_until(lambda: clock.now() >= later)
        started = {type(a).__name__ + ":" + a.job_id for _, a, _ in backend.actions}
        assert not started & {"Place:a", "Place:w", "Resume:a", "Resume:w"}
        assert backend.records["x"].status == "held"
    finally:
        stop(backend, clock, loop)
