"""Policies, by name (``POLICIES``). Each lives in its own module ``gandiva.policies.<module>``
exposing ``POLICY`` and its parameters as ``Options`` (a pydantic model), or ``build`` and
``PRESETS`` (the gandiva policy, whose presets are names of their own).

A policy spec names the policy and optionally sets its parameters after colons:
``las``, ``fifo:backfill``, ``gandiva:-packing:quantum=30``. ``-flag`` switches a boolean
parameter off, ``flag`` alone switches it on, ``key=value`` sets any parameter (converted to
its type by the policy's model). Colons (not commas) separate parameters so that ``--policy
fifo,las,gandiva:-packing`` stays a list. One grammar for all (``spec_options``); the gandiva
policy adds dotted paths into its sections.
"""

from __future__ import annotations

import importlib
import random
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

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
    return {k: f.default for k, f in module.Options.model_fields.items()}


def summary(name: str) -> str:
    """The first line of a policy's docstring."""
    return (_module(name).__doc__ or "").strip().splitlines()[0]


class Options(BaseModel):
    """A policy's parameters, as its spec sets them (each policy module subclasses it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def spec_options(options: list[str]) -> list[tuple[list[str], Any]]:
    """The one grammar of a spec's options: ``a.b=v`` sets ``a.b`` to ``v`` (text, read by the
    policy's pydantic model), ``a.b`` alone to True, ``-a.b`` to False; ``-`` in a name is
    ``_``. Each as (its dotted path's keys, value)."""
    out: list[tuple[list[str], Any]] = []
    for opt in filter(None, (o.strip() for o in options)):
        if "=" in opt:
            path, raw = (x.strip() for x in opt.split("=", 1))
            value: Any = raw
        else:
            path, value = (opt[1:], False) if opt.startswith("-") else (opt, True)
        out.append((path.replace("-", "_").split("."), value))
    return out


def validation_problems(error: ValidationError) -> str:
    """A pydantic error as 'field: what is wrong (got what it was given)', one per field."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
        + (f" (got {e['input']!r})" if e["loc"] and not isinstance(e["input"], dict) else "")
        for e in error.errors())


def make_policy(spec: str, seed: int = 0) -> Policy:
    """Build a policy from its spec string; ``seed`` feeds the only randomness it may use."""
    name, *opts = [p.strip() for p in spec.strip().split(":")]
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}")
    module = _module(name)
    if hasattr(module, "build"):
        return module.build(name, list(filter(None, opts)), spec=spec.strip())
    model: type[Options] = module.Options
    values: dict[str, Any] = {}
    for keys, value in spec_options(opts):
        if len(keys) > 1 or keys[0] not in model.model_fields:
            raise ValueError(f"policy {name!r} has no parameter {'.'.join(keys)!r}; it has: "
                             f"{', '.join(sorted(model.model_fields))}")
        values[keys[0]] = value
    try:
        options = model.model_validate(values)
    except ValidationError as e:
        raise ValueError(f"policy {name!r}: {validation_problems(e)}") from None
    policy = module.POLICY(**options.model_dump())
    policy.rng = random.Random(seed)
    policy.spec = spec.strip()
    return policy
