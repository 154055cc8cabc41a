"""The REST client the `gangway` commands use (httpx), and where it finds the API and token.

The API address: GANGWAY_API_URL, else the line in `.gangway/env` (written by `make up`).
The token: GANGWAY_TOKEN, else the admin token in GANGWAY_ADMIN_TOKEN_FILE or
`.gangway/admin.token`. `.gangway/` is the nearest one in the working directory or above it, as
git finds `.git/`, so the commands work from anywhere inside a checkout.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_API_URL = "http://127.0.0.1:8080"
STATE_DIR = Path(".gangway")
# What an Authorization header can carry: visible ASCII, no spaces (every token the API issues).
_TOKEN = re.compile(r"[\x21-\x7e]+")


class ClientError(Exception):
    """Anything the user should read as one line: the API's problem or an unreachable API."""


class ApiError(ClientError):
    def __init__(self, status: int, detail: str, problem: Mapping[str, Any]) -> None:
        super().__init__(detail)
        self.status = status
        self.problem = dict(problem)


def find_state_dir(start: Path | None = None) -> Path:
    """The nearest `.gangway/` at or above `start` (the working directory); else `./.gangway`."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / STATE_DIR
        if candidate.is_dir():
            return candidate
    return STATE_DIR


def read_env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


@dataclass(frozen=True, slots=True)
class ClientConfig:
    api_url: str
    token: str | None
    # Where the token came from (`GANGWAY_TOKEN` or a token file), for a 401's hint.
    token_source: str | None = None

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, state_dir: Path | None = None
    ) -> ClientConfig:
        environ = os.environ if env is None else env
        state_dir = find_state_dir() if state_dir is None else state_dir
        file_env = read_env_file(state_dir / "env")
        url = environ.get("GANGWAY_API_URL") or file_env.get("GANGWAY_API_URL") or DEFAULT_API_URL
        if not url.lower().startswith(("http://", "https://")):
            # httpx would say only "UnsupportedProtocol", read as "cannot reach the API; is it
            # running?" while it is: the URL lacks its scheme (`127.0.0.1:8080`).
            raise ClientError(
                f"GANGWAY_API_URL {url!r} is not a URL: it starts with http:// or https:// "
                f"(as in {DEFAULT_API_URL})"
            )
        token = environ.get("GANGWAY_TOKEN") or None
        source = "GANGWAY_TOKEN"
        if token is None:
            token_file = Path(environ.get("GANGWAY_ADMIN_TOKEN_FILE") or state_dir / "admin.token")
            if token_file.is_file():
                token = token_file.read_text(errors="replace").strip() or None
                source = str(token_file)
        if token is not None and _TOKEN.fullmatch(token) is None:
            # Never echoed: even a mangled token may be most of a real one.
            raise ClientError(
                f"the token in {source} is not one: a token is visible ASCII without spaces "
                "(was it copied with its quotes, a line break or another character?)"
            )
        return cls(api_url=url.rstrip("/"), token=token, token_source=source if token else None)


class GangwayClient:
    def __init__(self, config: ClientConfig, *, timeout_s: float = 30.0) -> None:
        headers = {"Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self.config = config
        self._http = httpx.Client(base_url=config.api_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> GangwayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=dict(spec))

    def submit_batch(self, specs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Several jobs at once, all or none (a pipeline: later ones may name earlier ones)."""
        return self._call("POST", "/v1/jobs:batch", json={"jobs": [dict(s) for s in specs]})

    def update(self, job_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/jobs/{_segment(job_id)}", json=dict(changes))

    def jobs(
        self,
        *,
        team: str | None = None,
        state: str | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> dict[str, Any]:
        params = _params(team=team, state=state, limit=limit, after=after)
        return self._call("GET", "/v1/jobs", params=params)

    def ready(self) -> dict[str, Any]:
        """The API's /readyz: where its read models stand in the log."""
        return self._call("GET", "/readyz")

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{_segment(job_id)}")

    def job_events(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{_segment(job_id)}/events")

    def logs(
        self,
        job_id: str,
        *,
        rank: int | None = None,
        attempt: int | None = None,
        follow: bool = False,
        tail: int | None = None,
    ) -> Iterator[bytes]:
        """A rank's output as it arrives (with `follow`, until the attempt ends)."""
        params = _params(rank=rank, attempt=attempt, tail=tail, follow="true" if follow else None)
        path = f"/v1/jobs/{_segment(job_id)}/logs"
        try:
            with self._http.stream("GET", path, params=params, timeout=None) as response:
                if not response.is_success:
                    response.read()
                    raise _api_error(response, self.config)
                yield from response.iter_bytes()
        except httpx.TransportError as error:
            raise ClientError(f"reading logs from {self.config.api_url} failed: {error}") from error

    def request(self, job_id: str, action: str) -> dict[str, Any]:
        """`action`: cancel, suspend, resume, hold or release (on a job or a whole array)."""
        return self._call("POST", f"/v1/jobs/{_segment(job_id)}/{action}")

    # ------------------------------------------------------------------ the rest

    def events(
        self,
        *,
        after: int = 0,
        types: list[str] | None = None,
        stream: str | None = None,
        limit: int = 100,
    ) -> dict[str, Any]:
        params = _params(after=after, stream=stream, limit=limit)
        if types:
            params["type"] = ",".join(types)
        return self._call("GET", "/v1/events", params=params)

    def usage(
        self,
        *,
        team: str | None = None,
        start: str | None = None,
        end: str | None = None,
        by: str = "day",
    ) -> dict[str, Any]:
        params = _params(team=team, by=by, **{"from": start, "to": end})
        return self._call("GET", "/v1/usage", params=params)

    def nodes(self) -> dict[str, Any]:
        return self._call("GET", "/v1/nodes")

    def queues(self) -> dict[str, Any]:
        return self._call("GET", "/v1/queues")

    def teams(self) -> dict[str, Any]:
        return self._call("GET", "/v1/teams")

    def cluster(self) -> dict[str, Any]:
        return self._call("GET", "/v1/cluster")

    def drain(self, node_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(
            "POST", f"/v1/nodes/{_segment(node_id, 'node id')}/drain", json=dict(body)
        )

    def undrain(self, node_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/nodes/{_segment(node_id, 'node id')}/undrain")

    def create_team(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/teams", json=dict(body))

    def configure_queue(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/queues/{_segment(name, 'queue name')}", json=dict(body))

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
            # A team's reads are bounded (429 with Retry-After, services/api/ratelimit.py): a
            # read changes nothing, so `gangway jobs --all` paging a long history waits its
            # turn and goes on rather than failing half-way. Writes are left to the user.
            for _ in range(READ_RETRIES):
                wait = _read_wait(method, response)
                if wait is None:
                    break
                time.sleep(wait)
                response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ClientError(
                f"cannot reach the API at {self.config.api_url} ({type(error).__name__}); "
                "is it running (make up)?"
            ) from error
        if response.is_success:
            body = response.json()
            if not isinstance(body, dict):
                raise ClientError(f"unexpected answer from {method} {path}")
            return body
        raise _api_error(response, self.config)


# How often, and how long at most each time, a read answered 429 is tried again.
READ_RETRIES = 5
READ_RETRY_MAX_WAIT_S = 10.0


def _read_wait(method: str, response: httpx.Response) -> float | None:
    """The seconds to wait before asking again, when a read was refused for its rate."""
    if method != "GET" or response.status_code != 429:
        return None
    try:
        wait = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return wait if 0 <= wait <= READ_RETRY_MAX_WAIT_S else None


def _api_error(response: httpx.Response, config: ClientConfig) -> ApiError:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    detail = str(problem.get("detail") or problem.get("title") or response.reason_phrase)
    if response.status_code == 401:
        detail += f" ({_unauthorized_hint(config)})"
    return ApiError(response.status_code, detail, problem)


def _unauthorized_hint(config: ClientConfig) -> str:
    """What to check when the API refused the token: "set GANGWAY_TOKEN" read as a riddle to
    someone whose GANGWAY_TOKEN was set (to another installation's token, or a revoked one)."""
    if config.token_source is None:
        return "set GANGWAY_TOKEN, or run make up for .gangway/admin.token"
    return (
        f"the token from {config.token_source} is not one {config.api_url} knows: "
        "mistyped, revoked, or another installation's?"
    )


def _params(**values: object) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _segment(value: str, what: str = "job id") -> str:
    """One path segment, escaped: an id with a slash must not reach another route. An empty
    one, `.` or `..` is no segment at all (the URL is normalised without it: `gangway job ''`
    answered "Temporary Redirect", `gangway job ..` "Not Found"): refused before any request."""
    if value in ("", ".", ".."):
        raise ClientError(f"{value!r} is not a {what}")
    return quote(value, safe="")
