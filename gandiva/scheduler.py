"""The loop: events -> state -> policy -> actions -> state and backend.

The same loop drives every backend. A policy is a generator of actions: each action is applied
to the state (which checks the invariants) before the policy continues, so the policy always
sees the cluster as its earlier decisions left it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from gandiva.actions import Action
from gandiva.events import Confirmed, Event
from gandiva.state import Cluster


class Policy(Protocol):
    name: str

    def decide(self, event: Event, cluster: Cluster) -> Iterator[Action]: ...


class Backend(Protocol):
    def execute(self, action: Action, cluster: Cluster) -> None: ...


class Scheduler:
    def __init__(self, cluster: Cluster, policy: Policy, backend: Backend) -> None:
        self.cluster = cluster
        self.policy = policy
        self.backend = backend

    def handle(self, event: Event) -> None:
        self.cluster.observe(event)
        if isinstance(event, Confirmed):
            return  # a job's transition ended: the policy decided what follows already
        for action in self.policy.decide(event, self.cluster):
            self.cluster.apply(action)
            self.backend.execute(action, self.cluster)
