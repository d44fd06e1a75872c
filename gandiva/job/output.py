"""A job's output on a disk that refuses it (full, over quota, past the file-size limit):
the bytes are dropped and counted, and the job trains on. Without this a ``print`` to a log
on a full volume raises ``OSError`` (ENOSPC) and ends the job, although its checkpoints are
safe and it could have finished. Once the disk takes writes again, the log says how many
bytes it lost.

Installed for every Python script the agent starts (``gandiva.job.warm.run``), the job
library or not, and inherited by its forked children. Not covered: a non-Python command,
an interpreter it spawns (multiprocessing's spawn), writes below Python (a C library's
``fprintf``, which ignores the error), and a loss the process never writes after (no
later write carries the note)."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class Tolerant(io.RawIOBase):
    """Writes to ``fd`` that the disk refuses are dropped and counted in ``dropped``."""

    def __init__(self, fd: int, name: str | int) -> None:
        super().__init__()
        self.fd = fd
        self.name = name
        self.dropped = 0  # bytes refused since the last write the disk took

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, b: ReadableBuffer) -> int:
        data = bytes(b)
        if self.dropped:  # the disk may take writes again: say what it lost first
            note = (f"\n[gandiva: {self.dropped} bytes of output lost: the disk refused "
                    "them]\n").encode()
            if self._write(note) < len(note):
                self.dropped += len(data)
                return len(data)
            self.dropped = 0
        self.dropped += len(data) - self._write(data)
        return len(data)

    def _write(self, data: bytes) -> int:
        """Write ``data``; how much of it the disk took before it refused the rest."""
        view, done = memoryview(data), 0
        while done < len(data):
            try:
                done += os.write(self.fd, view[done:])
            except OSError as err:
                if err.errno not in REFUSED:
                    raise
                break
        return done


def install() -> None:
    """Route ``sys.stdout`` and ``sys.stderr`` through ``Tolerant`` writers on the same
    file descriptors, buffered as they were: unbuffered under ``PYTHONUNBUFFERED`` (as the
    agent starts every job, so that a log shows each line as it is written, in order, and
    keeps the last lines of a process killed or ended by ``os._exit``)."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        buffer = getattr(old, "buffer", None)
        if old is None or isinstance(getattr(buffer, "raw", buffer), Tolerant):
            continue  # (none, or installed already)
        try:
            old.flush()
        except OSError:
            pass  # what it held is lost, as it would be
        raw = Tolerant(old.fileno(), getattr(old, "name", old.fileno()))
        layer: io.RawIOBase | io.BufferedWriter = (
            io.BufferedWriter(raw) if isinstance(buffer, io.BufferedWriter) else raw)
        setattr(sys, name, io.TextIOWrapper(
            layer, encoding=old.encoding, errors=old.errors,
            line_buffering=old.line_buffering,
            write_through=getattr(old, "write_through", False)))
