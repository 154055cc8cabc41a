"""Teams and queues: the quota tree (org → team) with guaranteed GPUs and borrowing ceilings."""

from __future__ import annotations

from uuid import UUID

from pydantic import Field, model_validator

from schemas.base import Event
from schemas.jobs import NAME_PATTERN


class TeamCreated(Event):
    """A team and its queue of the same name; the token's hash authenticates the team."""

    type = "TeamCreated"
    name: str = Field(pattern=NAME_PATTERN)
    parent: str | None = Field(default=None, pattern=NAME_PATTERN)
    guaranteed_gpus: int = Field(ge=0)
    max_gpus: int | None = Field(default=None, ge=0)
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @property
    def stream(self) -> str:
        return f"team-{self.name}"

    @model_validator(mode="after")
    def _max_covers_guarantee(self) -> TeamCreated:
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            raise ValueError("max_gpus must be at least guaranteed_gpus")
        return self


class QueueConfigured(Event):
    """A queue's place in the tree, its guarantee, its ceiling (None: no ceiling) and weight.

    `max_cpus` and `max_memory_mb` cap the CPUs and memory the queue's subtree may hold at
    once (None: no cap), as `max_gpus` caps its GPUs; there is no CPU or memory guarantee."""

    type = "QueueConfigured"
    name: str = Field(pattern=NAME_PATTERN)
    parent: str | None = Field(default=None, pattern=NAME_PATTERN)
    guaranteed_gpus: int = Field(ge=0)
    max_gpus: int | None = Field(default=None, ge=0)
    weight: float = Field(default=1.0, gt=0)
    max_cpus: int | None = Field(default=None, ge=0)
    max_memory_mb: int | None = Field(default=None, ge=0)

    @property
    def stream(self) -> str:
        return f"queue-{self.name}"

    @model_validator(mode="after")
    def _max_covers_guarantee(self) -> QueueConfigured:
        if self.max_gpus is not None and self.max_gpus < self.guaranteed_gpus:
            raise ValueError("max_gpus must be at least guaranteed_gpus")
        return self


# The first token of a team (TeamCreated's) has an id like every other: its hash's prefix.
TOKEN_ID_PATTERN = r"^[0-9a-f]{16}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


def token_id_of(token_sha256: str) -> str:
    return token_sha256[:16]


class TeamPolicyConfigured(Event):
    """What a team may ask of the cluster, set by the admin; a whole value, last one wins.

    `allowed_priority_classes` None means every class but `inference-critical`; the limits None mean
    no limit.
    """

    type = "TeamPolicyConfigured"
    team: str = Field(pattern=NAME_PATTERN)
    allowed_priority_classes: list[str] | None = Field(default=None, max_length=64)
    non_preemptible_allowed: bool = False
    max_pending_jobs: int | None = Field(default=None, ge=0)
    submissions_per_second: float | None = Field(default=None, gt=0)
    # Jobs a second, each job of a batch or an array counted (the rate above counts requests).
    jobs_per_second: float | None = Field(default=None, gt=0)

    @property
    def stream(self) -> str:
        return f"team-{self.team}"


class TeamTokenIssued(Event):
    """A further named token of the team (one per person or robot); only its hash is kept."""

    type = "TeamTokenIssued"
    team: str = Field(pattern=NAME_PATTERN)
    token_id: str = Field(pattern=TOKEN_ID_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    token_sha256: str = Field(pattern=SHA256_PATTERN)

    @property
    def stream(self) -> str:
        return f"team-{self.team}"


class TeamTokenRevoked(Event):
    """The token no longer authenticates anyone, in every API process at once."""

    type = "TeamTokenRevoked"
    team: str = Field(pattern=NAME_PATTERN)
    token_id: str = Field(pattern=TOKEN_ID_PATTERN)

    @property
    def stream(self) -> str:
        return f"team-{self.team}"


class TeamSecretSet(Event):
    """A secret's value, sealed with the team's key (AES-GCM; `key_id` names the key, which
    lives outside the log): deleting that key makes this event's value unrecoverable."""

    type = "TeamSecretSet"
    team: str = Field(pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    key_id: UUID
    ciphertext: str = Field(min_length=1, max_length=65_536)

    @property
    def stream(self) -> str:
        return f"secrets-{self.team}"


class TeamSecretDeleted(Event):
    type = "TeamSecretDeleted"
    team: str = Field(pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)

    @property
    def stream(self) -> str:
        return f"secrets-{self.team}"


class TeamKeyDeleted(Event):
    """The team's secret key was destroyed: every secret sealed with it is forgotten."""

    type = "TeamKeyDeleted"
    team: str = Field(pattern=NAME_PATTERN)
    key_id: UUID | None

    @property
    def stream(self) -> str:
        return f"secrets-{self.team}"


TEAM_EVENTS: tuple[type[Event], ...] = (
    TeamCreated,
    QueueConfigured,
    TeamPolicyConfigured,
    TeamTokenIssued,
    TeamTokenRevoked,
    TeamSecretSet,
    TeamSecretDeleted,
    TeamKeyDeleted,
)
