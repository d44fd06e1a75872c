"""The wire between a node's agent and a job's processes: every message, typed, in one place.

One JSON object a line over the Unix socket the agent hands the job (``GANDIVA_CONTROL_FD``).
The agent sends commands (``op``), obeyed at the job's next mini-batch boundary; the job sends
reports (``ev``). Both sides encode and decode through this module only, so a field is
spelled once.

A job is untrusted: ``report`` checks every field against its type (finite numbers, a mapping
of names to numbers, series of [step, value] points, at most ``SERIES_POINTS`` a metric) and
raises ``BadReport`` naming the message and the field; a reader takes at most ``LINE_BYTES``
a line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from pydantic import TypeAdapter


# ---- commands: agent -> job -----------------------------------------------------------------
@dataclass(frozen=True)
class Suspend:
    """Move the state to host memory and wait for what comes next (``Resume``, or a
    ``Checkpoint`` that ends the job)."""

    op: ClassVar[str] = "suspend"


@dataclass(frozen=True)
class Resume:
    """Go on, on ``device`` (e.g. ``cuda:1``, ``cpu``)."""

    device: str
    op: ClassVar[str] = "resume"


@dataclass(frozen=True)
class Checkpoint:
    """Save a checkpoint; with ``exit``, then stop (a move, a hold, a shutdown). ``periodic``:
    the job's own timer asked, not the agent (no ``Checkpointed`` report)."""

    exit: bool = False
    periodic: bool = False
    op: ClassVar[str] = "checkpoint"


@dataclass(frozen=True)
class Limit:
    """Keep the device memory this process's allocator holds within ``memory_gb`` (None: no
    cap): set while the job shares its GPU with another."""

    memory_gb: float | None
    op: ClassVar[str] = "limit"


@dataclass(frozen=True)
class Fork:
    """(To the zygote, ``gandiva.job.warm``.) Fork a warm process whose control channel is
    the socket sent with this message (SCM_RIGHTS)."""

    op: ClassVar[str] = "fork"


@dataclass(frozen=True)
class Become:
    """(To a warm process, ``gandiva.job.warm``.) Become this job: run ``argv`` with ``env``
    in ``cwd``, as ``uid`` (with ``gid`` and the supplementary ``groups``; None: as the
    zygote), writing to the log file sent with this message (SCM_RIGHTS: the agent opened
    it, the job never names a path the agent writes). What follows on the channel is the
    job's."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    uid: int | None = None
    gid: int | None = None
    groups: list[int] = field(default_factory=list)
    cgroup: str | None = None  # the run's cgroup, joined first (``gandiva.node.cgroups``)
    op: ClassVar[str] = "become"


Command = Suspend | Resume | Checkpoint | Limit | Fork | Become


# ---- reports: job -> agent ------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """(From a warm process.) Warmed up: it can become a job."""

    ev: ClassVar[str] = "ready"


@dataclass(frozen=True)
class Forked:
    """(From the zygote.) The warm process asked for is ``pid``."""

    pid: int
    ev: ClassVar[str] = "forked"


@dataclass(frozen=True)
class Exited:
    """(From the zygote.) Its child ``pid`` ended: ``code`` as ``Popen.returncode`` gives
    it (the exit status, or minus the signal that killed it)."""

    pid: int
    code: int
    ev: ClassVar[str] = "exited"


@dataclass(frozen=True)
class Hello:
    """The job speaks this protocol (it imported the job library)."""

    pid: int
    rank: int
    ev: ClassVar[str] = "hello"


@dataclass(frozen=True)
class Started:
    step: int
    restored: int | None  # the step of the checkpoint it restored from, if any
    in_place: bool = False  # it reads job.device at every step: it may move in place
    ev: ClassVar[str] = "started"


@dataclass(frozen=True)
class Profile:
    """What the last window of mini-batches measured, the job's latest metrics, and the
    values reported in the window: ``series`` maps a metric's name to its points, each
    ``[step, value]`` (the step: mini-batches done when it was measured), oldest first."""

    step: int
    mini_batch_time: float  # seconds per step of the job's loop
    memory_gb: float
    utilization: float | None  # None: unknown (no NVML, MIG, the first second on a GPU)
    samples_per_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[list[float]]] = field(default_factory=dict)
    # the timeout of the script's process group, if it has one: NCCL's watchdog aborts a
    # collective older than this, and its clock runs while the process is stopped by signal
    collective_timeout_s: float | None = None
    ev: ClassVar[str] = "profile"


@dataclass(frozen=True)
class Suspended:
    step: int
    seconds: float  # moving the state to host memory took
    held_gb: float | None = None  # device memory the process still holds (NVML), if known
    ev: ClassVar[str] = "suspended"


@dataclass(frozen=True)
class Resumed:
    step: int
    device: str
    seconds: float
    ev: ClassVar[str] = "resumed"


@dataclass(frozen=True)
class Checkpointed:
    step: int
    path: str | None
    ev: ClassVar[str] = "checkpointed"


@dataclass(frozen=True)
class Done:
    step: int
    ev: ClassVar[str] = "done"


@dataclass(frozen=True)
class CheckpointRefused:
    """A checkpoint the disk refused (``Job._refused``): the job trains on, from its newest
    checkpoint should it restart."""

    step: int
    reason: str
    ev: ClassVar[str] = "checkpoint-refused"


@dataclass(frozen=True)
class Alive:
    """The job is between boundaries but not stuck (an evaluation batch, a checkpoint
    written): the agent's hang watch (``agent.HANG_S``) starts again."""

    step: int
    ev: ClassVar[str] = "alive"


Report = (Ready | Forked | Exited | Hello | Started | Profile | Suspended | Resumed | Checkpointed
          | Done | CheckpointRefused | Alive)

COMMANDS: dict[str, type[Command]] = {
    c.op: c for c in (Suspend, Resume, Checkpoint, Limit, Fork, Become)}
REPORTS: dict[str, type[Report]] = {
    r.ev: r for r in (Ready, Forked, Exited, Hello, Started, Profile, Suspended, Resumed,
                      Checkpointed, Done, CheckpointRefused, Alive)}


def encode(message: Command | Report) -> bytes:
    tag = ("op", message.op) if isinstance(message, Command) else ("ev", message.ev)
    return (json.dumps({tag[0]: tag[1], **asdict(message)}) + "\n").encode()


_Message = TypeVar("_Message", bound="DataclassInstance")


LINE_BYTES = 1 << 20  # the longest line a reader takes: a report is a few hundred bytes
SERIES_POINTS = 10_000  # points of one metric in one report (a window's, at most a second)


class BadReport(ValueError):
    """A line from a job that is not a report of this protocol; says which and why."""


def _decode(line: bytes | str, key: str, kinds: Mapping[str, type[_Message]]) -> _Message:
    data = json.loads(line)
    kind = kinds.get(data.pop(key, None))
    if kind is None:
        raise ValueError(f"not a gandiva {key!r} message: {line!r}")
    known = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in data.items() if k in known})  # newer fields: ignored


def command(line: bytes | str) -> Command:
    """(From the agent, which the job trusts.)"""
    return _decode(line, "op", COMMANDS)


def report(line: bytes | str) -> Report:
    """A job's line as the report it is, every field checked (``BadReport`` if not)."""
    from pydantic import ValidationError

    shown = _shown(line)
    try:
        data = json.loads(line)
    except ValueError:
        raise BadReport(f"not JSON: {shown}") from None
    tag = data.get("ev") if isinstance(data, dict) else None
    kind = REPORTS.get(tag) if isinstance(tag, str) else None
    if kind is None:
        raise BadReport(f"not a gandiva 'ev' message: {shown}")
    try:  # (numbers as numbers: 2 for 2.0 and "2" for 2 are taken; NaN and inf are not;
        message = _checker(kind).validate_python(data)  # newer fields, and "ev", ignored)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        raise BadReport(f"{tag!r} report, field {where}: {err['msg']}: {shown}") from None
    if isinstance(message, Profile):
        for name, points in message.series.items():
            if len(points) > SERIES_POINTS:
                raise BadReport(f"'profile' report, field series.{name}: {len(points)} points, "
                                f"more than {SERIES_POINTS} in one report")
            if any(len(point) != 2 for point in points):
                raise BadReport(f"'profile' report, field series.{name}: a point is not "
                                f"[step, value]: {shown}")
    return message


_CHECKERS: dict[str, TypeAdapter[Report]] = {}


def _checker(kind: type[Report]) -> TypeAdapter[Report]:
    if kind.ev not in _CHECKERS:  # (made once: a checker is built from the type, ~1 ms)
        from pydantic import TypeAdapter

        _CHECKERS[kind.ev] = TypeAdapter(kind)
    return _CHECKERS[kind.ev]


def _shown(line: bytes | str, most: int = 200) -> str:
    text = repr(line[:most])
    return text + f" (and {len(line) - most} more)" if len(line) > most else text


for _kind in REPORTS.values():  # what pydantic reads of a plain dataclass
    _kind.__pydantic_config__ = {"allow_inf_nan": False}  # type: ignore[union-attr]
