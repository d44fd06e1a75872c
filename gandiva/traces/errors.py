"""The one error a trace loader raises for bad input, pointing at the exact cell."""

from __future__ import annotations

from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read as given.

    ``line`` is the 1-based line of the file (the header is line 1) or, for JSON, the 1-based
    job index; ``field`` is the column name. Either is None when the error is about the whole
    file.
    """

    def __init__(self, file: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.file = str(file)
        self.line = line
        self.field = field
        self.reason = message
        where = Path(self.file).name
        if line is not None:
            where += f" line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")


class FieldError(Exception):
    """A bad value in one field; the row loop adds file and line and re-raises a TraceError."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
