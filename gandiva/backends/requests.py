"""What users ask of a job: cancel, hold, release, a new priority; and the time limit they set.

Asked from any thread (the API's), carried out by the driver's loop at its next step, in the
order asked, new priorities first: the loop alone changes the scheduler's state. A held job
checkpoints at its next mini-batch boundary and its processes exit (it keeps no device and no
host memory); a cancelled one, or one past its time limit (its turns on a device counted, not
its waits, as Slurm's TIMEOUT), is stopped at once.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from gandiva import events as E
from gandiva.spec import TERMINAL, JobState
from gandiva.state import JobStatus

if TYPE_CHECKING:
    from gandiva.backends.driver import Driver


class Requests:
    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self._lock = threading.Lock()
        self._asked: list[tuple[str, str, object]] = []  # (what, job, argument)
        self._limited: dict[str, None] = {}  # jobs with a time limit, not yet ended

    # ---- any thread ---------------------------------------------------------------------
    def ask(self, what: str, job_id: str, arg: object = None) -> None:
        """``what``: "cancel", "hold", "release" or "priority" (``arg``: the new one)."""
        if job_id not in self.driver.records:
            raise ValueError(f"no job {job_id!r}")
        with self._lock:
            self._asked.append((what, job_id, arg))

    def limit(self, job_id: str) -> None:
        """The job has a time limit (its record's ``time_limit``): watch it."""
        with self._lock:
            self._limited[job_id] = None

    # ---- the loop -----------------------------------------------------------------------
    def carry_out(self) -> None:
        """Everything asked since the last step, then the time limits."""
        with self._lock:
            asked, self._asked = self._asked, []
        # Decision: the step's new priorities before its holds and cancels (otherwise in the
        # order asked). A sweep pausing a trial and promoting others at once asks for the
        # hold first; the device it freed went to the best job by the old priorities, which
        # the new ones then suspended before it ran a mini-batch
        asked.sort(key=lambda a: a[0] != "priority")
        for what, job_id, arg in asked:
            self._one(what, job_id, arg)
        self._time_limits()

    def _one(self, what: str, job_id: str, arg: object) -> None:
        d = self.driver
        rec = d.records[job_id]
        if rec.status in TERMINAL:
            return
        if what == "cancel":
            self.end(job_id, JobState.CANCELLED, str(arg or "cancelled"))
        elif what == "hold" and rec.status != JobState.HELD:
            d.set(rec, "held", JobState.HELD)  # on record before its node is told
            self._withdraw(job_id, how="held")
        elif what == "release" and rec.status == JobState.HELD:
            d.requeue(dataclasses.replace(rec.spec, submit_time=d.now()))
            d.set(rec, "released", JobState.QUEUED)
        elif what == "priority":
            rec.spec = dataclasses.replace(rec.spec, priority=int(arg))
            job = d.cluster.jobs.get(job_id)
            if job is not None and job.status not in (JobStatus.DONE, JobStatus.KILLED):
                d.handle(E.PriorityChange(d.now(), job_id, int(arg)))

    def _time_limits(self) -> None:
        d, now = self.driver, self.driver.now()
        # only the jobs that have a limit (a list kept under the lock: the API's threads
        # submit meanwhile), not every running job at every turn of the loop
        with self._lock:
            limited = list(self._limited)
        for job_id in limited:
            rec = d.records[job_id]
            if rec.status in TERMINAL:
                with self._lock:
                    del self._limited[job_id]
            elif rec.running_since is not None and rec.running_time(now) >= rec.time_limit:
                self.end(job_id, JobState.FAILED,
                         f"time limit reached: it ran {rec.time_limit:g} s")

    def end(self, job_id: str, state: JobState, reason: str) -> None:
        """Stop the job for good, in ``state`` for ``reason``."""
        d = self.driver
        rec = d.records[job_id]
        rec.finish = d.now()
        rec.reason = reason
        # on record before its node is told: a server that crashes in between must not
        # bring a cancelled job back
        d.set(rec, state, state)
        self._withdraw(job_id, how=state)

    def _withdraw(self, job_id: str, how: str) -> None:
        """Take the job out of the arrivals, its node and the cluster state: held jobs
        checkpoint first; cancelled and timed-out ones are killed."""
        d = self.driver
        rec = d.records[job_id]
        d.unqueue(job_id)
        nodes = d.agent
        stop = nodes.park if how == "held" else nodes.kill

        def withdraw() -> Future | None:
            if job_id in nodes.jobs:
                return stop(job_id)
            nodes.ended.add(job_id)  # not started yet: an action sent before must not start it
            return None
        d.send(job_id, how, withdraw, rec.devices)
        d.stopped_running(rec)
        job = d.cluster.jobs.get(job_id)
        if job is not None and job.status not in (JobStatus.DONE, JobStatus.KILLED):
            d.handle(E.Departure(d.now(), job_id, how="cancelled"))
