"""Who each user's jobs run as, on a server that runs them on its own machine.

Two modes, chosen by who runs the server (``Tenancy.for_server``):
- **root**: every job runs as its user's account: the OS account the user is mapped to
  (``gandiva user add NAME --os-user ACCOUNT``), else the user's dynamic uid (stored with
  the user; see ``gandiva.node.accounts``). Never as root. A user's base directory is that
  account's (0700), under parents others may pass but not list (0711).
- **shared account**: the server is not root (or, on Ray, the node agents are not): every
  job runs as the server's own account (the agents'), so every user's job can
  reach every other user's files and the server's state. With more than one non-admin
  user that must be said explicitly: ``--shared-account``, or the server refuses to start.
"""

from __future__ import annotations

import os
import pwd
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gandiva.node import accounts
from gandiva.node.accounts import Account
from gandiva.server.confinement import unprocessable
from gandiva.server.store import Principal, Store

ROOT = "root"
SHARED = "shared account"


class Tenancy:
    """``mode``: ``ROOT`` or ``SHARED``; ``why``: what chose it, for the log and /readyz."""

    def __init__(self, mode: str, why: str, node: Any = None) -> None:
        self.mode, self.why = mode, why
        self.node = node or Here()  # settle and can_run, where root can
        self._runs: set[int] = set()  # the uids seen to run the interpreter
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, why: str = "jobs run as the server's account") -> Tenancy:
        return cls(SHARED, why)

    @classmethod
    def for_server(cls, store: Store, backend: str, shared_account: bool, root: bool,
                   node: Any = None) -> Tenancy:
        """The mode of a ``gandiva server`` started as root or not (``root``; it may have
        left uid 0 since, for its service account, leaving ``node`` root); ``SystemExit``'s
        message where a non-root server has several non-admin users and was not told
        ``--shared-account``."""
        me = _name(os.geteuid())
        if root and backend == "local":
            why = "started as root: every job runs as its user's account"
            if os.geteuid() != 0:
                why += f", the server as {me}, its node daemon as root"
            return cls(ROOT, why, node)
        if root and backend == "ray":
            if not node.token_auth:
                raise SystemExit(
                    "the Ray cluster's node agents run as root, and Ray's token "
                    "authentication is off: any process that reaches the cluster, a job's "
                    "too, could call them and run as anyone. Start Ray with "
                    "RAY_AUTH_MODE=token (and the token in ~/.ray/auth_token or "
                    "RAY_AUTH_TOKEN_PATH, for the server too)")
            return cls(ROOT, "the Ray cluster's node agents run as root (token "
                       "authentication on): every job runs as its user's account", node)
        if backend == "ray":
            why = (f"the Ray cluster's node agents run as {_name(node.infos[0]['uid'])}, not "
                   "root: every job runs as that account, and every user can reach every "
                   "other user's files")
        elif root:
            why = (f"the {backend} backend: every job runs as the account of the process that "
                   "starts it, and every user can reach every other user's files")
        else:
            why = (f"the server runs as {me}, not root: every job runs as {me}, and every "
                   "user can reach every other user's files and the server's state")
        others = [u.name for u in store.users() if not u.admin and u.revoked_at is None]
        if len(others) > 1 and not shared_account and backend in ("local", "ray"):
            raise SystemExit(
                f"{len(others)} non-admin users ({', '.join(others[:5])}) and {why}. Start "
                f"{'the Ray nodes' if backend == 'ray' else 'the server'} as root (each "
                "user's jobs then run as that user's account), or say that this is meant "
                "with --shared-account")
        return cls(SHARED, why)

    @property
    def detail(self) -> str:
        return f"{self.mode}: {self.why}"

    def account(self, who: Principal, base: Path, check: bool = True) -> Account | None:
        """Who ``who``'s jobs run as (None: as the server); with ``check``, a 422 naming what
        is wrong where this machine cannot run one (a mapped account missing, the
        interpreter out of the account's reach)."""
        if self.mode != ROOT:
            return None
        if who.os_user is not None:
            try:
                account = accounts.named(who.os_user)
            except KeyError:
                if not check:
                    return Account(-1, -1, name=who.os_user)  # refused on the node, named
                raise unprocessable("os_user", f"your OS account {who.os_user!r} does not exist "
                                    "on this machine: ask an admin to create it, or to map "
                                    "you to another (gandiva user add --os-user)") from None
            if account.uid == 0:
                raise unprocessable("os_user", f"your OS account {who.os_user!r} is root: "
                                    "gandiva runs no job as root; map the user to another")
        else:
            assert who.uid is not None, who
            account = accounts.dynamic(who.uid, str(base))
        if check:
            why = self._problem(who, account, base)
            if why:
                raise unprocessable("os_user", f"your jobs cannot run here: {why}")
            self.node.settle(who.name, base, account)
        return account

    def _problem(self, who: Principal, account: Account, base: Path) -> str | None:
        """Why this machine cannot run ``account``'s jobs in ``base``: the account, or the
        interpreter out of its reach (tried until it could once)."""
        if (why := accounts.problem(account, root=True)) is not None:
            return why
        with self._lock:
            if account.uid in self._runs:
                return None
        self.node.settle(who.name, base, account)  # (the directory is tried too)
        why = self.node.can_run(who.name, base, account)
        if why is None:
            with self._lock:
                self._runs.add(account.uid)
        return why

    def settle(self, store: Store, base_of: Callable[[Principal], Path]) -> None:
        """(At start, in root mode.) Every user's base directory made their account's, so
        that they can put their files there before their first job."""
        if self.mode != ROOT:
            return
        for who in store.principals():
            account = self.account(who, base_of(who), check=False)
            if account is not None and account.uid > 0:
                self.node.settle(who.name, base_of(who), account)



class Here:
    """A user's directory settled, and the interpreter tried, by this process (a root
    server that runs its agent itself); a root server's node daemon does both otherwise."""

    def settle(self, name: str, base: Path, account: Account) -> None:
        accounts.settle(base, account)

    def can_run(self, name: str, base: Path, account: Account) -> str | None:
        return accounts.can_run(account, base)


def _name(uid: int) -> str:
    try:
        return repr(pwd.getpwuid(uid).pw_name)
    except KeyError:
        return f"uid {uid}"
