"""The hooks the gandiva policy's mechanisms plug into, and one decision's scratch data.

A mechanism subclasses ``Mechanism`` and overrides the hooks it needs; every hook does
nothing by default. The policy (``__init__.py``) builds its mechanisms from the config, in a
fixed order, and calls each hook on the mechanisms that override it, in that order. The
contract of each hook, with when it is called and what it may return: docs/policy.md#hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

from gandiva import actions as A
from gandiva import events as E
from gandiva.policies.gandiva.shared import Decision, Shared
from gandiva.policies.gandiva.timers import TimerKind
from gandiva.state import Cluster, Job


@dataclass(slots=True)
class Cycle:
    """One decision's scratch data: made when the decision begins, dropped when it ends."""

    event: E.Event
    arrived: Job | None = None  # the job that arrived, at an arrival
    touched: set[int] = field(default_factory=set)  # servers whose jobs changed
    rounded: set[int] = field(default_factory=set)  # the servers of this decision's round
    placed_on: set[int] = field(default_factory=set)  # servers given a job in this decision


class Mechanism:
    """A part of the policy that owns its state and plugs into the hooks below."""

    # the timer kinds it owns, each with the name of its method that handles one that is due:
    # ``method(cluster, server, cycle) -> Decision[bool]`` (True: look at the waiting jobs
    # again, it may have made room)
    timers: ClassVar[Mapping[TimerKind, str]] = {}

    # ---- what happened ------------------------------------------------------------------
    def observe(self, cluster: Cluster, event: E.Event, cycle: Cycle) -> Decision[None]:
        """An event, before the policy places anyone. May act (a profile sample ends a
        packing trial)."""
        return
        yield

    def acted(self, action: A.JobAction) -> None:
        """An action of the policy's own, as it is made (before the state applies it)."""

    def forget(self, job_id: str) -> None:
        """The job left the cluster: drop what is kept of it."""

    # ---- placing a waiting job ----------------------------------------------------------
    def order(self, job: Job, now: float) -> float:
        """A job's place among the jobs of its priority (lower first, summed over the
        mechanisms): the waiting queue (as the job is queued) and every round's slice order
        put it before their own rules."""
        return 0.0

    def permit(self, job: Job, cluster: Cluster) -> bool:
        """May ``job`` get a place now? A job no mechanism permits stays queued, and the scan
        goes on to the next (quotas)."""
        return True

    def filter(self, job: Job, server: int, cluster: Cluster) -> bool:
        """May ``job`` go on ``server``?"""
        return True

    def score(self, job: Job, server: int, cluster: Cluster) -> float:
        """How much ``job`` wants ``server``: the servers with the highest sum over the
        mechanisms go first, Algorithm 1's order among them."""
        return 0.0

    def make_room(self, cluster: Cluster, job: Job, choice: tuple[int, bool] | None
                  ) -> Decision[bool]:
        """``job`` found ``choice`` (a server and whether it starts there at once; None: no
        server): make room for it by acting on other jobs; whether it did (the policy then
        chooses again). Asked in order; each sees the choice made after the one before."""
        return False
        yield

    # ---- rounds and time ----------------------------------------------------------------
    def after_round(self, cluster: Cluster, servers: list[int], waits: dict[int, list[Job]]
                    ) -> Decision[Collection[int]]:
        """A time-slicing round on ``servers`` (in id order) left ``waits`` (server -> the
        jobs waiting there; a server where none wait is absent): seat what it can; the servers
        where jobs still wait (their next round is armed)."""
        return waits.keys()
        yield

    def after_decision(self, cluster: Cluster, cycle: Cycle) -> Decision[None]:
        """The decision is done but for asking for its next tick: arm timers, or act on what it
        changed. (Not after a decision on news for the mechanisms alone: a profile sample,
        an out-of-memory.)"""
        return
        yield

    # ---- votes, for putting off quiet rounds (``quiet.py``) -----------------------------
    def may_change(self, cluster: Cluster, sample: E.ProfileSample) -> bool:
        """May this profile sample change a decision of yours? (Every other event counts as a
        change.) By default it may."""
        return True

    def time_dependent(self) -> bool:
        """Could a decision of yours change with time alone, nothing else changing, beyond
        what the slice order says (``TimeSlicing.steady_until``)? By default it could."""
        return True




def ignores_samples(self: Mechanism, cluster: Cluster, sample: E.ProfileSample) -> bool:
    """``may_change`` of a mechanism that no profile sample can change."""
    return False


def overriders(mechanisms: list[Mechanism], hook: str) -> list[Any]:
    """The bound ``hook`` of each mechanism that overrides the default, in order: the policy
    calls only these (most hooks are overridden by one or two mechanisms)."""
    default = getattr(Mechanism, hook)
    return [getattr(m, hook) for m in mechanisms if getattr(type(m), hook) is not default]


# mechanisms from outside the package, by the name a spec gives them (``plugins=a+b``): each
# made from the policy's shared book, queue and timers
PLUGINS: dict[str, Callable[[Shared], Mechanism]] = {}


def plug_in(name: str, make: Callable[[Shared], Mechanism]) -> None:
    """Register a mechanism from outside the package: ``gandiva:plugins=<name>`` adds it after
    the built-in ones."""
    if name in PLUGINS and PLUGINS[name] is not make:
        raise ValueError(f"a mechanism named {name!r} is plugged in already")
    PLUGINS[name] = make


ENTRY_POINTS = "gandiva.mechanisms"  # a package's mechanisms: name = "module:factory"


def plugged(names: tuple[str, ...], shared: Shared) -> list[Mechanism]:
    """The mechanisms ``names`` (a spec's ``plugins``) made for one policy: registered with
    ``plug_in``, or by an installed package's entry point (what the CLI finds)."""
    if any(n not in PLUGINS for n in names):
        for point in entry_points(group=ENTRY_POINTS):
            if point.name in names and point.name not in PLUGINS:
                plug_in(point.name, point.load())
    unknown = [n for n in names if n not in PLUGINS]
    if unknown:
        known = ", ".join(sorted(PLUGINS)) or "none is registered (framework.plug_in)"
        raise ValueError(f"plugins: no mechanism named {', '.join(map(repr, unknown))}; "
                         f"known: {known}")
    return [PLUGINS[n](shared) for n in names]
