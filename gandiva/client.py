"""A client of the REST API, and where it finds the server and the token.

The server URL and the token come from, first to last: the command's flags, the environment
(``GANDIVA_URL``, ``GANDIVA_TOKEN``), the config file (``GANDIVA_CONFIG``, default
``~/.config/gandiva/client.yaml``, written by ``gandiva login``), and for the URL the default
``http://127.0.0.1:8080``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import yaml

DEFAULT_URL = "http://127.0.0.1:8080"


class ClientError(RuntimeError):
    """What went wrong, in words a user can act on."""


def config_path() -> Path:
    return Path(os.environ.get("GANDIVA_CONFIG", "~/.config/gandiva/client.yaml")).expanduser()


@dataclass(frozen=True)
class Settings:
    url: str
    token: str | None

    @classmethod
    def resolve(cls, url: str | None = None, token: str | None = None) -> Settings:
        path = config_path()
        saved: dict[str, Any] = {}
        if path.exists():
            try:
                saved = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as e:
                raise ClientError(f"{path}: not YAML ({e}); fix it or run `gandiva login` "
                                  "again") from None
            if not isinstance(saved, dict):
                raise ClientError(f"{path}: expected 'url:' and 'token:' lines")
        return cls(url=(url or os.environ.get("GANDIVA_URL") or saved.get("url")
                        or DEFAULT_URL).rstrip("/"),
                   token=token or os.environ.get("GANDIVA_TOKEN") or saved.get("token"))

    def save(self) -> Path:
        """Write the config file, readable by its owner only (it holds a token)."""
        path = config_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # (an existing file keeps its mode through open)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump({"url": self.url, "token": self.token}, f)
        return path


# C0 and C1 control characters but newline and tab: what a job's output or a name could use
# to rewrite the terminal of whoever reads it (clear it, retitle it, hide a line)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(value: Any) -> Any:
    """``value`` (text, or JSON: lists, dicts) with no control character in any string."""
    if isinstance(value, str):
        return _CONTROL.sub("", value)
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    return value


def _problem(r: httpx2.Response) -> str:
    """The server's error in one or more lines: 'field: reason' for a 422."""
    try:
        detail = r.json().get("detail")
    except (json.JSONDecodeError, AttributeError):
        detail = r.text
    if isinstance(detail, list):
        lines = []
        for d in detail:
            loc = [str(p) for p in d.get("loc", []) if p not in ("body", "query", "path")]
            msg = str(d.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"{'.'.join(loc) or '(spec)'}: {msg}")
        return clean("\n".join(lines))
    return clean(str(detail))


class Client:
    def __init__(self, settings: Settings, timeout: float = 30.0) -> None:
        if not settings.token:
            raise ClientError("no token: give --token, set GANDIVA_TOKEN, or run `gandiva "
                              "login --token TOKEN` (an admin creates one with `gandiva user "
                              "add NAME`)")
        self.url = settings.url
        self.http = httpx2.Client(base_url=settings.url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {settings.token}"})

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx2.TransportError as e:
            raise ClientError(f"cannot reach the server at {self.url} ({e}); is `gandiva "
                              "server` running there? (--url or GANDIVA_URL)") from None
        self._check(r)  # (what the server relays, jobs' output included, is cleaned)
        return clean(r.json() if r.headers.get("content-type", "").startswith(
            "application/json") else r.text)

    def _check(self, r: httpx2.Response) -> None:
        if r.status_code == 401:
            raise ClientError(f"the server at {self.url} refused the token; check --token, "
                              "GANDIVA_TOKEN or `gandiva login`")
        if r.status_code == 422:
            raise ClientError("invalid request:\n" + "\n".join(
                f"  {line}" for line in _problem(r).splitlines()))
        if r.status_code >= 400:
            raise ClientError(_problem(r))

    def stream(self, path: str, **params: Any) -> Iterator[str]:
        """The text of a streamed response, piece by piece, until the server ends it."""
        try:
            with self.http.stream("GET", path, params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    self._check(r)
                yield from map(clean, r.iter_text())
        except httpx2.TransportError as e:
            raise ClientError(f"lost the server at {self.url} ({e})") from None

    # ---- the API ------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/jobs", json=spec)

    def jobs(self, state: str | None = None, labels: dict[str, str] | None = None,
             limit: int | None = None, user: str | None = None) -> list[dict[str, Any]]:
        """Newest first: every page (following the ``Link: rel="next"`` header) until
        ``limit`` jobs, if given; ``user``: only theirs (an admin's filter)."""
        params: list[tuple[str, str]] = [("state", state)] if state else []
        params += [("user", user)] if user else []
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        out: list[dict[str, Any]] = []
        path: str | None = "/v1/jobs"
        while path is not None and (limit is None or len(out) < limit):
            try:
                r = self.http.get(path, params=params)
            except httpx2.TransportError as e:
                raise ClientError(f"cannot reach the server at {self.url} ({e})") from None
            self._check(r)
            out += clean(r.json())
            path, params = r.links.get("next", {}).get("url"), []
        return out if limit is None else out[:limit]

    def users(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/users")

    def user_action(self, name: str, verb: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/users/{name}/{verb}")

    def set_user(self, name: str, **change: Any) -> dict[str, Any]:
        return self.request("PATCH", f"/v1/users/{name}", json=change)

    def usage(self, **params: str) -> dict[str, Any]:
        return self.request("GET", "/v1/usage", params=params)

    def teams(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/teams")

    def add_team(self, **spec: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/teams", json=spec)

    def set_team(self, name: str, **change: Any) -> dict[str, Any]:
        return self.request("PATCH", f"/v1/teams/{name}", json=change)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def act(self, job_id: str, verb: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/jobs/{job_id}/{verb}")

    def set_priority(self, job_id: str, priority: int) -> dict[str, Any]:
        return self.request("PATCH", f"/v1/jobs/{job_id}", json={"priority": priority})

    def explain(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}/explain")

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/jobs/{job_id}/events")

    def logs(self, job_id: str, tail: int, rank: int) -> str:
        return self.request("GET", f"/v1/jobs/{job_id}/logs",
                            params={"tail": tail, "rank": rank})

    def cluster(self) -> dict[str, Any]:
        return self.request("GET", "/v1/cluster")

    def whoami(self) -> dict[str, Any]:
        return self.request("GET", "/v1/whoami")

    def metrics(self, job_id: str, names: list[str] | None = None, after: int = -1
                ) -> dict[str, list[list[float]]]:
        """The job's curves after step ``after``: metric -> [[step, value, at], ...]."""
        params: dict[str, Any] = {"after": after}
        if names:
            params["names"] = ",".join(names)
        return self.request("GET", f"/v1/jobs/{job_id}/metrics", params=params)["series"]

    def submit_sweep(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/sweeps", json=spec)

    def sweeps(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/sweeps")

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/sweeps/{sweep_id}")
