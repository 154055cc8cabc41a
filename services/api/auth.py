"""Bearer-token authentication: the admin token, or a team's token known by its sha256."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from services.api.problems import forbidden, not_found, unauthorized
from services.api.projections.jobs import JobReadModel
from services.api.projections.model import ReadModels

ADMIN = "admin"


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
    """Who calls: the admin (team None) or one team."""

    team: str | None

    @property
    def is_admin(self) -> bool:
        return self.team is None

    @property
    def name(self) -> str:
        return ADMIN if self.team is None else f"team:{self.team}"

    def can_see(self, job: JobReadModel) -> bool:
        return self.is_admin or job.spec.team == self.team

    def visible(self, job: JobReadModel | None, job_id: str) -> JobReadModel:
        """The job if this principal may see it; else 404, so that existence does not leak."""
        if job is None or not self.can_see(job):
            raise not_found(f"job {job_id}")
        return job

    def require_team(self, team: str) -> None:
        if not self.is_admin and team != self.team:
            raise forbidden(f"a token of team {self.team!r} cannot act for team {team!r}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise forbidden("this needs the admin token")


def authenticate(header: str | None, admin_sha256: str, models: ReadModels) -> Principal:
    if not header:
        raise unauthorized("missing bearer token")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("the Authorization header must be 'Bearer <token>'")
    digest = token_sha256(token)
    if hmac.compare_digest(digest, admin_sha256):
        return Principal(team=None)
    team = models.team_by_token_sha256.get(digest)
    if team is None:
        raise unauthorized("unknown token")
    return Principal(team=team)
