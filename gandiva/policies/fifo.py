"""``fifo``: the paper's baseline. Exclusive GPUs, no over-subscription, locality-aware bin-packing.

Jobs start in arrival order. Strict by default: a job that does not fit blocks the ones behind
it (no starvation of big gangs). ``fifo:backfill`` lets later jobs that fit jump ahead, scanning
at most ``backfill_depth`` queued jobs per decision so that a long queue stays cheap.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import Field

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies import Options as PolicyOptions
from gandiva.policies.placement import best_fit
from gandiva.state import Cluster


class Options(PolicyOptions):
    backfill: bool = False
    backfill_depth: int = Field(256, ge=1)


@dataclass
class Fifo:
    backfill: bool = False
    backfill_depth: int = 256  # bounds one decision's cost; deeper jobs wait for the next event
    name: str = "fifo"
    spec: str = "fifo"
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def decide(self, event: E.Event, cluster: Cluster) -> Iterator[A.Action]:
        if isinstance(event, E.ProfileSample | E.Tick):
            return  # any other event may let the head start: GPUs freed, a server joined
        free = cluster.free_count()
        depth = self.backfill_depth if self.backfill else 1
        i = 0  # index into the queue; a started job leaves it, so the index stays put
        while free > 0 and i < min(depth, len(cluster.queue)):
            job = cluster.jobs[cluster.queue[i][2]]
            gpus = best_fit(cluster, job.num_gpus) if job.num_gpus <= free else None
            if gpus is None:
                i += 1
                continue
            yield A.Place(job.id, gpus)
            free -= job.num_gpus

POLICY = Fifo
