"""Checkpoint files: atomic to write, verified to read, and plain PyTorch files.

A checkpoint is ``ckpt-<step>.pt``, what ``torch.save`` wrote (so ``torch.load`` opens it
with nothing of ours), and beside it ``ckpt-<step>.pt.sha256``, the SHA-256 of the file.
Both are written under temporary names and fsynced, then the digest is renamed into place,
then the checkpoint, and the directory fsynced: a checkpoint that is listed always has its
digest, and a crash leaves the old set of checkpoints or the new one, never half a file
under a checkpoint's name. On reading, a file whose digest does not match (a torn copy, a
bad disk) is renamed ``*.corrupt`` (kept for inspection, never deleted) and the previous
checkpoint is used.

A checkpoint the disk refuses (full, a directory gone and not to be made again, a file size
limit) raises ``CheckpointError`` and leaves nothing behind: the checkpoints before it are
untouched, and the job that asked goes on (``Job.save``).

The payload is the script's business: the job library's ``Job.state()``, or a framework's
own checkpoint written through ``commit`` (Lightning's ``.ckpt``, which ``torch.load`` opens;
an uncompressed tar of the HF Trainer's checkpoint directory, which ``hf.unpack`` opens).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEEP = 2  # the newest two: if the newest turns out corrupt, the one before is still there
DIGEST = ".sha256"
_NAME = re.compile(r"^ckpt-(\d{12})\.pt$")
_CHUNK = 1 << 20


def path(directory: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives (whether or not it exists)."""
    return directory / f"ckpt-{step:012d}.pt"


def _digest_path(file: Path) -> Path:
    return file.with_name(file.name + DIGEST)


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


def sha256(data: Any) -> str:
    """The hex digest of bytes, a buffer, or a file (read in chunks)."""
    h = hashlib.sha256()
    if isinstance(data, Path):
        with open(data, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    else:
        h.update(data)
    return h.hexdigest()


class CheckpointError(OSError):
    """A checkpoint that could not be written; nothing of it is left, the older ones stand."""


def _refused(e: BaseException) -> bool:
    """Did the disk refuse a write: an OSError (ENOSPC, EFBIG, EIO...), or ``torch.save``'s
    stream writer saying so as a RuntimeError (a short write: "inline_container")?"""
    return isinstance(e, OSError) or (isinstance(e, RuntimeError)
                                      and "inline_container" in str(e))


def _failed(directory: Path, step: int, tmp: Path, e: BaseException) -> CheckpointError:
    """Remove what a failed checkpoint left (its file, its digest's temporary file) and say
    why it failed."""
    for f in (tmp, tmp.with_name(tmp.name + DIGEST)):
        try:
            f.unlink(missing_ok=True)
        except OSError:
            pass  # the directory itself is gone: nothing is left to remove
    return CheckpointError(f"checkpoint of step {step} not written to {directory}: {e}")


def _scratch_name(directory: Path, step: int) -> Path:
    return directory / f".ckpt-{step:012d}.pt.tmp"


def scratch(directory: Path, step: int, write: Callable[[Path], Any]) -> Path:
    """``write`` the checkpoint of ``step`` under a temporary name, the same on every rank (a
    framework that checkpoints on all ranks writes on one of them), hidden from ``steps``;
    that name. A write the disk refuses raises ``CheckpointError`` and leaves nothing."""
    tmp = _scratch_name(directory, step)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write(tmp)
    except (OSError, RuntimeError) as e:
        if not _refused(e):
            raise
        raise _failed(directory, step, tmp, e) from e
    return tmp


def save(directory: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` (``torch.save``) as the checkpoint of ``step``, atomically."""
    import torch

    return commit(directory, step, scratch(directory, step, lambda tmp: torch.save(state, tmp)))


def commit(directory: Path, step: int, written: Path) -> Path:
    """Make ``written`` (a whole file someone just wrote, e.g. a framework's own save) the
    checkpoint of ``step``: fsync it, put its digest beside it, rename it into place."""
    try:
        fd = os.open(written, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return _place(directory, step, written, sha256(written), durable=True)
    except OSError as e:
        final = path(directory, step)
        if final.exists() and _digest_path(final).exists():
            return final  # in place: only the directory's fsync or the pruning failed
        raise _failed(directory, step, written, e) from e


def _place(directory: Path, step: int, tmp: Path, digest: str, durable: bool,
           owner: Any = None) -> Path:
    """Digest first, then the file, then the directory; prune all but the newest ``KEEP``."""
    final = path(directory, step)
    dtmp = tmp.with_name(tmp.name + DIGEST)
    with _create(dtmp, owner) as f:
        f.write(f"{digest}  {final.name}\n".encode())  # sha256sum's format: `sha256sum -c`
        if durable:                                    # checks it
            f.flush()
            os.fsync(f.fileno())
    os.replace(dtmp, _digest_path(final))
    os.replace(tmp, final)
    if durable:
        _fsync_dir(directory)
    for old in steps(directory)[KEEP:]:
        path(directory, old).unlink(missing_ok=True)
        _digest_path(path(directory, old)).unlink(missing_ok=True)
    return final


def recorded_digest(file: Path, owner: int | None = None) -> str | None:
    """The digest recorded beside ``file``, if there is one (``owner``: see ``_open``)."""
    try:
        with _open(_digest_path(file), owner) as f:
            return f.read(1024).decode().split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return None


# ---- files a job can write, opened by a privileged process (a root node agent) ------------

def _open(file: Path, owner: int | None, max_bytes: int | None = None) -> Any:
    """``file`` opened to read, if it is a regular file (no link followed, no FIFO waited
    on) owned by uid ``owner`` (None: by anyone) of at most ``max_bytes``; else
    ``OSError``. A job's checkpoints directory is its own: a root agent that read a link
    there would hand the job what it points at."""
    fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (owner is not None and info.st_uid != owner):
        os.close(fd)
        raise PermissionError(f"{file}: not a regular file of uid {owner}")
    if max_bytes is not None and info.st_size > max_bytes:
        os.close(fd)
        raise PermissionError(f"{file}: {info.st_size} bytes, over {max_bytes}")
    return open(fd, "rb")


def _create(file: Path, owner: Any = None) -> Any:
    """``file`` made anew, to write (whatever was at the name, a link too, is gone first,
    and none is followed), and given to ``owner`` (an ``Account``: its uid and gid), where
    this process may."""
    file.unlink(missing_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    if owner is not None and os.geteuid() == 0:
        os.fchown(fd, owner.uid, owner.gid)
    return open(fd, "wb")


def verify(file: Path) -> None:
    """``ValueError`` unless ``file`` matches the digest beside it."""
    expected = recorded_digest(file)
    if expected is None:
        raise ValueError(f"{file}: no digest beside it (an unfinished checkpoint)")
    if sha256(file) != expected:
        raise ValueError(f"{file}: checksum mismatch (torn or corrupted file)")


def read(file: Path) -> dict[str, Any]:
    """Load one verified checkpoint file; ``ValueError`` if it is not whole.

    With ``weights_only``: a checkpoint is data (tensors, numbers, strings, containers),
    never code to run, whoever put the file there. What the library itself saves beyond
    that, numpy's random state, is allowed by name; a script whose registered objects save
    other types allows them (``torch.serialization.add_safe_globals``) and is told so."""
    import pickle

    import torch

    verify(file)
    allowed: list[Any] = []
    if "numpy" in sys.modules:  # (its random state is in the checkpoint only if it is)
        import numpy as np

        core = getattr(np, "_core", None) or np.core  # (numpy 2 renamed it)
        allowed = [np.ndarray, np.dtype, core.multiarray._reconstruct,
                   type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(file)
        raise ValueError(
            f"{file}: holds {', '.join(sorted(unsafe)) or 'objects'} besides tensors, numbers, "
            "strings and containers, which gandiva loads only where the script allows them by "
            "name: call torch.serialization.add_safe_globals([...]) with those types before "
            f"gj.init() ({str(err).splitlines()[-1][:200]})") from None


def newest_whole(directory: Path) -> tuple[int, Path] | None:
    """The newest checkpoint that verifies; corrupt ones are set aside on the way."""
    for step in steps(directory):
        file = path(directory, step)
        try:
            verify(file)
            return step, file
        except (ValueError, OSError) as err:
            print(f"gandiva: skipping checkpoint {file.name}: {err}", file=sys.stderr)
            _set_aside(file)
    return None


def _set_aside(file: Path) -> None:
    try:
        file.rename(file.with_name(file.name + ".corrupt"))
    except OSError:
        pass
    _digest_path(file).unlink(missing_ok=True)


def latest(directory: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that verifies, loaded with ``torch.load``. A file that verifies
    is whole: if ``torch.load`` cannot open it, it is another format (a framework's), and
    the error says so; it is never set aside."""
    found = newest_whole(directory)
    if found is None:
        return None
    step, file = found
    try:
        return step, read(file)
    except ValueError:
        raise
    except (OSError, RuntimeError, EOFError) as err:
        raise ValueError(f"{file}: whole (its digest matches) but not a torch.save file; "
                         f"a framework's checkpoint opens with its integration ({err})") from err


# ---- moving a checkpoint to another node: (step, file contents, digest) ----------------------

def newest_file(directory: Path, owner: int | None = None,
                max_bytes: int | None = None) -> tuple[int, bytes, str] | None:
    """The newest checkpoint's step, bytes and digest, checked whole; with ``owner``, only
    regular files of that uid, and with ``max_bytes`` only files that fit in it (it is read
    into memory; see ``_open``)."""
    for step in steps(directory):
        file = path(directory, step)
        try:
            with _open(file, owner, max_bytes) as f:
                data = f.read()
        except OSError:
            continue
        digest = recorded_digest(file, owner)
        if digest is not None and sha256(data) == digest:
            return step, data, digest
    return None


def mapped(directory: Path, owner: int | None = None) -> tuple[int, Any, str] | None:
    """The newest checkpoint's step, file mapped into memory, and recorded digest, not
    checked: to hand it on to a job that is about to restore it, which checks it then
    (``owner``: as in ``newest_file``)."""
    import numpy as np

    for step in steps(directory):
        file = path(directory, step)
        digest = recorded_digest(file, owner)
        if digest is None:
            continue
        try:
            with _open(file, owner) as f:
                return step, np.memmap(f, dtype=np.uint8, mode="r"), digest
        except (OSError, ValueError):
            continue
    return None


def install(directory: Path, step: int, data: Any, digest: str,
            transit: bool = False, owner: Any = None) -> Path:
    """Put a checkpoint that came from elsewhere in place, as atomically as ``save``;
    ``ValueError`` if it arrived torn.

    ``transit``: a copy made for a job to restore at once, while its source keeps the file
    (a migration). Decision: it is neither checked nor made durable here: the job checks
    it as it reads it (a torn copy is set aside, as any), and if this machine crashes, the
    job restores from the source's file instead. A 1 GB checkpoint saves about 0.6 s of
    hashing and 0.3 s of fsync, of a move's ~5 s (benchmarks/ray_migration.py).

    ``owner``: the ``Account`` of the job whose directory it is, whose files these become
    (a root agent writes them; nothing the job put at their names is followed)."""
    if not transit and sha256(data) != digest:
        raise ValueError(f"checkpoint of step {step} arrived torn (checksum mismatch)")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = _scratch_name(directory, step).with_suffix(f".{os.getpid()}.in")
    with _create(tmp, owner) as f:
        f.write(data)
        if not transit:
            f.flush()
            os.fsync(f.fileno())
    return _place(directory, step, tmp, digest, durable=not transit, owner=owner)
