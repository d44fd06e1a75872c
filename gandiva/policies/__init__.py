"""Policies, by name (``POLICIES``). Each lives in its own module ``gandiva.policies.<module>``
exposing ``POLICY`` (a dataclass), or ``build`` and ``PRESETS`` (the gandiva policy, whose
presets are names of their own).

A policy spec names the policy and optionally sets its parameters after colons:
``las``, ``fifo:backfill``, ``gandiva:-packing:quantum=30``. ``-flag`` switches a boolean
parameter off, ``flag`` alone switches it on, ``key=value`` sets any parameter (converted to
its type). Colons (not commas) separate parameters so that ``--policy fifo,las,gandiva:-packing``
stays a list. A module with ``PRESETS`` and ``build`` reads its own parameters.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from gandiva.scheduler import Policy

# policy (or preset) name -> the module under gandiva.policies that builds it (imported when
# the policy is first asked for)
POLICIES: dict[str, str] = {
    "fifo": "fifo",
    "las": "las",
    "slicer": "slicer",
    "gandiva": "gandiva",
    "gandiva-paper": "gandiva",
}


@runtime_checkable
class AssignsServers(Protocol):
    """A policy that gives each job the servers it belongs to (over-subscribed servers take
    turns among their own): what readers (``backends.explain``) show as a job's home."""

    def placements(self) -> Any:
        """Where jobs belong: a ``backends.explain.Placements``, or a plain book with
        ``changes``, ``home`` and ``height(server)`` that the reader copies."""


@runtime_checkable
class TimeSlices(Protocol):
    """A policy that gives jobs turns of ``quantum`` seconds."""

    @property
    def quantum(self) -> float: ...


@runtime_checkable
class PutsOffQuietRounds(Protocol):
    """A policy that may put off time-slicing rounds that would change nothing, where the
    backend watches no round (the simulator without its timeline or a controller)."""

    def put_off_quiet_rounds(self) -> None: ...


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"gandiva.policies.{POLICIES[name]}")


def available() -> list[str]:
    return sorted(POLICIES)


def parameters(name: str) -> dict[str, Any]:
    """A policy's (or preset's) parameters and their defaults, as a spec names them."""
    module = _module(name)
    if hasattr(module, "parameters"):
        return module.parameters(name)
    hidden = ("name", "spec", "rng")
    return {f.name: f.default for f in dataclasses.fields(module.POLICY)
            if f.init and not f.name.startswith("_") and f.name not in hidden}


def summary(name: str) -> str:
    """The first line of a policy's docstring."""
    return (_module(name).__doc__ or "").strip().splitlines()[0]


def _convert(name: str, raw: str, kind: Any) -> Any:
    text = str(kind)
    try:
        if "bool" in text:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if "tuple" in text:
            return tuple(float(x) for x in raw.split("/") if x)
        if "int" in text and "float" not in text:
            return int(raw)
        if "float" in text:
            return float(raw)
    except ValueError:
        raise ValueError(f"policy parameter {name!r}: cannot read {raw!r} as {text}") from None
    return raw


def make_policy(spec: str, seed: int = 0) -> Policy:
    """Build a policy from its spec string; ``seed`` feeds the only randomness it may use."""
    name, *opts = [p.strip() for p in spec.strip().split(":")]
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}")
    module = _module(name)
    if hasattr(module, "build"):
        return module.build(name, list(filter(None, opts)), spec=spec.strip())
    cls = module.POLICY
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name != "rng"}
    kwargs: dict[str, Any] = {}
    for opt in filter(None, opts):
        if "=" in opt:
            key, raw = opt.split("=", 1)
        elif opt.startswith("-"):
            key, raw = opt[1:], "false"
        else:
            key, raw = opt, "true"
        key = key.strip().replace("-", "_")
        if key not in fields:
            raise ValueError(
                f"policy {name!r} has no parameter {key!r}; it has: {', '.join(sorted(fields))}"
            )
        kwargs[key] = _convert(key, raw.strip(), fields[key].type)
    policy = cls(**kwargs)
    policy.rng = random.Random(seed)
    policy.spec = spec.strip()
    return policy
