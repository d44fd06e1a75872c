"""Checkpoint files: atomic to write, verified to read.

A checkpoint is one file, ``ckpt-<step>.pt``: a header line with the SHA-256 of the payload,
then the payload (``torch.save`` of a dict). It is written to a temporary name, flushed and
fsynced, then renamed, and the directory fsynced, so a crash leaves either the old set of
checkpoints or the new one, never half a file under a checkpoint's name. On reading, a file
whose digest does not match (a torn copy, a bad disk) is renamed ``*.corrupt`` (kept for
inspection, never deleted) and the previous checkpoint is used.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from pathlib import Path
from typing import Any

MAGIC = b"GANDIVA-CKPT-1 "
KEEP = 2  # the newest two: if the newest turns out corrupt, the one before is still there
_NAME = re.compile(r"^ckpt-(\d{12})\.pt$")


def _path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:012d}.pt"


def steps(directory: Path) -> list[int]:
    """Steps of the checkpoints in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = [int(m[1]) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(directory: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` as the checkpoint of ``step``, atomically; prune older ones."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getbuffer()
    digest = hashlib.sha256(payload).hexdigest().encode()
    return _write(directory, step, MAGIC + digest + b"\n", payload)


def _write(directory: Path, step: int, *parts: Any, durable: bool = True) -> Path:
    """Write the file of ``step`` under a temporary name, fsync (if ``durable``), rename,
    fsync the directory; then prune all but the newest ``KEEP``."""
    final = _path(directory, step)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, final)
    if durable:
        _fsync_dir(directory)
    for old in steps(directory)[KEEP:]:
        _path(directory, old).unlink(missing_ok=True)
    return final


def read(path: Path) -> dict[str, Any]:
    """Load one checkpoint file; ``ValueError`` if it is not whole."""
    import torch

    data = path.read_bytes()
    head, sep, payload = data.partition(b"\n")
    if not sep or not head.startswith(MAGIC):
        raise ValueError(f"{path}: not a gandiva checkpoint (bad header)")
    if hashlib.sha256(payload).hexdigest().encode() != head[len(MAGIC):]:
        raise ValueError(f"{path}: checksum mismatch (torn or corrupted file)")
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)


def latest(directory: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that reads back whole; corrupt ones are set aside."""
    for step in steps(directory):
        path = _path(directory, step)
        try:
            return step, read(path)
        except (ValueError, OSError, RuntimeError, EOFError) as err:
            print(f"gandiva: skipping checkpoint {path.name}: {err}", file=sys.stderr)
            path.rename(path.with_name(path.name + ".corrupt"))
    return None


def _whole(data: bytes) -> bool:
    head, sep, payload = data.partition(b"\n")
    return (bool(sep) and head.startswith(MAGIC)
            and hashlib.sha256(payload).hexdigest().encode() == head[len(MAGIC):])


def newest_file(directory: Path) -> tuple[int, bytes] | None:
    """The newest checkpoint's step and bytes, checked whole (to move it to another node)."""
    for step in steps(directory):
        try:
            data = _path(directory, step).read_bytes()
        except OSError:
            continue
        if _whole(data):
            return step, data
    return None


def mapped(directory: Path) -> tuple[int, Any] | None:
    """The newest checkpoint's step and file, mapped into memory and not checked: to hand
    it on to a job that is about to restore it, which checks it then (see ``install``)."""
    import numpy as np

    for step in steps(directory):
        try:
            return step, np.memmap(_path(directory, step), dtype=np.uint8, mode="r")
        except (OSError, ValueError):
            continue
    return None


def install(directory: Path, step: int, data: Any, transit: bool = False) -> Path:
    """Put a checkpoint file that came from elsewhere in place, as atomically as ``save``;
    ``ValueError`` if it arrived torn.

    ``transit``: a copy made for a job to restore at once, while its source keeps the file
    (a migration). Decision: it is neither checked nor made durable here: the job checks
    it as it reads it (a torn copy is set aside, as any), and if this machine crashes, the
    job restores from the source's file instead. A 1 GB checkpoint saves about 0.6 s of
    hashing and 0.3 s of fsync, of a move's ~5 s (benchmarks/ray_migration.py)."""
    if not transit and not _whole(data):
        raise ValueError(f"checkpoint of step {step} arrived torn (checksum mismatch)")
    directory.mkdir(parents=True, exist_ok=True)
    return _write(directory, step, data, durable=not transit)
