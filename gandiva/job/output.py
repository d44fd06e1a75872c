"""A job's output on a disk that refuses it (full, over quota, past the file-size limit):
the bytes are dropped and counted, and the job trains on. Without this a ``print`` to a log
on a full volume raises ``OSError`` (ENOSPC) and ends the job, although its checkpoints are
safe and it could have finished. Once the disk takes writes again, the log says how many
bytes it lost.

Installed for every Python script the agent starts (``gandiva.job.warm.run``), the job
library or not. A non-Python command's writes are its own, as are writes below Python (a C
library's ``fprintf``, which ignores the error)."""

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

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.dropped = 0  # bytes refused since the last write the disk took

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, b: ReadableBuffer) -> int:
        data = bytes(b)
        if self.dropped and not self._write(f"\n[gandiva: {self.dropped} bytes of output "
                                            "lost: the disk refused them]\n".encode()):
            self.dropped += len(data)
            return len(data)
        self.dropped = 0
        if not self._write(data):
            self.dropped += len(data)
        return len(data)

    def _write(self, data: bytes) -> bool:
        """Write all of ``data``; False if the disk refused (part of it may be written)."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except OSError as err:
                if err.errno not in REFUSED:
                    raise
                return False
        return True


def install() -> None:
    """Route ``sys.stdout`` and ``sys.stderr`` through ``Tolerant`` writers on the same
    file descriptors, buffered as they were."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        if old is None or isinstance(getattr(getattr(old, "buffer", None), "raw", None),
                                     Tolerant):
            continue  # (none, or installed already)
        try:
            old.flush()
        except OSError:
            pass  # what it held is lost, as it would be
        new = io.TextIOWrapper(io.BufferedWriter(Tolerant(old.fileno())),
                               encoding=old.encoding, errors=old.errors,
                               line_buffering=old.line_buffering,
                               write_through=getattr(old, "write_through", False))
        setattr(sys, name, new)
