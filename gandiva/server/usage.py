"""Usage from the record: each job's events read into the intervals ``accounting`` counts
(devices held, GPUs asked for, utilisation samples), for ``GET /v1/usage`` and
``gandiva usage``."""

from __future__ import annotations

from gandiva.accounting import JobUse, Usage, account
from gandiva.server.persistence import LEAVES_IN
from gandiva.server.store import EventRow, JobRow, Store
from gandiva.spec import TERMINAL, JobState

MOVES = ("migrated", "resized")  # running on, on other devices
# its processes stopped with the server (or the server came back: a crash's held time runs to
# the restart, the last the record can say)
STOPPED = ("stopped-for-shutdown", "shutdown-timeout", "requeued")


def job_use(row: JobRow, user: str, events: list[EventRow], until: float) -> JobUse:
    """One job's intervals from its events: it holds the devices of its latest ``running``
    (or move) until an event leaves it in another state; it asks for its GPUs from its
    submission to its end, but not while held."""
    use = JobUse(row.id, user, int(row.spec.get("gpus", 1)))
    holding: tuple[float, tuple[int, ...]] | None = None
    asking: float | None = row.submitted_at
    for e in events:
        state = LEAVES_IN.get(e.kind)
        if holding is not None and (e.kind in MOVES or e.kind == "running" or e.kind in STOPPED
                                    or (state is not None and state != JobState.RUNNING)):
            use.held.append((holding[0], e.at, holding[1]))
            holding = None
        if e.kind == "running" or e.kind in MOVES:
            holding = (e.at, tuple(e.data.get("devices", ())))
        if state == JobState.HELD or state in TERMINAL:
            if asking is not None:
                use.demand.append((asking, e.at))
            asking = None
        elif state is not None and asking is None:  # released
            asking = e.at
        if "utilization" in e.data:
            use.samples.append((e.at, e.data["utilization"]))
    if holding is not None:
        use.held.append((holding[0], until, holding[1]))
    if asking is not None:
        use.demand.append((asking, until))
    return use


def usage(store: Store, capacity: int, since: float, until: float,
          window: float = 3600.0) -> Usage:
    """The period's usage of every job alive in it, by the teams' tickets and quotas now."""
    jobs = [job_use(row, user, events, until) for row, user, events in store.lived(since, until)]
    quotas = {t.name: t.quota_gpus or 0 for t in store.teams()}
    return account(jobs, store.shares(), quotas, capacity, since, until, window)
