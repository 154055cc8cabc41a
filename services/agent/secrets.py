"""The job's `secret_env`, resolved at launch: the team's sealed secrets, opened with its key.

The values exist only here, in the agent's memory, and in the rank's environment: never in
the spec, the log, Kafka or the agent's own log lines.
"""

from __future__ import annotations

from schemas.jobs import JobSpec
from schemas.teams import TeamKeyDeleted, TeamSecretDeleted, TeamSecretSet
from services.runtime.store import EventStore
from services.runtime.vault import SecretForgotten, key_by_id, unseal


class SecretUnavailable(OSError):
    """A secret the job refers to is not set, deleted, or forgotten: the rank cannot start.

    An OSError, so that the agent records it as a failed launch like any other.
    """


async def resolve_secret_env(store: EventStore, spec: JobSpec) -> dict[str, str]:
    """VAR -> value for every entry of the spec's `secret_env`."""
    if not spec.secret_env:
        return {}
    current: dict[str, TeamSecretSet] = {}
    for envelope in await store.read_stream(f"secrets-{spec.team}"):
        match envelope.payload:
            case TeamSecretSet() as sealed:
                current[sealed.name] = sealed
            case TeamSecretDeleted(name=name):
                current.pop(name, None)
            case TeamKeyDeleted():
                current.clear()
    resolved: dict[str, str] = {}
    for var, name in spec.secret_env.items():
        sealed_value = current.get(name)
        if sealed_value is None:
            raise SecretUnavailable(f"secret {name!r} of team {spec.team!r} is not set")
        key = await key_by_id(store.pool, sealed_value.key_id)
        if key is None:
            raise SecretUnavailable(f"secret {name!r} of team {spec.team!r} was forgotten")
        try:
            resolved[var] = unseal(key, spec.team, name, sealed_value.ciphertext)
        except SecretForgotten as error:
            raise SecretUnavailable(str(error)) from None
    return resolved
