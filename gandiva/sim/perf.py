"""The simulator's performance model: measured tables, loaded and validated, never written as code.

It answers "how fast does job J run here?" for the simulator (the ground truth a policy never
sees). The numbers live in package data: ``gandiva/data/models.json`` (every number with its
source, or ``"estimate"`` and a reason) and ``gandiva/data/gavel_throughputs.json`` (Gavel's
throughput table, unchanged). ``gandiva/data/PROVENANCE.md`` says where each comes from.

Everything is indexed at load time; the per-call methods are a few dict lookups, because a
simulation calls them hundreds of thousands of times.
"""

from __future__ import annotations

import ast
import bisect
import difflib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

MIN_INTERFERENCE = 0.05
"""Share of its solo throughput a job always loses on a shared GPU (context switches, cache and
memory-bandwidth contention), so a modelled pair is never free. Used where no pair is measured."""

FAMILIES = frozenset({"cv", "nlp", "speech", "rec", "rl", "gan"})

KINDS = frozenset({"given", "derived"})
"""What a sourced number is: read off its source as is, or computed from the source's numbers
by the rule its note states (a ratio, a unit change, an inverse of our packing rule). Estimates
carry ``"source": "estimate"`` and a reason instead."""

_GAVEL_JOB = re.compile(r"^(?P<base>.+?) \(batch size (?P<batch>\d+)\)$")


class UnknownModelError(KeyError):
    """A model name that is neither a model, an alias nor a Gavel job type."""

    def __init__(self, model: str, close_matches: list[str]) -> None:
        super().__init__(model)
        self.model = model
        self.close_matches = close_matches

    def __str__(self) -> str:
        hint = f"; close matches: {', '.join(self.close_matches)}" if self.close_matches else ""
        return f"unknown model {self.model!r}{hint}"


class UnknownGpuTypeError(KeyError):
    """A GPU type the performance model has no speed for."""

    def __init__(self, gpu_type: str, known: Iterable[str]) -> None:
        super().__init__(gpu_type)
        self.gpu_type = gpu_type
        self.known = sorted(known)

    def __str__(self) -> str:
        return f"unknown GPU type {self.gpu_type!r}; known: {', '.join(self.known)}"


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What the simulator needs to know about one model, besides its speed."""

    name: str
    family: str
    memory_gb: float
    utilization: float
    checkpoint_mb: float


@dataclass(frozen=True, slots=True)
class _Locality:
    cross_socket: float
    servers: tuple[int, ...]
    fractions: tuple[float, ...]
    by_count: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        # A server count not in the table takes the nearest larger one, else the largest.
        table = [self.fractions[min(bisect.bisect_left(self.servers, n), len(self.servers) - 1)]
                 for n in range(self.servers[-1] + 1)]
        object.__setattr__(self, "by_count", tuple(table))

    def at(self, num_servers: int, cross_socket: bool) -> float:
        if num_servers <= 1:
            return self.cross_socket if cross_socket else 1.0
        by_count = self.by_count
        return by_count[num_servers] if num_servers < len(by_count) else by_count[-1]


@dataclass(frozen=True, slots=True)
class _Scaling:
    """Throughput of n GPUs of one server relative to one GPU, from measured points.

    Between points the parallel efficiency (speedup / n) is interpolated linearly in n; past
    the widest point it holds. A job wider than a server loses the network hop on top of this
    (its locality table), so these points are one-server measurements where the source has them.
    """

    widths: tuple[int, ...]  # 1 first
    efficiency: tuple[float, ...]

    def speedup(self, n: int) -> float:
        widths, eff = self.widths, self.efficiency
        if n >= widths[-1]:
            return n * eff[-1]
        i = bisect.bisect_right(widths, n)
        n0, n1 = widths[i - 1], widths[i]
        return n * (eff[i - 1] + (eff[i] - eff[i - 1]) * (n - n0) / (n1 - n0))

    @classmethod
    def of(cls, speedups: Mapping[int, float]) -> _Scaling:
        widths = (1, *sorted(n for n in speedups if n > 1))
        return cls(widths, (1.0, *(speedups[n] / n for n in widths[1:])))


def _norm(name: str) -> str:
    """Case-, space- and punctuation-insensitive form of a model name."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _interpolate(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through the points, extended linearly past either end."""
    i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class _Reader:
    """Reads sourced numbers ``{"value", "source", "note" | "reason"}`` and checks them."""

    def __init__(self, sources: Any) -> None:
        if not isinstance(sources, dict) or not sources:
            raise ValueError("sources: must be a non-empty object of id -> citation")
        self.sources = sources

    def num(self, entry: Any, where: str, high: float = float("inf"),
            allow_zero: bool = False) -> float:
        """The value of a sourced number, which must lie in (0, high] ([0, high] if allowed)."""
        if not isinstance(entry, dict) or "value" not in entry:
            raise ValueError(f"{where}: expected {{'value': ..., 'source': ...}}, got {entry!r}")
        value, source = entry["value"], entry.get("source")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: value must be a number, got {value!r}")
        if source == "estimate":
            if not entry.get("reason"):
                raise ValueError(f"{where}: an estimate needs a 'reason'")
        elif source not in self.sources:
            raise ValueError(f"{where}: unknown source {source!r}")
        elif entry.get("kind") not in KINDS:
            raise ValueError(f"{where}: 'kind' must be one of {sorted(KINDS)} (given: read off "
                             "the source as is; derived: computed from its numbers by the rule "
                             "in 'note')")
        elif entry["kind"] == "derived" and not entry.get("note"):
            raise ValueError(f"{where}: a derived number needs its rule in 'note'")
        if not ((value > 0 or (allow_zero and value == 0)) and value <= high):
            opening = "[" if allow_zero else "("
            raise ValueError(f"{where}: {value!r} is outside {opening}0, {high}]")
        return float(value)

    def locality(self, entry: Any, where: str) -> tuple[float | None, dict[int, float] | None]:
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be an object")
        cross = entry.get("cross_socket")
        cross_socket = None if cross is None else self.num(cross, f"{where}.cross_socket", high=1)
        servers = entry.get("servers")
        if servers is None:
            return cross_socket, None
        if not isinstance(servers, dict) or not servers:
            raise ValueError(f"{where}.servers: must be a non-empty object")
        table: dict[int, float] = {}
        for key, value in servers.items():
            if not str(key).isdigit() or int(key) < 2:
                raise ValueError(f"{where}.servers: key {key!r} must be a server count >= 2")
            table[int(key)] = self.num(value, f"{where}.servers.{key}", high=1)
        return cross_socket, table


def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ValueError(f"{where}: missing field {key!r}")
    return obj[key]


@dataclass(slots=True)
class _Tables:
    """Everything the loader builds; PerfModel only indexes into it."""

    gpu_memory: dict[str, float]
    gpu_speed: dict[str, float]
    profiles: dict[str, ModelProfile]
    measured_times: dict[str, dict[str, float]]
    localities: dict[str, _Locality]
    scaling: dict[tuple[str, str], _Scaling]  # (model, GPU type); "*" = any type
    aliases: dict[str, str]
    gains: dict[str, float]
    pairs: dict[tuple[str, str, str], tuple[float, float]]
    packing_tables: dict[str, str]
    migration_intra: tuple[tuple[float, ...], tuple[float, ...]]
    migration_across: tuple[tuple[float, ...], tuple[float, ...]]
    suspend_fixed_s: float
    suspend_per_mb_s: float


class PerfModel:
    """Mini-batch times, locality, packing and suspend/migration costs of the models we know."""

    def __init__(self, tables: _Tables) -> None:
        self.gpu_types: dict[str, float] = dict(tables.gpu_memory)
        """GPU type -> memory in GB."""
        self.gpu_speeds: dict[str, float] = dict(tables.gpu_speed)
        """GPU type -> speed relative to V100, used where a model lacks a measurement."""
        self.models: tuple[str, ...] = tuple(sorted(tables.profiles))
        """Canonical model keys."""
        self._profiles = tables.profiles
        self._localities = tables.localities
        self._gains = tables.gains
        self._pairs = tables.pairs
        self._packing_tables = tables.packing_tables
        self._migration = {False: tables.migration_intra, True: tables.migration_across}
        self._suspend = (tables.suspend_fixed_s, tables.suspend_per_mb_s)
        self._by_norm: dict[str, str] = {_norm(m): m for m in tables.profiles}
        self._by_norm.update({_norm(a): m for a, m in tables.aliases.items()})
        self._resolved: dict[str, str] = {m: m for m in tables.profiles}
        self._resolved.update(tables.aliases)
        self._gpu_names: dict[str, str] = {}
        for gpu in tables.gpu_memory:
            self._gpu_names.update({gpu: gpu, gpu.lower(): gpu, gpu.upper(): gpu})
        self._step = {
            (model, gpu): _step_time(times, gpu, tables.gpu_speed)
            for model, times in tables.measured_times.items()
            for gpu in tables.gpu_memory
        }
        self._packed: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._scaling = tables.scaling
        self._throughput: dict[tuple[str, str, int], float] = {}

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | None = None) -> PerfModel:
        """Load ``models.json`` (the bundled one by default) and the Gavel table it names."""
        folder: Traversable
        if path is None:
            folder = resources.files("gandiva").joinpath("data")
            text = folder.joinpath("models.json").read_text(encoding="utf-8")
        else:
            folder = Path(path).parent
            text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path or 'models.json'}: not valid JSON: {err}") from err
        gavel = None
        table = data.get("gavel_models", {}).get("table") if isinstance(data, dict) else None
        if table:
            gavel = json.loads(folder.joinpath(table).read_text(encoding="utf-8"))
        return cls.from_data(data, gavel)

    @classmethod
    def from_data(cls, data: Mapping[str, Any],
                  gavel: Mapping[str, Any] | None = None) -> PerfModel:
        """Build from parsed ``models.json`` and Gavel table; raises ValueError on bad data."""
        return cls(_build(data, gavel))

    # -- queries -----------------------------------------------------------------------------

    def resolve(self, model: str) -> str:
        """The canonical key of a model name, alias or Gavel job type (any case, spacing)."""
        try:
            return self._resolved[model]
        except KeyError:
            pass
        canonical = self._resolve_slow(model)
        self._resolved[model] = canonical
        return canonical

    def _resolve_slow(self, model: str) -> str:
        name = model.strip()
        if name.startswith("("):  # Gavel's "('ResNet-50 (batch size 64)', 1)" keys
            try:
                parsed = ast.literal_eval(name)
            except (ValueError, SyntaxError):
                parsed = None
            if isinstance(parsed, tuple) and parsed and isinstance(parsed[0], str):
                name = parsed[0]
        key = _norm(name)
        if key in self._by_norm:
            return self._by_norm[key]
        close = difflib.get_close_matches(key, list(self._by_norm), n=6, cutoff=0.6)
        names = list(dict.fromkeys(self._by_norm[c] for c in close))
        raise UnknownModelError(model, names)

    def _gpu(self, gpu_type: str) -> str:
        try:
            return self._gpu_names[gpu_type]
        except KeyError:
            pass
        for known in self.gpu_types:
            if known.lower() == gpu_type.strip().lower():
                self._gpu_names[gpu_type] = known
                return known
        raise UnknownGpuTypeError(gpu_type, self.gpu_types)

    def profile(self, model: str) -> ModelProfile:
        return self._profiles[self.resolve(model)]

    def step_time(self, model: str, gpu_type: str) -> float:
        """Seconds per mini-batch on one GPU of this type, with the GPU to itself."""
        return self._step[self.resolve(model), self._gpu(gpu_type)]

    def throughput(self, model: str, gpu_type: str, num_gpus: int = 1) -> float:
        """Mini-batches per second of ``num_gpus`` GPUs of this type in one server, together.

        A mini-batch is one GPU's: an 8-GPU data-parallel job doing one step does 8, as Gavel
        counts steps. ``throughput(m, g, 1) == 1 / step_time(m, g)``.
        """
        key = (model, gpu_type, num_gpus)
        try:
            return self._throughput[key]
        except KeyError:
            pass
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        name, gpu = self.resolve(model), self._gpu(gpu_type)
        scaling = self._scaling.get((name, gpu)) or self._scaling[name, "*"]
        value = scaling.speedup(num_gpus) / self._step[name, gpu]
        self._throughput[key] = value
        return value

    def locality(self, model: str, num_servers: int, cross_socket: bool) -> float:
        """Fraction of consolidated throughput kept when a job's GPUs span sockets or servers.

        Across servers the network hop dominates, so ``cross_socket`` only matters on one server.
        """
        return self._localities[self.resolve(model)].at(num_servers, cross_socket)

    def packed(self, model_a: str, model_b: str, gpu_type: str) -> tuple[float, float]:
        """Fraction of its solo throughput each job keeps when the two share one GPU.

        Memory is not checked here: the caller packs only pairs that fit (``profile().memory_gb``).
        """
        key = (model_a, model_b, gpu_type)
        try:
            return self._packed[key]
        except KeyError:
            pass
        result = self._pack(self.resolve(model_a), self.resolve(model_b), self._gpu(gpu_type))
        self._packed[key] = result
        return result

    def _pack(self, a: str, b: str, gpu: str) -> tuple[float, float]:
        table = self._packing_tables.get(gpu)
        if table is not None and (table, a, b) in self._pairs:
            return self._pairs[table, a, b]
        if a == b and a in self._gains:
            # Table 1's packed rate can exceed twice the time-sliced one (VAE 5.1x), so it is
            # not one pair's aggregate: each job keeps half the gain, capped below 1.
            share = min(self._gains[a] / 2, 1 - MIN_INTERFERENCE)
            return share, share
        load = self._profiles[a].utilization + self._profiles[b].utilization
        share = (1 - MIN_INTERFERENCE) * min(1.0, 1.0 / load)
        return share, share

    def migration_time(self, checkpoint_mb: float, across_servers: bool) -> float:
        """Seconds to checkpoint, move and restore one job (paper Fig 13, interpolated)."""
        if checkpoint_mb < 0:
            raise ValueError(f"checkpoint_mb must be >= 0, got {checkpoint_mb}")
        xs, ys = self._migration[bool(across_servers)]
        return max(0.0, _interpolate(xs, ys, checkpoint_mb))

    def suspend_resume_time(self, checkpoint_mb: float) -> float:
        """Seconds to suspend a job at a mini-batch boundary and resume it, together."""
        if checkpoint_mb < 0:
            raise ValueError(f"checkpoint_mb must be >= 0, got {checkpoint_mb}")
        fixed, per_mb = self._suspend
        return fixed + per_mb * checkpoint_mb


@functools.cache
def default_perf_model() -> PerfModel:
    """The bundled performance model, loaded once per process."""
    return PerfModel.load()


def _step_time(measured: dict[str, float], gpu: str, speed: dict[str, float]) -> float:
    """Measured time on this GPU type, else scaled from the measured type closest in speed."""
    if gpu in measured:
        return measured[gpu]
    ref = min(measured, key=lambda g: (abs(speed[g] - speed[gpu]), g))
    return measured[ref] * speed[ref] / speed[gpu]


# -- building the tables ---------------------------------------------------------------------


def _build(data: Mapping[str, Any], gavel: Mapping[str, Any] | None) -> _Tables:
    if not isinstance(data, dict):
        raise ValueError("models.json: top level must be an object")
    read = _Reader(data.get("sources"))
    gpu_memory, gpu_speed = _gpu_types(read, _field(data, "gpu_types", "models.json"))
    defaults = _defaults(read, data.get("defaults", {}))
    default_scaling = _speedups(read, _field(data.get("defaults", {}), "scaling", "defaults"),
                                "defaults.scaling")
    profiles: dict[str, ModelProfile] = {}
    times: dict[str, dict[str, float]] = {}
    localities: dict[str, _Locality] = {}
    scaling: dict[tuple[str, str], _Scaling] = {}
    for name, entry in _field(data, "models", "models.json").items():
        profiles[name], times[name], localities[name] = _model(read, name, entry, gpu_speed,
                                                               defaults)
        own = entry.get("scaling")
        speedups = (default_scaling if own is None
                    else _speedups(read, own, f"models.{name}.scaling"))
        scaling[name, "*"] = _Scaling.of(speedups)
    pairs: dict[tuple[str, str, str], tuple[float, float]] = {}
    packing_tables: dict[str, str] = {}
    if gavel is not None:
        spec = _field(data, "gavel_models", "models.json")
        packing_tables = dict(_field(spec, "packing_tables", "gavel_models"))
        for gpu in packing_tables:
            if gpu not in gpu_speed:
                raise ValueError(f"gavel_models.packing_tables: unknown GPU type {gpu!r}")
        _gavel(read, spec, gavel, gpu_speed, defaults, profiles, times, localities, pairs,
               scaling, default_scaling)
    aliases = _aliases(data.get("aliases", {}), profiles)
    gains = _gains(read, data.get("packing", {}), profiles)
    costs = _field(data, "costs", "models.json")
    suspend = _field(costs, "suspend_resume", "costs")
    return _Tables(
        gpu_memory=gpu_memory, gpu_speed=gpu_speed, profiles=profiles, measured_times=times,
        localities=localities, scaling=scaling, aliases=aliases, gains=gains, pairs=pairs,
        packing_tables=packing_tables,
        migration_intra=_points(read, costs, "migration_intra_server"),
        migration_across=_points(read, costs, "migration_across_servers"),
        suspend_fixed_s=read.num(_field(suspend, "fixed_s", "costs.suspend_resume"),
                                 "costs.suspend_resume.fixed_s", allow_zero=True),
        suspend_per_mb_s=read.num(_field(suspend, "per_mb_s", "costs.suspend_resume"),
                                  "costs.suspend_resume.per_mb_s", allow_zero=True),
    )


def _gpu_types(read: _Reader, entries: Any) -> tuple[dict[str, float], dict[str, float]]:
    if not isinstance(entries, dict) or not entries:
        raise ValueError("gpu_types: must be a non-empty object")
    memory, speed = {}, {}
    for gpu, entry in entries.items():
        where = f"gpu_types.{gpu}"
        memory[gpu] = read.num(_field(entry, "memory_gb", where), f"{where}.memory_gb")
        speed[gpu] = read.num(_field(entry, "relative_speed", where), f"{where}.relative_speed")
    return memory, speed


def _speedups(read: _Reader, entry: Any, where: str) -> dict[int, float]:
    """{GPU count >= 2: speedup over one GPU}. Measured speedups may exceed the count (Gavel's
    ResNet-18 rows, Pollux's BERT at 2 GPUs: a smaller per-GPU share of the input pipeline)."""
    if not isinstance(entry, dict) or not entry:
        raise ValueError(f"{where}: must be a non-empty object of GPU count -> speedup")
    out = {}
    for key, value in entry.items():
        if not str(key).isdigit() or int(key) < 2:
            raise ValueError(f"{where}: key {key!r} must be a GPU count >= 2")
        out[int(key)] = read.num(value, f"{where}.{key}")
    return out


def _defaults(read: _Reader, defaults: Any) -> dict[str, _Locality]:
    out = {}
    for family, entry in defaults.get("locality", {}).items():
        where = f"defaults.locality.{family}"
        cross, servers = read.locality(entry, where)
        if cross is None or servers is None:
            raise ValueError(f"{where}: needs both cross_socket and servers")
        out[family] = _Locality(cross, tuple(sorted(servers)),
                                tuple(servers[k] for k in sorted(servers)))
    return out


def _locality(cross: float | None, servers: dict[int, float] | None, family: str,
              defaults: dict[str, _Locality], where: str) -> _Locality:
    """A model's own numbers, with its family's default for whatever it lacks."""
    fallback = defaults.get(family)
    if fallback is None and (cross is None or servers is None):
        raise ValueError(f"{where}: no locality and no default for family {family!r}")
    if servers is None:
        assert fallback is not None
        keys, fractions = fallback.servers, fallback.fractions
    else:  # a model's server table replaces the default whole, never mixed key by key
        keys = tuple(sorted(servers))
        fractions = tuple(servers[k] for k in keys)
    if cross is None:
        assert fallback is not None
        cross = fallback.cross_socket
    return _Locality(cross, keys, fractions)


def _family(entry: Any, where: str) -> str:
    family = _field(entry, "family", where)
    if family not in FAMILIES:
        raise ValueError(f"{where}.family: {family!r} is not one of {sorted(FAMILIES)}")
    return str(family)


def _model(read: _Reader, name: str, entry: Any, gpu_speed: dict[str, float],
           defaults: dict[str, _Locality]) -> tuple[ModelProfile, dict[str, float], _Locality]:
    where = f"models.{name}"
    family = _family(entry, where)
    raw_times = _field(entry, "mini_batch_time", where)
    if not isinstance(raw_times, dict) or not raw_times:
        raise ValueError(f"{where}.mini_batch_time: needs at least one GPU type")
    times = {}
    for gpu, value in raw_times.items():
        if gpu not in gpu_speed:
            raise ValueError(f"{where}.mini_batch_time: unknown GPU type {gpu!r}")
        times[gpu] = read.num(value, f"{where}.mini_batch_time.{gpu}")
    profile = ModelProfile(
        name=name,
        family=family,
        memory_gb=read.num(_field(entry, "memory_gb", where), f"{where}.memory_gb"),
        utilization=read.num(_field(entry, "utilization", where), f"{where}.utilization", high=1),
        checkpoint_mb=read.num(_field(entry, "checkpoint_mb", where), f"{where}.checkpoint_mb"),
    )
    if "batch_size" in entry:  # informational: the batch the times were measured at
        read.num(entry["batch_size"], f"{where}.batch_size")
    cross, servers = read.locality(entry.get("locality", {}), f"{where}.locality")
    return profile, times, _locality(cross, servers, family, defaults, f"{where}.locality")


def _gavel(read: _Reader, spec: Any, table: Mapping[str, Any], gpu_speed: dict[str, float],
           defaults: dict[str, _Locality], profiles: dict[str, ModelProfile],
           times: dict[str, dict[str, float]], localities: dict[str, _Locality],
           pairs: dict[tuple[str, str, str], tuple[float, float]],
           scaling: dict[tuple[str, str], _Scaling],
           default_scaling: dict[int, float]) -> None:
    """Adds one model per Gavel job type, and the measured packed pairs, from Gavel's table."""
    worker_types: dict[str, str] = _field(spec, "worker_types", "gavel_models")
    reference = _field(spec, "reference_table", "gavel_models")
    packing_workers = set(_field(spec, "packing_tables", "gavel_models").values())
    for worker, gpu in worker_types.items():
        if gpu not in gpu_speed:
            raise ValueError(f"gavel_models.worker_types.{worker}: unknown GPU type {gpu!r}")
    isolated = {w: _isolated(_field(table, w, "gavel table"), w)
                for w in {*worker_types, reference, *packing_workers}}
    for job in isolated[reference].get(1, {}):
        if job in profiles:
            raise ValueError(f"gavel job type {job!r}: clashes with a model of the same name")
        times[job] = _gavel_times(job, worker_types, isolated)
        profiles[job], localities[job] = _gavel_profile(read, spec, job, table, isolated,
                                                        defaults)
        for worker, gpu in worker_types.items():
            scaling[job, gpu] = _Scaling.of(
                _gavel_speedups(job, isolated[worker], isolated[reference]) or default_scaling)
        scaling[job, "*"] = scaling[job, worker_types[reference]]
    for worker in packing_workers:
        _pairs_of(table[worker], worker, isolated[worker].get(1, {}), pairs)


def _gavel_times(job: str, worker_types: dict[str, str],
                 isolated: dict[str, dict[int, dict[str, float]]]) -> dict[str, float]:
    times = {}
    for worker, gpu in worker_types.items():
        steps = isolated[worker].get(1, {}).get(job, 0.0)
        if steps <= 0:
            raise ValueError(f"gavel job type {job!r}: mini_batch_time on {worker} needs "
                             "steps/s > 0")
        times[gpu] = 1.0 / steps
    return times


def _gavel_speedups(job: str, rows: dict[int, dict[str, float]],
                    reference: dict[int, dict[str, float]]) -> dict[int, float]:
    """Gavel's consolidated steps/s at each scale factor over its steps/s at 1, on this worker
    type; the reference type's ratio where this type has no row (K80 lacks two job types).
    Empty for the job types Gavel measured on one GPU only (A3C, CycleGAN, Recommendation)."""
    speedups = {}
    for n in sorted(set(rows) | set(reference)):
        if n <= 1:
            continue
        own, own_1 = rows.get(n, {}).get(job, 0.0), rows[1].get(job, 0.0)
        if own > 0 and own_1 > 0:
            speedups[n] = own / own_1
        elif reference.get(n, {}).get(job, 0.0) > 0:
            speedups[n] = reference[n][job] / reference[1][job]
    return speedups


def _gavel_profile(read: _Reader, spec: Any, job: str, table: Mapping[str, Any],
                   isolated: dict[str, dict[int, dict[str, float]]],
                   defaults: dict[str, _Locality]) -> tuple[ModelProfile, _Locality]:
    """Memory, checkpoint and family from the job's base model; the rest from Gavel's table."""
    match = _GAVEL_JOB.match(job)
    base_name, batch = (match["base"], int(match["batch"])) if match else (job, 0)
    base = _field(_field(spec, "bases", "gavel_models"), base_name, "gavel_models.bases")
    where = f"gavel_models.bases.{base_name}"
    family = _family(base, where)
    memory = _field(base, "memory_gb", where)
    memory_gb = read.num(_field(memory, "fixed", f"{where}.memory_gb"), f"{where}.memory_gb.fixed")
    if "per_sample" in memory:
        memory_gb += batch * read.num(memory["per_sample"], f"{where}.memory_gb.per_sample")
    reference = spec["reference_table"]
    fallback_u = read.num(_field(base, "utilization", where), f"{where}.utilization", high=1)
    profile = ModelProfile(
        name=job, family=family, memory_gb=memory_gb,
        utilization=_self_pair_utilization(table[reference], job, fallback_u),
        checkpoint_mb=read.num(_field(base, "checkpoint_mb", where), f"{where}.checkpoint_mb"),
    )
    cross = base.get("cross_socket")
    cross_socket = None if cross is None else read.num(cross, f"{where}.cross_socket", high=1)
    servers = _unconsolidated(table, reference, job, isolated[reference])
    locality = _locality(cross_socket, servers or None, family, defaults, f"gavel job {job!r}")
    return profile, locality


def _isolated(rows: Any, worker: str) -> dict[int, dict[str, float]]:
    """{scale factor: {job type: isolated steps/s}} of one Gavel worker type."""
    out: dict[int, dict[str, float]] = {}
    for key, row in rows.items():
        job, scale = _gavel_key(key, worker)
        value = _field(row, "null", f"gavel {worker} {key}")
        out.setdefault(scale, {})[job] = float(value)
    return out


def _gavel_key(key: str, worker: str) -> tuple[str, int]:
    try:
        job, scale = ast.literal_eval(key)
    except (ValueError, SyntaxError, TypeError) as err:
        raise ValueError(f"gavel {worker}: key {key!r} is not ('<job type>', scale)") from err
    return str(job), int(scale)


def _self_pair_utilization(rows: Any, job: str, fallback: float) -> float:
    """Utilisation whose fallback packing rule reproduces the measured same-job pair.

    Two copies keeping fraction f each means (1 - MIN_INTERFERENCE) / (2u) = f.
    """
    key = str((job, 1))
    pair = rows[key].get(key)
    solo = float(rows[key]["null"])
    if not pair or pair[0] <= 0 or solo <= 0:
        return fallback  # the pair did not fit in GPU memory (Gavel records 0.0)
    return min(1.0, (1 - MIN_INTERFERENCE) / (2 * min(1.0, float(pair[0]) / solo)))


def _unconsolidated(table: Mapping[str, Any], reference: str, job: str,
                    isolated: dict[int, dict[str, float]]) -> dict[int, float]:
    """{servers: unconsolidated / consolidated steps/s}, one GPU per server, capped at 1."""
    spread_rows = table.get(f"{reference}_unconsolidated", {})
    out = {}
    for scale, jobs in isolated.items():
        consolidated = jobs.get(job, 0.0)
        spread = spread_rows.get(str((job, scale)), {}).get("null", 0.0)
        if scale > 1 and consolidated > 0 and spread > 0:
            out[scale] = min(1.0, spread / consolidated)
    return out


def _pairs_of(rows: Any, worker: str, solo: dict[str, float],
              pairs: dict[tuple[str, str, str], tuple[float, float]]) -> None:
    """Measured fractions of solo throughput for every packed pair at scale factor 1."""
    for key, row in rows.items():
        job, scale = _gavel_key(key, worker)
        if scale != 1:
            continue
        for other_key, value in row.items():
            if other_key == "null":
                continue
            other, _ = _gavel_key(other_key, worker)
            mine, theirs = value
            if mine <= 0 or theirs <= 0 or solo.get(job, 0) <= 0 or solo.get(other, 0) <= 0:
                continue  # 0.0: the pair did not fit in memory; the caller checks memory
            pairs[worker, job, other] = (min(1.0, mine / solo[job]),
                                         min(1.0, theirs / solo[other]))


def _aliases(aliases: Any, profiles: dict[str, ModelProfile]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for name in profiles:
        if _norm(name) in seen:
            raise ValueError(f"models: {name!r} and {seen[_norm(name)]!r} differ only in case "
                             "or punctuation")
        seen[_norm(name)] = name
    for alias, target in aliases.items():
        if target not in profiles:
            raise ValueError(f"aliases.{alias}: points to unknown model {target!r}")
        if seen.get(_norm(alias), target) != target:
            raise ValueError(f"aliases.{alias}: clashes with {seen[_norm(alias)]!r}")
        seen[_norm(alias)] = target
    return dict(aliases)


def _gains(read: _Reader, packing: Any, profiles: dict[str, ModelProfile]) -> dict[str, float]:
    gains = {}
    for model, entry in packing.get("same_model_gain", {}).items():
        if model not in profiles:
            raise ValueError(f"packing.same_model_gain.{model}: unknown model")
        gains[model] = read.num(entry, f"packing.same_model_gain.{model}")
    return gains


def _points(read: _Reader, costs: Any, name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    points = _field(costs, name, "costs")
    if not isinstance(points, list) or len(points) < 2:
        raise ValueError(f"costs.{name}: needs at least two points")
    xs: list[float] = []
    ys: list[float] = []
    for i, point in enumerate(points):
        where = f"costs.{name}[{i}]"
        mb = _field(point, "checkpoint_mb", where)
        if not isinstance(mb, int | float) or mb <= 0 or (xs and mb <= xs[-1]):
            raise ValueError(f"{where}.checkpoint_mb: must be positive and increasing")
        xs.append(float(mb))
        ys.append(read.num(_field(point, "seconds", where), f"{where}.seconds"))
    return tuple(xs), tuple(ys)
