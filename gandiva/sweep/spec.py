"""What a user submits to search: a sweep spec in YAML or JSON, validated before anything is
stored.

    name: cnn-lr                                  # trials are named cnn-lr-0, cnn-lr-1, ...
    command: python cnn.py --steps 600 --lr {lr} --width {width} --seed {trial}
    workdir: .                                    # as a job's (and env, gpus, model, ...)
    trials: 16                                    # default: one per grid point
    seed: 0                                       # the same seed draws the same trials
    space:
      lr: {log_uniform: [0.001, 0.5]}
      width: {choice: [8, 16, 32]}
      momentum: {uniform: [0.5, 0.99]}
      layers: {int: [1, 4]}                       # inclusive
      batch: {grid: [32, 64]}                     # every value, crossed with other grids
      optimizer: sgd                              # a fixed value
    metric: loss
    mode: min                                     # or max
    stop: {rule: asha, rungs: [50, 150, 450], reduction: 3}   # or median, or none;
                                                  # default: asha at 100, 300, 900, 2700

``{name}`` in the command or an environment value is the trial's value of that parameter;
``{trial}`` is its number. Decision: grid points are taken in order, trial ``i`` getting
point ``i`` modulo their number, and the random parameters are drawn for each trial from
one generator seeded with ``seed``, so a spec and a seed give the same trials every time.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gandiva.server.jobspec import JobRequest, SpecError, check_name, problems, storable

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
RANDOM = ("choice", "uniform", "log_uniform", "int")
MAX_TRIALS = 1000
Value = str | int | float | bool


# ASHA's geometric rungs, r * reduction^k, from r = 100 mini-batches: where a spec names none
DEFAULT_RUNGS = [100, 300, 900, 2700]


class Stop(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rule: Literal["asha", "median", "none"] = "asha"
    rungs: list[int] = Field(default_factory=list, max_length=10,
                             description="mini-batches, ascending")
    reduction: int = Field(default=3, ge=2, description="asha: keep the top 1/reduction")
    min_trials: int = Field(default=3, ge=1, description="median: others needed to compare")

    @model_validator(mode="after")
    def _rungs(self) -> Stop:
        if self.rule != "none" and not self.rungs:
            self.rungs = list(DEFAULT_RUNGS)
        if any(r < 1 for r in self.rungs) or self.rungs != sorted(set(self.rungs)):
            raise ValueError("rungs: give positive mini-batch counts in ascending order, "
                             "each once")
        return self


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    command: list[str] | str
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    gpus: int = Field(default=1, ge=1, le=1024)
    # promoted trials go up to +10; judged ones wait at -1 for the untried (server/sweeps.py)
    priority: int = Field(default=0, ge=-99, le=90)
    model: str = "unknown"
    time_limit: float | str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    trials: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    seed: int = 0
    space: dict[str, Any] = Field(min_length=1)
    metric: str = Field(min_length=1, max_length=64)
    mode: Literal["min", "max"] = "min"
    stop: Stop = Field(default_factory=Stop)  # ASHA at DEFAULT_RUNGS

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        return storable(data)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, most=56)  # trials are NAME-i, within a job name's 63

    @field_validator("space")
    @classmethod
    def _space(cls, space: dict[str, Any]) -> dict[str, Any]:
        for name, dist in space.items():
            where = name
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name == "trial":
                raise ValueError(f"{where}: a parameter's name is a Python identifier, not "
                                 "'trial' (that is the trial's number)")
            if isinstance(dist, Value):
                continue
            if not (isinstance(dist, dict) and len(dist) == 1):
                raise ValueError(f"{where}: give a value or one of {{grid: [...]}}, "
                                 "{choice: [...]}, {uniform: [lo, hi]}, {log_uniform: "
                                 "[lo, hi]}, {int: [lo, hi]}")
            (kind, arg), = dist.items()
            if kind in ("grid", "choice"):
                if not (isinstance(arg, list) and arg and all(isinstance(a, Value) for a in arg)):
                    raise ValueError(f"{where}.{kind}: give a list of values")
            elif kind in ("uniform", "log_uniform", "int"):
                ok = (isinstance(arg, list) and len(arg) == 2
                      and all(isinstance(a, int | float) and not isinstance(a, bool)
                              and math.isfinite(a) for a in arg) and arg[0] <= arg[1])
                if kind == "log_uniform" and ok:
                    ok = arg[0] > 0
                if kind == "int" and ok:
                    ok = all(float(a).is_integer() for a in arg)
                if not ok:
                    raise ValueError(f"{where}.{kind}: give [lo, hi] with lo <= hi"
                                     + (", lo > 0" if kind == "log_uniform" else "")
                                     + (", integers" if kind == "int" else ""))
            else:
                raise ValueError(f"{where}: {kind!r} is no distribution; use grid, choice, "
                                 "uniform, log_uniform or int")
        return space

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        grid = self.grid_size()
        randoms = [n for n, d in self.space.items() if isinstance(d, dict)
                   and next(iter(d)) in RANDOM]
        if self.trials is None and randoms:
            raise ValueError(f"trials: {', '.join(randoms)} are drawn at random; say how "
                             "many trials to draw")
        if self.trials is None and grid > MAX_TRIALS:
            raise ValueError(f"space: the grid has {grid} points; the limit is {MAX_TRIALS}")
        known = {*self.space, "trial"}
        texts = [("command", a) for a in self.command_list()] + \
            [(f"env.{k}", v) for k, v in self.env.items()]
        for where, text in texts:
            for name in _PLACEHOLDER.findall(text):
                if name not in known:
                    raise ValueError(f"{where}: {{{name}}} names no parameter of space "
                                     f"(they are {', '.join(sorted(known))})")
        self.trial_request(0, self.draw()[0], "sweep")  # a trial must be a valid job
        return self

    def command_list(self) -> list[str]:
        return self.command if isinstance(self.command, list) else \
            JobRequest.model_validate({"name": "x", "command": self.command}).command

    def grid_size(self) -> int:
        return math.prod(len(d["grid"]) for d in self.space.values()
                         if isinstance(d, dict) and "grid" in d)

    def count(self) -> int:
        return self.trials if self.trials is not None else self.grid_size()

    def draw(self) -> list[dict[str, Value]]:
        """Every trial's parameters, in trial order (the same for the same spec)."""
        rng = random.Random(self.seed)
        grids = {n: d["grid"] for n, d in self.space.items() if isinstance(d, dict)
                 and "grid" in d}
        out = []
        for i in range(self.count()):
            params: dict[str, Value] = grid_point(grids, i)
            for name, dist in self.space.items():
                if not isinstance(dist, dict):
                    params[name] = dist
                    continue
                (kind, arg), = dist.items()
                if kind == "choice":
                    params[name] = rng.choice(arg)
                elif kind == "uniform":
                    params[name] = rng.uniform(*arg)
                elif kind == "log_uniform":
                    params[name] = math.exp(rng.uniform(math.log(arg[0]), math.log(arg[1])))
                elif kind == "int":
                    params[name] = rng.randint(int(arg[0]), int(arg[1]))
            out.append({n: params[n] for n in self.space})
        return out

    def trial_request(self, i: int, params: dict[str, Value], sweep_id: str) -> JobRequest:
        """Trial ``i``'s job (labelled with the sweep's id and its number), or ValueError
        naming what makes it invalid."""
        values = {**{k: _text(v) for k, v in params.items()}, "trial": str(i)}

        def fill(text: str) -> str:
            return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)

        data = {"name": f"{self.name}-{i}", "command": [fill(a) for a in self.command_list()],
                "workdir": self.workdir, "env": {k: fill(v) for k, v in self.env.items()},
                "gpus": self.gpus, "priority": self.priority, "model": self.model,
                "time_limit": self.time_limit,
                "labels": {**self.labels, "sweep": sweep_id, "trial": str(i)}}
        try:
            return JobRequest.model_validate(data)
        except ValidationError as e:
            raise ValueError("a trial would not be a valid job: " + "; ".join(problems(e))) \
                from None


def _text(v: Value) -> str:
    """A parameter as the command gets it: floats to 6 significant digits (a learning rate
    of 0.0031622776601683794 is 0.00316228)."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def parse(text: str, source: str = "sweep spec") -> SweepSpec:
    """A ``SweepSpec`` from YAML or JSON text, or ``SpecError`` naming each bad field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(source, [f"not YAML or JSON: {e}"], "sweep spec") from None
    if not isinstance(data, dict):
        raise SpecError(source, ["(spec): expected a mapping of fields, e.g. 'name: x'"],
                        "sweep spec")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, problems(e), "sweep spec") from None


def grid_point(grids: dict[str, list[Value]], i: int) -> dict[str, Value]:
    """Point ``i`` (modulo their number) of the grids' product, in ``itertools.product``'s
    order (the last grid's values vary fastest), found by index: a grid of millions of points
    and one trial builds one point, not millions (a 423-byte sweep once held a server)."""
    point: dict[str, Value] = {}
    rest = i % math.prod(len(values) for values in grids.values())
    for name, values in reversed(grids.items()):
        rest, at = divmod(rest, len(values))
        point[name] = values[at]
    return dict(reversed(point.items()))
