"""Who a job's processes run as: an OS account (a user's own, mapped by name) or a dynamic
uid of the user's (no password-file entry, as systemd's DynamicUser or Kubernetes'
``runAsUser``). Only a root agent can run a job as anyone else; a job drops to its account
before any of its code runs and cannot come back (``drop``).

Dynamic uids come from systemd's range for them (61184-65519): no distribution gives those
to ordinary accounts, so one of them owns only what the jobs of its gandiva user made.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gandiva.node import environment

DYNAMIC_UIDS = range(61184, 65519)  # users', by id
SERVICE_UID = 65519  # the server's own where the machine has no --service-user account
PROBE_S = 30.0  # the interpreter's first start as an account (a cold disk cache)
PR_SET_DUMPABLE = 4


@dataclass(frozen=True)
class Account:
    """``name``: the OS account's (its uid must be ``uid`` on the node that runs the job);
    None: a dynamic uid, which no account may own there. Group ``gid`` and the
    supplementary ``groups`` are what the process gets: nothing else of its starter's."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    name: str | None = None
    home: str = "/"  # the job's HOME

    def __str__(self) -> str:
        return f"OS account {self.name!r}" if self.name else f"dynamic uid {self.uid}"

    @property
    def user(self) -> str:
        """What USER and LOGNAME say (``getpass.getuser`` reads them first: a dynamic uid
        has no password-file entry to fall back on)."""
        return self.name or f"gandiva-{self.uid}"


def named(name: str) -> Account:
    """The OS account ``name`` of this machine, with its groups; KeyError if it has none."""
    entry = pwd.getpwnam(name)
    groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    return Account(entry.pw_uid, entry.pw_gid, groups, name, entry.pw_dir)


def dynamic(uid: int, home: str) -> Account:
    return Account(uid, uid, home=home)


def problem(account: Account, root: bool | None = None) -> str | None:
    """Why this node cannot run a job as ``account`` (None: it can): a mapped account that
    is missing or has another uid here, a dynamic uid that an account owns here, or an
    agent that is not root (``root``: whether it is, if not this process)."""
    if account.name is not None:
        try:
            here = pwd.getpwnam(account.name).pw_uid
        except KeyError:
            return f"the {account} does not exist on this node"
        if here != account.uid:
            return f"the {account} has uid {here} on this node, not {account.uid}"
    else:
        try:
            owner = pwd.getpwuid(account.uid).pw_name
        except KeyError:
            owner = None
        if owner is not None:
            return (f"dynamic uid {account.uid} belongs to the OS account {owner!r} on this "
                    "node: map the user to an OS account (gandiva user add --os-user)")
    if root is None:
        root = os.geteuid() == 0
    if account.uid != os.geteuid() and not root:
        return f"only a root agent can run a job as the {account}"
    return None


def drop(account: Account, dumpable: bool = True) -> None:
    """Become ``account`` for good (real, effective and saved ids; the supplementary groups
    replaced): root's capabilities go with uid 0, and the account's processes on this node
    are bounded (``limit_processes``). Then, ``dumpable``, the process may be traced and
    read through /proc by its own user again (setuid cleared that), as any process of
    theirs; else by root alone (a server's, which holds secrets)."""
    if (os.getuid(), os.getgid()) == (account.uid, account.gid) and os.geteuid() != 0:
        return  # already (the agent's own account)
    limit_processes()
    os.setgroups(list(account.groups))
    os.setresgid(account.gid, account.gid, account.gid)
    os.setresuid(account.uid, account.uid, account.uid)
    if account.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise RuntimeError("dropped privileges came back")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)


def processes_allowed() -> int:
    """How many processes and threads one account may have at once on this node (all its
    jobs together): a quarter of what the kernel holds, so that no user's jobs fill the
    process table (a fork bomb meets EAGAIN; the agent, the server and others go on)."""
    try:
        held = min(int(Path(f"/proc/sys/kernel/{name}").read_text())
                   for name in ("pid_max", "threads-max"))
    except (OSError, ValueError):
        return MIN_PROCESSES
    return max(MIN_PROCESSES, held // 4)


MIN_PROCESSES = 1024


def limit_processes() -> None:
    """Bound this process and what it starts to ``processes_allowed`` processes of its real
    uid (RLIMIT_NPROC, soft and hard: no way back up without root)."""
    allowed = processes_allowed()
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard == resource.RLIM_INFINITY or hard > allowed:
        resource.setrlimit(resource.RLIMIT_NPROC, (allowed, allowed))


# a cold start as another account goes through this, which bounds its processes as ``drop``
# does a warm one's, then becomes the job's program (nothing of the job's runs before):
# ``python -I -S -c LIMITED N PROGRAM ARGS`` (``cold_command``)
LIMITED = ("import os, resource, sys\n"
           "n, hard = int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NPROC)[1]\n"
           "n = n if hard == resource.RLIM_INFINITY else min(n, hard)\n"
           "resource.setrlimit(resource.RLIMIT_NPROC, (n, n))\n"
           "try:\n"
           "    os.execvp(sys.argv[2], sys.argv[2:])\n"
           "except OSError as e:\n"
           "    sys.exit(f'cannot start {sys.argv[2]!r}: {e}')\n")


def cold_command(command: list[str], python: str) -> list[str]:
    """``command`` started as another account: its processes bounded first (``LIMITED``)."""
    return [python, "-I", "-S", "-c", LIMITED, str(processes_allowed()), *command]


def chown(path: os.PathLike[str] | str, account: Account | None, mode: int) -> None:
    """Give ``path`` (made by this process) to ``account``, with ``mode``."""
    if account is not None and os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    os.chmod(path, mode)



def settle(base: Path, account: Account) -> None:
    """``base`` (a user's base directory) made the account's own, 0700; its parent and the
    server's home passable by others (0711), never listable."""
    base.mkdir(parents=True, exist_ok=True)
    os.chown(base, account.uid, account.gid, follow_symlinks=False)
    os.chmod(base, 0o700)
    for parent in (base.parent, base.parent.parent):  # users/, and the server's home
        os.chmod(parent, os.stat(parent).st_mode & 0o7777 | 0o711)


def can_run(account: Account, base: Path, python: str = sys.executable) -> str | None:
    """Why ``account`` cannot start ``python`` in ``base`` and import the job library (a
    virtual environment, or the server's directory, under a home only its owner may enter),
    else None: asked by starting it."""
    try:
        probe = subprocess.run(
            [python, "-c", "import gandiva.job.wire"], cwd=base, env=environment.for_jobs(),
            capture_output=True, text=True, timeout=PROBE_S, user=account.uid,
            group=account.gid, extra_groups=list(account.groups))
    except (OSError, subprocess.TimeoutExpired) as e:
        said = str(e)
    else:
        if probe.returncode == 0:
            return None
        said = (probe.stderr.strip().splitlines() or [""])[-1]
    return (f"the {account} cannot run {python} with the job library in {base} ({said}): "
            "install gandiva, and keep the server's directory, where every account may pass "
            "(e.g. /opt/gandiva and /var/lib/gandiva)")


def service(name: str) -> Account:
    """The server's own account once it leaves root: the OS account ``name`` if this machine
    has it, else ``SERVICE_UID`` (no password-file entry, as a user's dynamic uid)."""
    try:
        return named(name)
    except KeyError:
        return Account(SERVICE_UID, SERVICE_UID, name=None, home="/")
