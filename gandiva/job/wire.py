"""The wire between a node's agent and a job's processes: every message, typed, in one place.

One JSON object a line over the Unix socket the agent hands the job (``GANDIVA_CONTROL_FD``).
The agent sends commands (``op``), obeyed at the job's next mini-batch boundary; the job sends
reports (``ev``). Both sides encode and decode through this module only, so a field is
spelled once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


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
    in ``cwd``, writing to ``log``. What follows on the channel is the job's."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str
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
    utilization: float
    samples_per_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[list[float]]] = field(default_factory=dict)
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


def _decode(line: bytes | str, key: str, kinds: Mapping[str, type[_Message]]) -> _Message:
    data = json.loads(line)
    kind = kinds.get(data.pop(key, None))
    if kind is None:
        raise ValueError(f"not a gandiva {key!r} message: {line!r}")
    known = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in data.items() if k in known})  # newer fields: ignored


def command(line: bytes | str) -> Command:
    return _decode(line, "op", COMMANDS)


def report(line: bytes | str) -> Report:
    return _decode(line, "ev", REPORTS)
