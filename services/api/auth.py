"""Bearer-token authentication: the admin token, or one of a team's named tokens.

A team token is looked up in the log itself on every request (by its sha256, through an
index), never in a process's memory: issuing and revoking take effect at once in every API
process, whatever their read models have applied so far. Only refusals are remembered
(auth_guard.py), so that a flood of unknown tokens does not become a flood of look-ups.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from schemas.teams import token_id_of
from services.api.auth_guard import AuthGuard
from services.api.problems import forbidden, not_found, unauthorized
from services.api.projections.jobs import JobReadModel
from services.api.ratelimit import rate_limited

ADMIN = "admin"
# The token a team is created with; further ones are named by whoever asks for them.
FIRST_TOKEN = "default"
UNKNOWN = "unknown token"
REVOKED = "this token was revoked"
# A job id as the API draws them (12 hex digits), or an element of an array of one.
# ("job " before it is part of what is replaced: "preempted for a job of another team".)
_JOB_ID = re.compile(r"(?:\bjob )?\b([0-9a-f]{12}(?:_[0-9]{1,4})?)\b")
OTHER_TEAMS_JOB = "a job of another team"

# The token's grant and whether it was revoked since, in one indexed look-up: the partial
# index of migration 0020 finds the grant, the stream's (stream, version) key the revocation.
_LOOKUP = """
SELECT CASE e.type WHEN 'TeamCreated' THEN e.payload->>'name' ELSE e.payload->>'team' END,
       CASE e.type WHEN 'TeamCreated' THEN $2 ELSE e.payload->>'name' END,
       EXISTS (SELECT 1 FROM events r
               WHERE r.stream = e.stream AND r.type = 'TeamTokenRevoked'
                 AND r.payload->>'token_id' = $3)
FROM events e
WHERE (e.payload->>'token_sha256') = $1 AND e.type IN ('TeamCreated', 'TeamTokenIssued')
ORDER BY e.position
LIMIT 1
"""


def new_token() -> str:
    """32 random bytes, URL-safe: what a team or the admin presents as a bearer token."""
    return secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_admin_token(configured: str | None, path: Path) -> str:
    """The configured token, else the one in `path`, else a new one written there (0600)."""
    if configured:
        return configured
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls: the admin (team None) or one team, through one of its named tokens."""

    team: str | None
    token_name: str = FIRST_TOKEN

    @property
    def is_admin(self) -> bool:
        return self.team is None

    @property
    def name(self) -> str:
        """Who acted, as recorded in events (`submitted_by`, `by`)."""
        if self.team is None:
            return ADMIN
        if self.token_name == FIRST_TOKEN:
            return f"team:{self.team}"
        return f"team:{self.team}/{self.token_name}"

    def can_see(self, job: JobReadModel) -> bool:
        return self.is_admin or job.spec.team == self.team

    def visible(self, job: JobReadModel | None, job_id: str) -> JobReadModel:
        """The job if this principal may see it; else 404, so that existence does not leak."""
        if job is None or not self.can_see(job):
            raise not_found(f"job {job_id}")
        return job

    def words(self, text: str, jobs: Mapping[str, JobReadModel]) -> str:
        """`text` with the id of every job of `jobs` this principal may not see replaced: a
        preemption names the job it was for (in the victim's reason and events), and the
        preemptor's reason names its victims, each possibly another team's."""
        if self.is_admin:
            return text

        def shown(match: re.Match[str]) -> str:
            job = jobs.get(match[1])
            return OTHER_TEAMS_JOB if job is not None and not self.can_see(job) else match[0]

        return _JOB_ID.sub(shown, text)

    def payload(self, value: Any, jobs: Mapping[str, JobReadModel]) -> Any:
        """An event's JSON payload with `words` applied to every string in it."""
        if isinstance(value, str):
            return self.words(value, jobs)
        if isinstance(value, dict):
            return {key: self.payload(item, jobs) for key, item in value.items()}
        if isinstance(value, list):
            return [self.payload(item, jobs) for item in value]
        return value

    def require_team(self, team: str) -> None:
        if not self.is_admin and team != self.team:
            raise forbidden(f"a token of team {self.team!r} cannot act for team {team!r}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise forbidden("this needs the admin token")


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when it is not one."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def is_admin_token(token: str, admin_sha256: str) -> bool:
    return hmac.compare_digest(token_sha256(token), admin_sha256)


async def authenticate(
    header: str | None,
    admin_sha256: str,
    pool: asyncpg.Pool,
    guard: AuthGuard | None = None,
    client: str = "unknown",
) -> Principal:
    """Who presents `header`. A team token is accepted only from the log, never from memory;
    with a `guard`, a token that does not authenticate is refused cheaply (auth_guard.py):
    from memory when it was refused before, 429 for `client` past its failed look-ups."""
    if not header:
        raise unauthorized("missing bearer token")
    token = bearer_token(header)
    if token is None:
        raise unauthorized("the Authorization header must be 'Bearer <token>'")
    if is_admin_token(token, admin_sha256):
        return Principal(team=None)
    digest = token_sha256(token)
    token_id = token_id_of(digest)
    spent = False
    if guard is not None:
        known = guard.known(token_id)
        if known is not None and known.revoked:
            raise unauthorized(REVOKED)  # a revocation is for ever: no look-up needed
        if known is None:
            detail = guard.refused(digest)
            if detail is not None:
                raise unauthorized(detail)
            wait = guard.spend(client)
            if wait is not None:
                raise rate_limited("too many unknown tokens from this address", wait)
            spent = True
    row = await pool.fetchrow(_LOOKUP, digest, FIRST_TOKEN, token_id)
    if row is None or row[2]:
        detail = UNKNOWN if row is None else REVOKED
        if guard is not None:
            guard.refuse(digest, detail)
        raise unauthorized(detail)
    if spent and guard is not None:
        guard.give_back(client)
    team, token_name, _ = row
    return Principal(team=str(team), token_name=str(token_name))
