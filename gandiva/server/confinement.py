"""Where a user's job may run and what it may name: inside the user's base directory.

A job runs in a directory inside its user's base directory (no absolute path, no ``..``, no
symlink out), and command arguments that are paths (absolute, or with ``..``) must lie inside
it too. The command itself runs as the server's OS user: isolating hostile code needs
per-user OS accounts or containers, which this server does not provide.
"""

import shlex
from pathlib import Path

from fastapi import HTTPException

from gandiva.server.jobspec import JobRequest
from gandiva.server.store import Principal


def unprocessable(field: str, msg: str, where: str = "body") -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors: the field, and what to do."""
    return HTTPException(422, detail=[{"loc": [where, field], "msg": msg,
                                       "type": "value_error"}])


def resolved(path: Path) -> Path | None:
    """``path`` with its symlinks followed; None if it cannot be (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return None


class Confinement:
    """Each user's base directory, under the server's ``base_dir``."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir

    def user_dir(self, who: Principal) -> Path:
        return self.base_dir / "users" / who.name

    def workdir(self, who: Principal, req: JobRequest) -> Path:
        """The job's directory, checked to lie inside the user's base directory (a symlink
        out of it is refused too), and the command's path arguments with it."""
        base = self.user_dir(who).resolve()
        cwd = resolved(base / req.workdir)
        if cwd is None or not cwd.is_relative_to(base):
            raise unprocessable("workdir", f"{req.workdir!r} leads out of your base directory "
                                f"({base}); give a directory inside it")
        try:
            is_dir = cwd.is_dir()
        except OSError:  # e.g. a name longer than the filesystem allows
            is_dir = False
        if not is_dir:
            raise unprocessable("workdir", f"{req.workdir!r} does not exist in your base "
                                f"directory ({base}); create it first")
        for i, arg in enumerate(req.command):
            for value in (arg, arg.partition("=")[2]):  # --data=/elsewhere names a path too
                path = Path(value)
                if value and (path.is_absolute() or ".." in path.parts) and \
                        not (resolved(cwd / path) or Path("/")).is_relative_to(base):
                    raise unprocessable("command", f"argument {i} ({shlex.quote(arg)}) names a "
                                        f"path outside your base directory ({base}); put the "
                                        "file there and name it relative to the workdir")
        return cwd
