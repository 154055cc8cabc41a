"""Team secrets sealed with a per-team key that lives outside the append-only log.

The log records only ciphertext (TeamSecretSet); the key is a row of `team_keys`, which may be
deleted. Once it is, every secret that team ever set is unrecoverable, in old events too
(crypto-shredding), while the events themselves, and so replay, stay intact.

AES-256-GCM from `cryptography`, with the team and the secret's name as associated data: a
ciphertext copied into another team's or another name's event does not open.
"""

from __future__ import annotations

import base64
import os
from uuid import UUID, uuid4

import asyncpg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12


class SecretForgotten(LookupError):
    """The secret's key is gone (or never opened this ciphertext): its value is lost."""


def _aad(team: str, name: str) -> bytes:
    return f"gangway-secret\0{team}\0{name}".encode()


def seal(key: bytes, team: str, name: str, value: str) -> str:
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, value.encode(), _aad(team, name))
    return base64.b64encode(nonce + sealed).decode("ascii")


def unseal(key: bytes, team: str, name: str, ciphertext: str) -> str:
    raw = base64.b64decode(ciphertext)
    try:
        opened = AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(team, name))
    except InvalidTag:
        raise SecretForgotten(f"secret {name!r} of team {team!r} cannot be opened") from None
    return opened.decode()


async def team_key(conn: asyncpg.Connection | asyncpg.Pool, team: str) -> tuple[UUID, bytes]:
    """The team's current key, drawn now if it has none (two writers agree on the first).

    Inside a transaction the key's row stays locked FOR SHARE until it ends: a concurrent
    deletion of the key is then ordered wholly before or after what the caller records.
    """
    await conn.execute(
        "INSERT INTO team_keys (key_id, team, key) VALUES ($1, $2, $3)"
        " ON CONFLICT (team) DO NOTHING",
        uuid4(),
        team,
        AESGCM.generate_key(bit_length=KEY_BYTES * 8),
    )
    row = await conn.fetchrow("SELECT key_id, key FROM team_keys WHERE team = $1 FOR SHARE", team)
    assert row is not None
    return row["key_id"], bytes(row["key"])


async def key_by_id(conn: asyncpg.Connection | asyncpg.Pool, key_id: UUID) -> bytes | None:
    key = await conn.fetchval("SELECT key FROM team_keys WHERE key_id = $1", key_id)
    return None if key is None else bytes(key)


async def delete_team_key(conn: asyncpg.Connection | asyncpg.Pool, team: str) -> UUID | None:
    """Destroy the team's key: the id of the key destroyed, or None when it had none."""
    key_id: UUID | None = await conn.fetchval(
        "DELETE FROM team_keys WHERE team = $1 RETURNING key_id", team
    )
    return key_id
