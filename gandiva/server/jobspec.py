"""What a user submits: a job spec in YAML or JSON, validated before anything is stored.

    name: resnet-lr0.1
    command: python train.py --lr 0.1      # a string (split like a shell) or a list
    workdir: .                             # relative to the user's base directory
    env: {SEED: "3"}
    gpus: 2
    elastic: {min: 1, max: 4}              # optional: gandiva may grow and shrink it
    priority: 0
    model: resnet50                        # optional hint
    time_limit: 2h                         # seconds, 90m, 1h30m, 1d, or HH:MM:SS (Slurm)
    labels: {sweep: lr}                    # optional: select jobs by them (list, cancel)
    submission_id: 7f3c9a                  # optional: a retried submission makes no 2nd job

Decision: paths are relative to a base directory the server gives each user and may not
leave it (no absolute paths, no ``..``); checkpoints always live in the job's own directory,
so one user's job can neither read nor overwrite another's state.
"""

from __future__ import annotations

import math
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

from gandiva.node import torchrun

# matched whole (fullmatch): a "$" would also match before a final newline
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_PATTERN = f"^{_NAME.pattern}$"  # what check_name accepts, as a schema says it
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# 90, 90s, 90m, 1h30m, 2d12h, 1.5h: a number and unit, repeated (largest unit first)
_DURATION = re.compile(r"^\s*(?:\d+(?:\.\d+)?[smhd]?|(?:\d+(?:\.\d+)?[dhms])+)\s*$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
# Slurm's forms: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_CLOCK = re.compile(r"^\s*(?:(\d+)-(\d+)(?::(\d+))?(?::(\d+))?|(\d+):(\d+)(?::(\d+))?)\s*$")
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_HELP = "give seconds, 90m, 1h30m, 2d, or HH:MM:SS / D-HH:MM:SS as Slurm takes"

# Limits on what one spec may hold: a spec is stored, shown and turned into a process's
# argv and environment, so each is bounded (a 5 MB environment once passed). Each refusal
# names the limit.
MAX_ARGS = 1024  # command arguments
MAX_COMMAND_BYTES = 64 * 1024  # all of them together, UTF-8
MAX_ENV = 256  # environment variables
MAX_ENV_VALUE_BYTES = 16 * 1024  # one value
MAX_ENV_BYTES = 256 * 1024  # all names and values together
MAX_TEXT = 256  # characters of workdir, model, a label key or value, submission_id
MAX_LABELS = 32


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
    name: str = Field(json_schema_extra={"pattern": NAME_PATTERN})
    command: Annotated[list[str], WithJsonSchema({"anyOf": [
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        {"type": "string", "description": "split like a shell would"}]})] = Field(min_length=1)
    workdir: str = Field(default=".", max_length=MAX_TEXT)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV, json_schema_extra={
        "propertyNames": {"pattern": f"^{_ENV_KEY.pattern}$"}})
    gpus: JsonInt = Field(default=1, ge=1, le=1024)
    elastic: Elastic | None = None
    priority: JsonInt = Field(default=0, ge=-100, le=100)
    time_limit: Annotated[float | None, WithJsonSchema({"anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": _DURATION.pattern},
        {"type": "string", "pattern": _CLOCK.pattern}, {"type": "null"}]})] = Field(
        default=None, gt=0, allow_inf_nan=False)
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS,
                                   json_schema_extra={"propertyNames": {
                                       "pattern": f"^{_LABEL.pattern}$"}})
    submission_id: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$",
        description="Yours to choose: a second submission with the same id returns the "
                    "first job instead of making another (safe retries)")
    # sizes a validator checks, declared here for the document
    model: str = Field(default="unknown", max_length=MAX_TEXT)
    checkpoints: bool = Field(
        default=True, description="false: the job cannot checkpoint (a script without the "
        "gandiva library or a framework integration): it runs only within its team's quota, "
        "never on GPUs borrowed from another team's")

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return storable(data)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

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
        if isinstance(v, list) and len(v) > MAX_ARGS:
            raise ValueError(f"{len(v)} arguments; the limit is {MAX_ARGS}")
        if isinstance(v, list) and all(isinstance(a, str) for a in v):
            size = sum(len(a.encode("utf-8", "surrogatepass")) for a in v)
            if size > MAX_COMMAND_BYTES:
                raise ValueError(f"{size} bytes of arguments; the limit is "
                                 f"{MAX_COMMAND_BYTES}: pass big inputs in a file")
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
        total = 0
        for key, value in v.items():
            size = len(value.encode("utf-8", "surrogatepass"))
            total += size + len(key)
            if size > MAX_ENV_VALUE_BYTES:
                raise ValueError(f"the value of {key[:64]!r} has {size} bytes; the limit is "
                                 f"{MAX_ENV_VALUE_BYTES}: pass big inputs in a file")
            if not _ENV_KEY.fullmatch(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if "\x00" in value:
                raise ValueError(f"the value of {key!r} cannot hold NUL")
            if key.startswith(RESERVED_ENV):
                raise ValueError(f"{key!r} is set by gandiva for each job; leave it out")
        if total > MAX_ENV_BYTES:
            raise ValueError(f"{total} bytes of environment; the limit is {MAX_ENV_BYTES}")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _LABEL.fullmatch(key):
                raise ValueError(f"label {key[:64]!r}: use 1-63 letters, digits, '.', '_', "
                                 "'/' or '-', starting and ending with a letter or digit")
            if len(value) > 63 or not (value == "" or _LABEL.fullmatch(value)):
                raise ValueError(f"the value of label {key!r}: use up to 63 letters, "
                                 "digits, '.', '_', '/' or '-' (as Kubernetes label values)")
        return v

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(DURATION_HELP)
        if isinstance(v, str):
            return duration_s(v)
        return v

    @model_validator(mode="after")
    def _torchrun_width(self) -> JobRequest:
        """gandiva launches the ranks (see ``node/torchrun.py``): torchrun's own width
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


def storable(data: Any) -> Any:
    """A spec's fields as the database and an answer can hold them, or ValueError naming the
    field. JSON can carry a lone surrogate ("\\udc80"), which is no character, and (as
    Python reads it) NaN and Infinity, which JSON has no numbers for; nothing downstream
    (the database, a process's argv, an answer) can write either."""
    def bad(value: Any) -> str | None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "holds a lone surrogate, which is no character; send UTF-8 text"
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "holds NaN or an infinity, which JSON has no number for"
        if isinstance(value, dict):
            return next((b for k, v in value.items() if (b := bad(k) or bad(v))), None)
        if isinstance(value, list):
            return next((b for v in value if (b := bad(v))), None)
        return None

    if isinstance(data, dict):
        for key, value in data.items():
            problem = bad(key) or bad(value)
            if problem:
                field = str(key).encode("utf-8", "backslashreplace").decode()
                raise ValueError(f"{field}: {problem}")
    return data


def check_name(v: str, most: int = 63) -> str:
    """A job's (or a sweep's) name: what ids, labels and file names can carry."""
    if not (_NAME.fullmatch(v) and len(v) <= most):
        raise ValueError(f"use 1-{most} letters, digits, '.', '_' or '-', starting with a "
                         "letter or digit")
    return v


def duration_s(text: str) -> float:
    """Seconds in ``90``, ``90m``, ``1h30m``, ``1.5h``, ``2d``, or Slurm's ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; ValueError naming the forms."""
    if _DURATION.match(text):
        return sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(text))
    m = _CLOCK.match(text)
    if m is None:
        raise ValueError(DURATION_HELP)
    days, hours, minutes, seconds, mm, ss, hms_s = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        parts = (int(days), int(hours), int(minutes or 0), int(seconds or 0))
    elif hms_s is not None:  # HH:MM:SS
        parts = (0, int(mm), int(ss), int(hms_s))
    else:  # MM:SS
        parts = (0, 0, int(mm), int(ss))
    return float(parts[0] * 86400 + parts[1] * 3600 + parts[2] * 60 + parts[3])


class SpecError(ValueError):
    """A spec that does not validate: one line per problem, each naming its field."""

    def __init__(self, source: str, problems: list[str], what: str = "job spec") -> None:
        self.problems = problems
        super().__init__(f"{source}: invalid {what}:\n" + "\n".join(f"  {p}" for p in problems))


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
