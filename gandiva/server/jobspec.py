"""What a user submits: a job spec in YAML or JSON, validated before anything is stored.

    name: resnet-lr0.1
    command: python train.py --lr 0.1      # a string (split like a shell) or a list
    workdir: .                             # relative to the user's base directory
    env: {SEED: "3"}
    gpus: 2
    elastic: {min: 1, max: 4}              # optional: gandiva may grow and shrink it
    priority: 0
    model: resnet50                        # optional hint
    time_limit: 2h                         # seconds, or 90m / 2h / 1d

Decision: paths are relative to a base directory the server gives each user and may not
leave it (no absolute paths, no ``..``); checkpoints always live in the job's own directory,
so one user's job can neither read nor overwrite another's state.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gandiva.runtime import torchrun

# matched whole (fullmatch): a "$" would also match before a final newline
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _json_number(v: Any) -> Any:
    """JSON's true and "5" are not numbers (pydantic would read them as 1 and 5)."""
    if isinstance(v, bool | str):
        raise ValueError("give a number")
    return v


JsonInt = Annotated[int, BeforeValidator(_json_number)]  # 3 or 3.0; not true, not "3"
# variables the agent sets for the job; a spec may not override them
RESERVED_ENV = ("GANDIVA_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "NODE_RANK", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                "TORCHELASTIC_")


class Elastic(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min: JsonInt = Field(ge=1)
    max: JsonInt = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Elastic:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is more than max ({self.max})")
        return self


class JobRequest(BaseModel):
    """A job as a user submits it."""

    model_config = ConfigDict(extra="forbid")
    # the document states the forms a user may write, and the rules
    name: str = Field(json_schema_extra={"pattern": f"^{_NAME.pattern}$"})
    command: Annotated[list[str], WithJsonSchema({"anyOf": [
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        {"type": "string", "description": "split like a shell would"}]})] = Field(min_length=1)
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra={
        "propertyNames": {"pattern": f"^{_ENV_KEY.pattern}$"}})
    gpus: JsonInt = Field(default=1, ge=1, le=1024)
    elastic: Elastic | None = None
    priority: JsonInt = Field(default=0, ge=-100, le=100)
    model: str = "unknown"
    time_limit: Annotated[float | None, WithJsonSchema({"anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": _DURATION.pattern}, {"type": "null"}]})] = Field(
        default=None, gt=0, allow_inf_nan=False)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting with a "
                             "letter or digit")
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as e:
                raise ValueError(f"cannot split it like a shell would: {e}") from None
        if isinstance(v, list) and any(isinstance(a, str) and "\x00" in a for a in v):
            raise ValueError("an argument cannot hold NUL (a process's arguments end at it)")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        path = PurePosixPath(v)
        if path.is_absolute() or ".." in path.parts or "\x00" in v:
            raise ValueError("give a path inside your base directory: relative, without '..'")
        return str(path)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _ENV_KEY.fullmatch(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if "\x00" in value:
                raise ValueError(f"the value of {key!r} cannot hold NUL")
            if key.startswith(RESERVED_ENV):
                raise ValueError(f"{key!r} is set by gandiva for each job; leave it out")
        return v

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("give seconds, or a number with s, m, h or d (e.g. 90m)")
        if isinstance(v, str):
            m = _DURATION.match(v)
            if not m:
                raise ValueError("give seconds, or a number with s, m, h or d (e.g. 90m)")
            return float(m[1]) * _UNIT_S[m[2]]
        return v

    @model_validator(mode="after")
    def _torchrun_width(self) -> JobRequest:
        """gandiva launches the ranks (see ``runtime/torchrun.py``): torchrun's own width
        must be the spec's, or absent."""
        try:
            workers = torchrun.worker_count(self.command)
        except ValueError as e:
            raise ValueError(f"command: {e}") from None
        if workers is not None and workers != self.gpus:
            raise ValueError(
                f"command: torchrun asks for {workers} workers (--nnodes x --nproc-per-node) "
                f"but gpus is {self.gpus}; gandiva starts one process per GPU itself: set "
                f"gpus: {workers}, or leave --nproc-per-node out")
        return self

    @model_validator(mode="after")
    def _elastic_holds_gpus(self) -> JobRequest:
        if self.elastic and not self.elastic.min <= self.gpus <= self.elastic.max:
            raise ValueError(f"gpus ({self.gpus}) must lie within elastic min..max "
                             f"({self.elastic.min}..{self.elastic.max})")
        return self


class SpecError(ValueError):
    """A spec that does not validate: one line per problem, each naming its field."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{source}: invalid job spec:\n" + "\n".join(f"  {p}" for p in problems))


def problems(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(spec)"
        msg = e["msg"].removeprefix("Value error, ")
        out.append(f"{where}: {msg}")
    return out


def parse(text: str, source: str = "spec") -> JobRequest:
    """A ``JobRequest`` from YAML or JSON text (JSON is YAML), or ``SpecError``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(source, [f"not YAML or JSON: {e}"]) from None
    if not isinstance(data, dict):
        raise SpecError(source, ["(spec): expected a mapping of fields, e.g. 'name: x'"])
    try:
        return JobRequest.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, problems(e)) from None
