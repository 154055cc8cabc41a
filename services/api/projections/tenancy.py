"""What the API knows of each team beyond its quota: its policy, its named tokens, the names
of its secrets (never their values), and which log positions belong to it (the audit index).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.admission import DEFAULT_TEAM_POLICY, TeamPolicy
from schemas.base import Event
from schemas.teams import (
    TeamCreated,
    TeamKeyDeleted,
    TeamPolicyConfigured,
    TeamSecretDeleted,
    TeamSecretSet,
    TeamTokenIssued,
    TeamTokenRevoked,
    token_id_of,
)

# The streams whose events belong to the job named after the prefix.
JOB_STREAM_PREFIXES = ("job-", "checkpoint-")
# The streams whose events belong to the team named after the prefix.
TEAM_STREAM_PREFIXES = ("team-", "queue-", "secrets-")


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    team: str
    name: str
    revoked: bool = False


@dataclass(slots=True)
class Tenancy:
    policies: dict[str, TeamPolicy] = field(default_factory=dict)
    tokens: dict[str, TokenRecord] = field(default_factory=dict)
    # Each team's tokens by name (names are never reused within a team): what a team's
    # commands look up, without a walk over every team's tokens.
    team_tokens: dict[str, dict[str, TokenRecord]] = field(default_factory=dict)
    secrets: dict[str, set[str]] = field(default_factory=dict)
    # What a team without a policy of its own gets: the installation's default limits
    # (ApiSettings.team_max_pending_jobs, team_submissions_per_second).
    default: TeamPolicy = DEFAULT_TEAM_POLICY

    def policy_of(self, team: str) -> TeamPolicy:
        return self.policies.get(team, self.default)

    def apply(self, event: Event) -> None:
        handler = _TENANCY_FOLDS.get(type(event))
        if handler is not None:
            handler(self, event)

    def live_tokens(self, team: str) -> int:
        """How many of the team's tokens are not revoked."""
        return sum(not token.revoked for token in self.team_tokens.get(team, {}).values())

    def _keep(self, token: TokenRecord) -> None:
        self.tokens[token.id] = token
        self.team_tokens.setdefault(token.team, {})[token.name] = token

    def _on_team_created(self, event: TeamCreated) -> None:
        token_id = token_id_of(event.token_sha256)
        self._keep(TokenRecord(token_id, event.name, "default"))

    def _on_policy_configured(self, event: TeamPolicyConfigured) -> None:
        self.policies[event.team] = TeamPolicy.of(event)

    def _on_token_issued(self, event: TeamTokenIssued) -> None:
        self._keep(TokenRecord(event.token_id, event.team, event.name))

    def _on_token_revoked(self, event: TeamTokenRevoked) -> None:
        token = self.tokens.get(event.token_id)
        if token is not None and token.team == event.team:
            self._keep(TokenRecord(token.id, token.team, token.name, revoked=True))

    def _on_secret_set(self, event: TeamSecretSet) -> None:
        self.secrets.setdefault(event.team, set()).add(event.name)

    def _on_secret_deleted(self, event: TeamSecretDeleted) -> None:
        self.secrets.get(event.team, set()).discard(event.name)

    def _on_key_deleted(self, event: TeamKeyDeleted) -> None:
        self.secrets.pop(event.team, None)


# The fold's dispatch table: each event class of a team's streams the tenancy model reads.
_TENANCY_FOLDS: dict[type[Event], Callable[[Tenancy, Any], None]] = {
    TeamCreated: Tenancy._on_team_created,
    TeamPolicyConfigured: Tenancy._on_policy_configured,
    TeamTokenIssued: Tenancy._on_token_issued,
    TeamTokenRevoked: Tenancy._on_token_revoked,
    TeamSecretSet: Tenancy._on_secret_set,
    TeamSecretDeleted: Tenancy._on_secret_deleted,
    TeamKeyDeleted: Tenancy._on_key_deleted,
}
TENANCY_EVENTS: tuple[type[Event], ...] = tuple(_TENANCY_FOLDS)


@dataclass(slots=True)
class AuditIndex:
    """Per team, the positions of the log's events that team may read, in order.

    A team's audit page reads exactly its own events by position (the primary key), however
    much other teams have written: no scan of the log and filter afterwards.
    """

    positions: dict[str, list[int]] = field(default_factory=dict)
    # Events of a job's streams seen before the job itself (the bus orders only per stream).
    _orphans: dict[str, list[int]] = field(default_factory=dict)

    def add(self, team: str, position: int) -> None:
        found = self.positions.setdefault(team, [])
        if not found or found[-1] < position:
            found.append(position)
        else:
            at = bisect_right(found, position)
            if at == 0 or found[at - 1] != position:
                found.insert(at, position)

    def add_for_job(self, job_id: str, team: str | None, position: int) -> None:
        if team is None:
            self._orphans.setdefault(job_id, []).append(position)
            return
        for orphan in self._orphans.pop(job_id, ()):
            self.add(team, orphan)
        self.add(team, position)

    def after(self, team: str, position: int, limit: int) -> list[int]:
        found = self.positions.get(team, [])
        start = bisect_right(found, position)
        return found[start : start + limit]


def team_of_stream(stream: str) -> str | None:
    for prefix in TEAM_STREAM_PREFIXES:
        if stream.startswith(prefix):
            return stream.removeprefix(prefix)
    return None


def job_of_stream(stream: str) -> str | None:
    for prefix in JOB_STREAM_PREFIXES:
        if stream.startswith(prefix):
            return stream.removeprefix(prefix)
    return None
