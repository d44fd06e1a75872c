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
from dataclasses import dataclass

DYNAMIC_UIDS = range(61184, 65520)
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


def problem(account: Account) -> str | None:
    """Why this node cannot run a job as ``account`` (None: it can): a mapped account that
    is missing or has another uid here, a dynamic uid that an account owns here, or an
    agent that is not root."""
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
    if account.uid != os.geteuid() and os.geteuid() != 0:
        return f"only a root agent can run a job as the {account}"
    return None


def drop(account: Account) -> None:
    """Become ``account`` for good (real, effective and saved ids; the supplementary groups
    replaced): root's capabilities go with uid 0. Then the process may be traced and read
    through /proc by its own user again (setuid cleared that), as any process of theirs."""
    if (os.getuid(), os.getgid()) == (account.uid, account.gid) and os.geteuid() != 0:
        return  # already (the agent's own account)
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
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def chown(path: os.PathLike[str] | str, account: Account | None, mode: int) -> None:
    """Give ``path`` (made by this process) to ``account``, with ``mode``."""
    if account is not None and os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    os.chmod(path, mode)

