"""The real PostgreSQL and Kafka for the integration tier.

The session starts the local stack through scripts/stack.sh unless GANGWAY_PG_DSN and
GANGWAY_KAFKA_BOOTSTRAP point at running servers. Every test gets a database of its own
(created by the owner role, migrated) and a topic prefix of its own.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.runtime import EventStore, Settings, Topics, migrate_settings
from services.runtime.scratch import delete_topics, scratch_database, with_database
from tests.integration.proxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]
STACK_SCRIPT = ROOT / "scripts" / "stack.sh"


@dataclass(frozen=True)
class Stack:
    pg_dsn: str
    pg_owner_dsn: str
    kafka_bootstrap: str
    # Whether the broker is the local one scripts/stack.sh can restart.
    kafka_is_local: bool
    # The broker's credentials, as .gangway/env gives them (GANGWAY_KAFKA_USERNAME/PASSWORD:
    # the admin's; GANGWAY_KAFKA_<ROLE>_PASSWORD: each role's); empty: no authentication.
    kafka_auth: Mapping[str, str] = field(default_factory=dict)

    def kafka_settings(self) -> dict[str, Any]:
        """The Settings fields that make a client the admin of this stack's broker."""
        fields = {
            "GANGWAY_KAFKA_USERNAME": "kafka_username",
            "GANGWAY_KAFKA_PASSWORD": "kafka_password",
            "GANGWAY_KAFKA_SASL_MECHANISM": "kafka_sasl_mechanism",
        }
        return {fields[k]: v for k, v in self.kafka_auth.items() if k in fields}

    def restart_kafka(self) -> None:
        subprocess.run([str(STACK_SCRIPT), "restart-kafka"], check=True, cwd=ROOT)


def _parse_env(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def kafka_auth(env: Mapping[str, str]) -> dict[str, str]:
    """The broker credentials among KEY=value settings (all GANGWAY_KAFKA_* but the address)."""
    return {
        key: value
        for key, value in env.items()
        if key.startswith("GANGWAY_KAFKA_") and key != "GANGWAY_KAFKA_BOOTSTRAP"
    }


@pytest.fixture(scope="session")
def stack() -> Stack:
    external_kafka = bool(os.environ.get("GANGWAY_KAFKA_BOOTSTRAP"))
    if not (os.environ.get("GANGWAY_PG_DSN") and external_kafka):
        subprocess.run([str(STACK_SCRIPT), "up"], check=True, cwd=ROOT)
    env = _parse_env(
        subprocess.run(
            [str(STACK_SCRIPT), "env"], check=True, cwd=ROOT, capture_output=True, text=True
        ).stdout
    )
    local_bootstrap = _parse_env(
        subprocess.run(
            [str(STACK_SCRIPT), "env"],
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "GANGWAY_KAFKA_BOOTSTRAP"},
        ).stdout
    )["GANGWAY_KAFKA_BOOTSTRAP"]
    # A broker given by the environment comes with the environment's credentials (or none).
    auth = kafka_auth(os.environ) if external_kafka else kafka_auth(env)
    return Stack(
        pg_dsn=env["GANGWAY_PG_DSN"],
        pg_owner_dsn=env["GANGWAY_PG_OWNER_DSN"],
        kafka_bootstrap=env["GANGWAY_KAFKA_BOOTSTRAP"],
        kafka_is_local=env["GANGWAY_KAFKA_BOOTSTRAP"] == local_bootstrap,
        kafka_auth=auth,
    )


@pytest.fixture
async def settings(stack: Stack, request: pytest.FixtureRequest) -> AsyncIterator[Settings]:
    """A fresh, migrated database and a fresh topic prefix for one test."""
    tag = uuid.uuid4().hex[:10]
    async with scratch_database(stack.pg_owner_dsn, f"gw_test_{tag}") as database:
        test_settings = Settings(
            pg_dsn=with_database(stack.pg_dsn, database),
            pg_owner_dsn=with_database(stack.pg_owner_dsn, database),
            kafka_bootstrap=stack.kafka_bootstrap,
            **stack.kafka_settings(),
            topic_prefix=f"test-{tag}",
            service_name=f"test-{request.node.name[:40]}",
            relay_poll_interval_s=0.2,
            _env_file=None,
        )
        await migrate_settings(test_settings)
        yield test_settings
    await delete_topics(test_settings)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[EventStore]:
    event_store = await EventStore.connect(settings, producer="tests")
    yield event_store
    await event_store.close()


@pytest.fixture
async def proxy(settings: Settings) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A loopback proxy in front of the stack's PostgreSQL the test may cut, and the DSN that
    goes through it."""
    cut, dsn = await TcpProxy.for_dsn(settings.pg_dsn)
    yield cut, dsn
    await cut.cut()


@pytest.fixture
def topics(settings: Settings) -> Topics:
    return Topics.from_settings(settings)
