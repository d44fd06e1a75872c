"""The gandiva policy's settings: one section per mechanism, validated, and refused where a
setting has no effect (``keep_turn`` under round-robin, a packing gain with packing off).

Two presets name the policies we run: ``gandiva``, the default, and ``gandiva-paper``, the
paper's (round-robin slices, each server its own order, newcomers queue when every server is
at ``max_height``, gangs take their servers whole). Why each default is what it is:
docs/policy.md and the records in docs/decisions/.

A spec sets values after the preset's name, colon-separated, by dotted path:
``gandiva:quantum=30:-packing:slices.order=las``. ``-section`` switches a section off,
``section`` alone on; ``-a.b`` sets a boolean false, ``a.b`` true.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gandiva.policies import spec_options, validation_problems
from gandiva.policies.gandiva.order import LEAST_STEP, MORE_LEVELS


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def idle(self) -> dict[str, str]:
        """The settings that have no effect here, each with what it needs."""
        return {}

    @model_validator(mode="after")
    def _effective(self) -> Section:
        for field, unless in self.idle().items():
            if field in self.model_fields_set:
                raise ValueError(f"{field} has no effect unless {unless}: leave it out")
        return self


class PlacementSettings(Section):
    """Algorithm 1: affinity placement, over-subscribing servers up to ``max_height``."""

    oversubscribe: bool = True
    # jobs' demand per GPU on an over-subscribed server: each job still gets a 60 s slice
    # every 8 minutes, and suspended jobs' state stays well inside a server's RAM
    # (docs/decisions/0001-default-beyond-the-paper.md)
    max_height: float = Field(8.0, gt=0)
    scan_depth: int = Field(256, ge=1)  # waiting jobs examined per decision


class SlicesSettings(Section):
    """The order of time slices on an over-subscribed server (``order.py``)."""

    # "levels": a job never run first, then attained-service levels (docs/decisions/0002);
    # "roundrobin": the paper's; "las": least attained service
    order: Literal["roundrobin", "las", "levels"] = "levels"
    keep_turn: bool = True  # a running job goes before the waiting jobs of its level (0002)
    # a level every time attained service grows by this factor, beyond Tiresias' two (0008)
    level_step: float = 10 ** 0.5

    def idle(self) -> dict[str, str]:
        if self.order != "levels":
            return dict.fromkeys(("keep_turn", "level_step"), "order=levels")
        return {}

    @model_validator(mode="after")
    def _step(self) -> SlicesSettings:
        if not (self.level_step == 1 or LEAST_STEP <= self.level_step < math.inf):
            raise ValueError(f"level_step must be 1 (no levels beyond the las policy's) or "
                             f"from {LEAST_STEP:.3f} (at most {MORE_LEVELS} levels more) to a "
                             f"finite number, not {self.level_step}")
        return self


class BalanceSettings(Section):
    """One slice order across servers, as LAS has one across the cluster (decision 0003)."""

    enabled: bool = True
    servers: Literal["rotating", "all"] = "all"  # "all": every server with jobs joins a round
    spare_gangs: bool = True  # a waiting job takes its turn off a running gang's servers (0006)
    idle_to_gangs: bool = True  # a waiting gang takes GPUs a round leaves idle elsewhere (0007)

    def idle(self) -> dict[str, str]:
        return {} if self.enabled else dict.fromkeys(
            ("servers", "spare_gangs", "idle_to_gangs"), "balance is on")


class GangsSettings(Section):
    """How a gang wider than a server takes its turn (decision 0006)."""

    share: Literal["used", "whole"] = "used"  # "whole": its servers whole, as the paper reads


class AdmissionSettings(Section):
    """Who gets a place when every server is at ``max_height`` (decision 0005)."""

    rule: Literal["queue", "las"] = "las"  # "queue": the paper's, newcomers wait
    # a job is sent back only for one it has this many GPU-seconds more than, so that jobs of
    # similar age do not evict each other back and forth
    displace_margin: float = Field(3600.0, ge=0)

    def idle(self) -> dict[str, str]:
        return {} if self.rule == "las" else {"displace_margin": "rule=las"}


class PackingSettings(Section):
    """Introspective packing under overload (``packing.py``)."""

    enabled: bool = True
    # a packed pair must beat time-slicing's normalised throughput of 1.0 by this much
    # (profiles are noisy; a tie is not worth its interference risk)
    min_gain: float = 0.05
    spread: bool = True  # free GPUs elsewhere go to packed jobs a quantum later (0009)

    def idle(self) -> dict[str, str]:
        return {} if self.enabled else dict.fromkeys(("min_gain", "spread"), "packing is on")


class MigrationSettings(Section):
    """Migration for locality when jobs leave (``migration.py``)."""

    enabled: bool = True
    max_moves: int = Field(4, ge=1)  # per decision: one departure cannot start a storm

    def idle(self) -> dict[str, str]:
        return {} if self.enabled else {"max_moves": "migration is on"}


class DefragSettings(Section):
    """Defragmentation while a job waits on fragmented GPUs (``migration.py``)."""

    enabled: bool = True
    interval: float = Field(300.0, gt=0)  # seconds between tries
    max_move_s: float = Field(10.0, ge=0)  # "negligible loss": dearer moves are not made

    def idle(self) -> dict[str, str]:
        return {} if self.enabled else dict.fromkeys(("interval", "max_move_s"),
                                                     "defrag is on")


class ElasticSettings(Section):
    """Grow into idle GPUs, shrink when new work needs them (``elastic.py``)."""

    enabled: bool = True
    # idle this long before a job grows: a burst of arrivals is not met by a job that must
    # shrink again at once
    grow_idle_s: float = Field(300.0, ge=0)

    def idle(self) -> dict[str, str]:
        return {} if self.enabled else {"grow_idle_s": "elastic is on"}


class FairSettings(Section):
    """Fair shares by tickets: team, then user, then job (``fair.py``)."""

    enabled: bool = False
    # seconds a gang across servers waits before it reserves them (decision 0039)
    gang_wait: float = Field(1800.0, gt=0)

    def idle(self) -> dict[str, str]:
        return {} if self.enabled else {"gang_wait": "fair is on"}


class Config(Section):
    quantum: float = Field(60.0, gt=0)  # the paper's suspend/resume quantum (seconds)
    # mechanisms from outside the package, by their registered names (``framework.plug_in``);
    # a spec writes ``plugins=a+b``
    plugins: tuple[str, ...] = ()
    placement: PlacementSettings = PlacementSettings()
    slices: SlicesSettings = SlicesSettings()
    balance: BalanceSettings = BalanceSettings()
    gangs: GangsSettings = GangsSettings()
    admission: AdmissionSettings = AdmissionSettings()
    packing: PackingSettings = PackingSettings()
    migration: MigrationSettings = MigrationSettings()
    defrag: DefragSettings = DefragSettings()
    elastic: ElasticSettings = ElasticSettings()
    fair: FairSettings = FairSettings()

    @field_validator("plugins", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return tuple(n for n in value.split("+") if n) if isinstance(value, str) else value


# the presets, as the values they set over the defaults
PRESETS: dict[str, dict[str, Any]] = {
    "gandiva": {},
    "gandiva-paper": {"slices": {"order": "roundrobin"}, "balance": {"enabled": False},
                      "admission": {"rule": "queue"}, "gangs": {"share": "whole"},
                      "packing": {"spread": False}},
}
# sections with ``enabled``
SWITCHED = ("balance", "packing", "migration", "defrag", "elastic", "fair")

# the flat names of earlier specs, for an error that names the new spelling
RENAMED = {
    "pack": "packing", "migrate": "migration", "oversubscribe": "placement.oversubscribe",
    "max_height": "placement.max_height", "scan_depth": "placement.scan_depth",
    "slice_order": "slices.order", "keep_turn_in_level": "slices.keep_turn",
    "level_step": "slices.level_step", "balance_all": "balance.servers=all|rotating",
    "spare_gangs": "balance.spare_gangs", "idle_to_gangs": "balance.idle_to_gangs",
    "gang_shares": "gangs.share=used|whole", "las_admission": "admission.rule=las|queue",
    "displace_margin": "admission.displace_margin", "pack_min_gain": "packing.min_gain",
    "spread_packed": "packing.spread", "grow_idle_s": "elastic.grow_idle_s",
    "defrag_interval": "defrag.interval", "defrag_max_move_s": "defrag.max_move_s",
    "max_moves": "migration.max_moves",
}


def parse(preset: str, options: list[str]) -> Config:
    """The config of ``preset`` with ``options`` (a spec's parts after the name) over it."""
    values = _copy(PRESETS[preset])
    parsed = spec_options(options)
    for keys, value in parsed:  # the preset's values of a section switched off do not apply
        if value is False and len(keys) == 1 and keys[0] in values:
            del values[keys[0]]
    for keys, value in parsed:
        path = ".".join(keys)
        if keys[0] in RENAMED:
            raise ValueError(f"policy {preset!r}: {keys[0]!r} is now {RENAMED[keys[0]]!r} "
                             f"(write e.g. {preset}:-packing or {preset}:slices.order=las)")
        if len(keys) == 1 and keys[0] in SWITCHED:
            keys.append("enabled")
        if keys[0] not in Config.model_fields or len(keys) > 2:
            sections = [s for s in Config.model_fields if s not in ("quantum", "plugins")]
            raise ValueError(f"policy {preset!r} has no setting {path!r}; it has: quantum, "
                             "plugins, " + ", ".join(f"{s}.*" for s in sections))
        node = values
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    try:
        return Config.model_validate(values)
    except ValidationError as e:
        raise ValueError(f"policy {preset!r}: {validation_problems(e)}") from None


def settings(config: Config) -> dict[str, Any]:
    """Every setting of ``config`` that has an effect, by dotted path."""
    out: dict[str, Any] = {}
    for name, value in config:
        if not isinstance(value, Section):
            out[name] = value
            continue
        idle = value.idle()
        out.update({f"{name}.{k}": v for k, v in value if k not in idle})
    return out


def _copy(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in values.items()}
