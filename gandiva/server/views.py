"""What readers see: a job as the API shows it, and the cluster view as JSON.

A job's stored row says its state; the scheduler's loop adds why it is (not) running and the
steps it has done. In the cluster view a job is named for its owner and for admins, and
anonymous ("(another user)") for everyone else.

The cluster view is encoded for each reader from parts kept between requests: each node's
part while the loop's view has the same node object (``Driver.view`` keeps a node that did
not change), each job's encoding as that reader sees it, each device's head. At a thousand
servers, encoding 8,000 devices and 20,000 jobs at every request of every dashboard cost the
API its latency. Between two views most nodes do not change; in a round most do, and then
joining kept encodings took 10-12 ms where encoding each node whole took about 50 (1,000 x 8,
20,000 jobs, 1.6 MB; the same bytes).
"""

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from gandiva.backends.driver import Driver
from gandiva.server.store import JobRow, Principal
from gandiva.spec import TERMINAL

READERS_KEPT = 16  # readers whose encoded parts are kept (the most recent)
JOBS_KEPT = 100_000  # jobs whose encoding a reader keeps (the most recently used)
MODES = {0: "idle", 1: "exclusive"}  # a device's mode by its count of jobs (more: packed)
ANONYMOUS_JOB = '{"id":null,"name":"(another user)","mine":false}'  # another user's job


class JobView(BaseModel):
    id: str
    name: str
    user_id: int
    state: str  # queued, running, suspended (its turn will come), held, done, failed, cancelled
    reason: str  # why it failed or was stopped
    why: str  # the scheduler's view in words: why it is (not) running
    steps: int  # mini-batches done, as the job last reported (0 before this server saw any)
    priority: int
    gpus: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    labels: dict[str, str] = {}
    submission_id: str | None = None


def encoded(job_id: str, name: str) -> tuple[str, str]:
    """A job in the cluster view, encoded as its owner and as an admin see it."""
    owner, admin = (json.dumps({"id": job_id, "name": name, "mine": mine},
                               separators=(",", ":")) for mine in (True, False))
    return owner, admin


@dataclass
class Reader:
    """What is kept for one reader: node -> (the loop's node, its part encoded), and its
    jobs' encodings (a cached function of the job id)."""

    job: Callable[[str], str]
    nodes: dict[int, tuple[dict, str]] = field(default_factory=dict)


class Views:
    def __init__(self, backend: Driver) -> None:
        self.backend = backend
        # job -> (its user, its encodings as its owner and as an admin see it), from its
        # submission until it ends: made on the API's thread, not by its first reader
        self._owned: dict[str, tuple[int, str, str]] = {}
        self._readers: OrderedDict[int, Reader] = OrderedDict()
        self._readers_lock = threading.Lock()
        self._device_heads: dict[int, str] = {}  # device -> its part before its jobs

    # ---- a job -----------------------------------------------------------------------------
    def job(self, row: JobRow) -> JobView:
        rec = self.backend.records.get(row.id)
        return JobView(id=row.id, name=row.name, user_id=row.user_id, state=row.state,
                       reason=row.reason, why=self.why(row),
                       steps=rec.steps if rec is not None else 0, priority=row.priority,
                       gpus=row.spec["gpus"], submitted_at=row.submitted_at,
                       started_at=row.started_at, finished_at=row.finished_at,
                       labels=row.spec.get("labels") or {},
                       submission_id=row.submission_id)

    def why(self, row: JobRow) -> str:
        if row.state in TERMINAL:
            return row.reason or row.state
        try:
            return self.explain(row)["reason"]
        except ValueError:
            return ""

    def explain(self, row: JobRow) -> dict:
        """The loop's explanation of the job, naming only its user's other jobs: ids carry
        job names, and another user's are not theirs to read."""
        def shown(job_id: str) -> str:
            owner = self._owned.get(job_id)
            return job_id if owner is not None and owner[0] == row.user_id else \
                "another user's job"
        return self.backend.explain(row.id, shown)

    # ---- whose jobs ------------------------------------------------------------------------
    def own(self, job_id: str, user: int, name: str) -> None:
        self._owned[job_id] = (user, *encoded(job_id, name))

    def forget(self, job_id: str) -> None:
        """(The loop.) The job ended: no view shows it any more."""
        self._owned.pop(job_id, None)

    # ---- the cluster -----------------------------------------------------------------------
    def cluster_json(self, who: Principal) -> bytes:
        """The loop's view, each job named, or anonymous if ``who`` may not see it."""
        view = self.backend.view()
        reader = self._reader(who)
        parts = []
        for node in view["nodes"]:
            hit = reader.nodes.get(node["id"])
            if hit is None or hit[0] is not node:
                hit = reader.nodes[node["id"]] = (node, self._node_json(node, reader.job))
            parts.append(hit[1])
        rest = json.dumps({**{k: v for k, v in view.items() if k != "nodes"},
                           "queue": [j if who.admin or self._owned.get(j, (None,))[0] == who.id
                                     else None for j in view["queue"]]},
                          separators=(",", ":"))
        return f'{rest[:-1]},"nodes":[{",".join(parts)}]}}'.encode()

    def _reader(self, who: Principal) -> Reader:
        with self._readers_lock:
            reader = self._readers.get(who.id)
            if reader is None:
                reader = self._readers[who.id] = Reader(functools.lru_cache(JOBS_KEPT)(
                    functools.partial(self._job_json, who=who)))
                if len(self._readers) > READERS_KEPT:
                    self._readers.popitem(last=False)
            self._readers.move_to_end(who.id)
            return reader

    def _node_json(self, node: dict, job: Callable[[str], str]) -> str:
        devices = []
        for d in node["devices"]:
            head = self._device_heads.get(d["id"])
            if head is None:
                kind = self.backend.cluster.gpus[d["id"]].type
                head = self._device_heads[d["id"]] = (
                    f'{{"id":{d["id"]},"name":{json.dumps(d["name"])},'
                    f'"kind":{json.dumps(kind)},"jobs":[')
            jobs = d["jobs"]
            devices.append(f'{head}{",".join(map(job, jobs))}],'
                           f'"mode":"{MODES.get(len(jobs), "packed")}"}}')
        up = node["up"]
        return (f'{{"id":{node["id"]},"up":{"true" if up else "false"},'
                f'"name":"node{node["id"]}{"" if up else " (down)"}",'
                f'"time_sliced":[{",".join(map(job, node["time_sliced"]))}],'
                f'"devices":[{",".join(devices)}]}}')

    def _job_json(self, job_id: str, who: Principal) -> str:
        """A job in the cluster view as ``who`` sees it: named if it is theirs or they are
        an admin, else anonymous."""
        user, as_owner, as_admin = self._owned.get(job_id) or (None, *encoded(job_id, job_id))
        if user == who.id:
            return as_owner
        return as_admin if who.admin else ANONYMOUS_JOB
