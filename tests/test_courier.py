"""The courier carries actions out off the loop: in parallel where they share nothing, in
order where they share a job or a device."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future

from gandiva.backends.courier import Courier


def test_tasks_on_a_shared_key_keep_their_order_and_others_run_meanwhile():
    log: list[str] = []
    ended: list[tuple[str, BaseException | None]] = []
    gate, c_ran = threading.Event(), threading.Event()
    courier = Courier(lambda task, s, e: ended.append((task.what, e)), workers=4)

    def step(name: str, wait: threading.Event | None = None, then: threading.Event | None = None):
        def run() -> None:
            if wait is not None:
                assert wait.wait(10)
            log.append(name)
            if then is not None:
                then.set()
        return run

    courier.send("suspend a", step("suspend a", gate), [("job", "a"), ("device", 0)])
    courier.send("resume b on 0", step("resume b on 0"), [("job", "b"), ("device", 0)])
    courier.send("resume a on 1", step("resume a on 1"), [("job", "a"), ("device", 1)])
    courier.send("start c on 2", step("start c on 2", then=c_ran),
                 [("job", "c"), ("device", 2)])
    assert c_ran.wait(10)  # it shares nothing with the stalled suspend
    assert log == ["start c on 2"] and courier.pending() == 3
    gate.set()
    assert courier.wait(10)
    assert log[1] == "suspend a"  # the device is free, and the job's order kept, after it
    assert set(log[2:]) == {"resume b on 0", "resume a on 1"}
    assert len(ended) == 4 and all(e is None for _, e in ended)
    courier.close()


def test_a_failing_task_is_reported_and_those_after_it_still_run():
    ended: list[tuple[str, BaseException | None]] = []
    courier = Courier(lambda task, s, e: ended.append((task.what, e)), workers=2)

    def boom() -> None:
        raise RuntimeError("the node said no")

    courier.send("first", boom, [("job", "a")])
    courier.send("second", lambda: None, [("job", "a")])
    assert courier.wait(10)
    assert [w for w, _ in ended] == ["first", "second"]
    assert isinstance(ended[0][1], RuntimeError) and ended[1][1] is None
    courier.close()


def test_a_task_that_answers_with_a_future_frees_its_thread_and_ends_when_the_future_does():
    ended: list[tuple[str, BaseException | None]] = []
    courier = Courier(lambda task, s, e: ended.append((task.what, e)), workers=1)
    futures: dict[str, Future] = {}
    under_way = threading.Semaphore(0)  # released by each task as it answers

    def answer_later(name: str):
        def run() -> Future:
            futures[name] = Future()
            under_way.release()
            return futures[name]
        return run

    # one thread, three tasks on different jobs: all three are under way at once
    for name in ("a", "b", "c"):
        courier.send(name, answer_later(name), [("job", name)])
    courier.send("a again", lambda: None, [("job", "a")])
    assert all(under_way.acquire(timeout=10) for _ in range(3))
    assert ended == [] and courier.pending() == 4  # "a again" waits for a's future
    futures["b"].set_result(None)
    futures["a"].set_exception(RuntimeError("no room"))
    futures["c"].cancel()
    assert courier.wait(10)
    assert [w for w, _ in ended][:2] == ["b", "a"] and set(w for w, _ in ended) == {
        "a", "b", "c", "a again"}
    errors = dict(ended)
    assert isinstance(errors["a"], RuntimeError) and errors["b"] is None
    assert isinstance(errors["c"], CancelledError) and errors["a again"] is None
    courier.close()
