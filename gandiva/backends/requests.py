"""What users ask of a job: cancel, hold, release, a new priority.

Asked from any thread (the API's) onto a queue; the driver's loop drains it at its next step
and carries the requests out (the loop alone changes the scheduler's state), in the order
asked, new priorities first. A held job checkpoints at its next mini-batch boundary and its
processes exit (it keeps no device and no host memory); a cancelled one is stopped at once.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("cancel", "hold", "release", "priority")


@dataclass(frozen=True)
class Request:
    what: str  # one of KINDS
    job_id: str
    arg: object = None  # a cancel's reason; the new priority


class Requests:
    """The queue of users' requests: put from any thread, drained by the loop."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Request, ...]] = queue.SimpleQueue()

    def put(self, *requests: Request) -> None:
        """Queue ``requests``; the loop takes them up in the same step."""
        for r in requests:
            if r.what not in KINDS:
                raise ValueError(f"no request {r.what!r}; ask one of {', '.join(KINDS)}")
        self._queue.put(requests)

    def drain(self) -> list[Request]:
        """Everything asked since the last drain, in the order to carry it out."""
        asked: list[Request] = []
        try:
            while True:
                asked.extend(self._queue.get_nowait())
        except queue.Empty:
            pass
        return in_order(asked)


def in_order(asked: Iterable[Request]) -> list[Request]:
    """Decision: the step's new priorities before its holds and cancels (otherwise in the
    order asked). A sweep pausing a trial and promoting others at once asks for the hold
    first; the device it freed went to the best job by the old priorities, which the new ones
    then suspended before it ran a mini-batch."""
    return sorted(asked, key=lambda r: r.what != "priority")
