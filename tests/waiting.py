"""Waiting in tests: for a condition, a node's event or a driver's report, never for a time.

A test that sleeps a fixed time is slow where the machine is fast and flaky where it is
loaded; these return as soon as what the test waits for has happened, and fail naming it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

T = TypeVar("T")

TIMEOUT_S = 120.0  # generous: real training processes share a 2-core machine with others
POLL_S = 0.02  # how often a condition with no event of its own (a file, an API) is asked


def until(condition: Callable[[], T], timeout: float = TIMEOUT_S, what: str = "",
          alive: Callable[[], bool] | None = None, every: float = POLL_S) -> T:
    """``condition()``'s first truthy value, asked every ``every`` s (more where asking
    costs: a server's API). Fails after ``timeout`` s naming ``what`` and the last value,
    or at once when ``alive`` (a loop thread's ``is_alive``, say) says that what should
    bring it about has stopped."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if alive is not None and not alive():
            raise AssertionError(f"stopped before {what or 'the condition'}: {value!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout:g} s: waited for "
                                 f"{what or 'the condition'}")
        time.sleep(every)
    return value


def first_ok(get: Callable[[], T], ok: Callable[[T], bool], timeout: float = TIMEOUT_S,
             what: str = "", every: float = POLL_S) -> T:
    """The first value ``get()`` gives that is ``ok`` (for values that may be falsy, or that
    the failure should show)."""
    last: list[T] = []

    def fresh() -> bool:
        last[:] = [get()]
        return ok(last[0])
    try:
        until(fresh, timeout, what, every=every)
    except AssertionError as e:
        raise AssertionError(f"{e}; the last value: {last[0]!r}") from None
    return last[0]


def node_event(nodes: Any, kind: str, job_id: str | Collection[str],
               timeout: float = TIMEOUT_S, seen: list | None = None,
               backlog: list | None = None) -> Any:
    """The next ``kind`` event of ``job_id`` (or of any of several) from an agent's (or any
    ``Nodes``') events; a ``failed`` one raises its reason. Every event taken goes to
    ``seen`` when given; with ``backlog``, the events passed over wait there for a later
    call, which looks at them first."""
    jobs = {job_id} if isinstance(job_id, str) else set(job_id)
    for ev in backlog or ():
        if ev.job_id in jobs and ev.kind == kind:
            backlog.remove(ev)
            return ev
    deadline = time.monotonic() + timeout
    while True:
        ev = _next(nodes, deadline, f"a {kind!r} event of {sorted(jobs)} ({timeout:g} s)")
        if seen is not None:
            seen.append(ev)
        if ev.job_id in jobs and ev.kind == kind:
            return ev
        if ev.job_id in jobs and ev.kind == "failed":
            raise AssertionError(ev.data["reason"])
        if backlog is not None:
            backlog.append(ev)


def trains(agent: Any, job_id: str, timeout: float = TIMEOUT_S) -> None:
    """Until the job reports a mini-batch after the one it had reported when asked: it
    trains in this turn (its first report of a turn comes a quarter of a second in). The
    other events taken on the way are dropped."""
    past = agent.jobs[job_id].step
    deadline = time.monotonic() + timeout
    while True:
        ev = _next(agent, deadline, f"{job_id} to train")
        if ev.job_id != job_id:
            continue
        if ev.kind == "profile" and ev.data.step > past:
            return
        if ev.kind in ("done", "failed"):
            raise AssertionError(f"{job_id} {ev.kind} before it trained in this turn: {ev}")


def _next(nodes: Any, deadline: float, what: str) -> Any:
    while (left := deadline - time.monotonic()) > 0:
        try:
            return nodes.events.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
    raise AssertionError(f"timed out waiting for {what}")


class Reports:
    """What a driver reports of its jobs (``on_change``: job, what happened), for a test to
    wait on from its own thread while the driver's loop runs in another."""

    def __init__(self, driver: Any) -> None:
        self.seen: list[tuple[str, str]] = []
        self._changed = threading.Condition()
        before = driver.on_change

        def on_change(rec: Any, what: str) -> None:
            if before is not None:
                before(rec, what)
            with self._changed:
                self.seen.append((rec.spec.id, str(what)))
                self._changed.notify_all()

        driver.on_change = on_change

    def of(self, job_id: str) -> list[str]:
        with self._changed:
            return [what for j, what in self.seen if j == job_id]

    def wait(self, ok: Callable[[list[tuple[str, str]]], bool], timeout: float = TIMEOUT_S,
             what: str = "") -> None:
        """Until ``ok(seen)``, woken by each report."""
        with self._changed:
            if not self._changed.wait_for(lambda: ok(self.seen), timeout=timeout):
                raise AssertionError(f"no {what or 'such report'} within {timeout:g} s: "
                                     f"{self.seen}")

    def wait_for(self, job_id: str, what: str, timeout: float = TIMEOUT_S) -> None:
        """Until ``job_id`` has reported ``what`` ("running", "done", ...)."""
        self.wait(lambda seen: (job_id, what) in seen, timeout, f"{what!r} from {job_id}")
