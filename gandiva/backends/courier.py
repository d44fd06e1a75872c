"""Carrying out actions off the loop: in parallel, in the order that matters.

The loop decides and goes on; a suspend that waits for a job's next mini-batch boundary, or a
checkpoint of a large model, must not hold up every other decision. Each action is a task with
keys: its job, and every device it frees or takes. A task starts once every earlier task that
shares a key with it has ended, so a job's actions keep their order, and a job is resumed on a
device only after the job that had the device has let it go; tasks that share nothing run at
the same time, on a pool of threads.

A task either blocks until it is done (the agent's calls: a suspend waits for the mini-batch
boundary), holding its thread meanwhile, or returns at once with a ``Future`` that its node
completes later (hollow nodes, and any node that answers asynchronously): its thread goes back
to the pool, and the task ends when the future does. Decision: so a round of thousands of
actions on nodes that answer asynchronously needs no thread per action under way.

Decision: a task that does not end within its deadline is reported as failed (the loop
handles that job), but its thread is not interrupted (a Python thread cannot be); the tasks
after it on the same keys wait for it, as they must: their devices are not free until it ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from gandiva.backends.clock import INF, Clock, WallClock


@dataclass(eq=False)
class Task:
    what: object  # what the caller wants back when the task ends (e.g. the action)
    run: Callable[[], Future | None]
    keys: frozenset[Hashable]
    sent: float  # on the courier's clock
    waits: int = 0  # earlier tasks on the same keys still unfinished
    then: list[Task] = field(default_factory=list)  # later tasks waiting for this one
    started: float | None = None
    ended: bool = False


class Courier:
    """Runs tasks on ``workers`` threads; ``done(task, seconds, error)`` is called from the
    worker as each ends (``seconds``: from its start, on ``clock``; ``error``: None or the
    exception)."""

    def __init__(self, done: Callable[[Task, float, BaseException | None], None],
                 workers: int = 16, clock: Clock | None = None) -> None:
        self._done = done
        self.clock = clock or WallClock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gandiva-act")
        self._lock = threading.Lock()
        self._emptied: queue.Queue[None] = queue.Queue()  # to those in ``wait``
        self._waiting = 0  # threads in ``wait``
        self._last: dict[Hashable, Task] = {}  # the latest task holding each key
        self._open = 0  # tasks sent and not ended

    def send(self, what: object, run: Callable[[], Future | None], keys: Iterable[Hashable]
             ) -> Task:
        task = Task(what, run, frozenset(keys), self.clock.now())
        with self._lock:
            self._open += 1
            for before in {self._last[k] for k in task.keys if k in self._last}:
                before.then.append(task)
                task.waits += 1
            for k in task.keys:
                self._last[k] = task
            ready = task.waits == 0
        if ready:
            self._submit(task)
        return task

    def _run(self, task: Task) -> None:
        task.started = self.clock.now()
        try:
            later = task.run()
        except BaseException as e:  # noqa: BLE001 - reported to the loop, never lost
            self._end(task, e)
            return
        finally:
            self.clock.let_go()  # (held from _submit: the node has the action now)
        if isinstance(later, Future):  # the node answers later; the thread is free now
            later.add_done_callback(lambda f: self._end(
                task, CancelledError("the node closed first") if f.cancelled() else f.exception()))
        else:
            self._end(task, None)

    def _end(self, task: Task, error: BaseException | None) -> None:
        seconds = self.clock.now() - (task.started or task.sent)
        task.ended = True
        try:
            self._done(task, seconds, error)
        finally:
            ready = []
            with self._lock:
                for k in task.keys:
                    if self._last.get(k) is task:
                        del self._last[k]
                for after in task.then:
                    after.waits -= 1
                    if after.waits == 0:
                        ready.append(after)
                self._open -= 1
                if self._open == 0:
                    for _ in range(self._waiting):
                        self._emptied.put(None)
            for after in ready:
                self._submit(after)

    def _submit(self, task: Task) -> None:
        self.clock.hold()  # until a worker has handed the task to its node
        try:
            queued = self._pool.submit(self._run, task)
        except RuntimeError as e:  # closed: it is not carried out, and says so
            self._not_run(task, e)
            return
        queued.add_done_callback(lambda f: self._not_run(
            task, CancelledError("the courier closed first")) if f.cancelled() else None)

    def _not_run(self, task: Task, error: BaseException) -> None:
        self.clock.let_go()
        self._end(task, error)

    def pending(self) -> int:
        """Tasks sent and not ended (waiting or running)."""
        with self._lock:
            return self._open

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every task sent has ended; False if ``timeout`` (on the courier's
        clock) passed first."""
        until = INF if timeout is None else self.clock.now() + timeout
        with self._lock:
            self._waiting += 1
        try:
            while True:
                with self._lock:
                    if self._open == 0:
                        return True
                try:
                    self.clock.get(self._emptied, until)
                except queue.Empty:
                    with self._lock:
                        return self._open == 0
        finally:
            with self._lock:
                self._waiting -= 1

    def close(self, timeout: float | None = None) -> None:
        self.wait(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
