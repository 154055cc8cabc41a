"""Only the relay may produce onto the log's topics: the broker itself says so.

scripts/stack.sh's broker authenticates every client (SASL/SCRAM) and authorizes it (ACLs,
granted per topic prefix by the admin: services/runtime/bus_acl.py). Tried against the real
broker: a client without credentials, or with a wrong password, gets nowhere; the services'
and the agents' principals are refused the jobs topic; the relay's is not; and the topic holds
exactly the relay's records afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError
from pydantic import SecretStr

from gangway.launcher import bus_credentials
from schemas.jobs import JobSpec, RankPlacement
from services.agent.plan import rank_env
from services.runtime import Settings, Topics
from services.runtime.bus_acl import AGENT, RELAY, ROLES, SERVICE, password_variable
from services.runtime.kafka import make_consumer, make_producer
from services.runtime.topics import ensure_topics
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


def _as(
    settings: Settings, stack: Stack, principal: str | None, password: str | None = None
) -> Settings:
    """`settings` as another principal of the broker (None: no credentials at all)."""
    if principal is not None and password is None:
        role = next(role for role, name in ROLES.items() if name == principal)
        password = stack.kafka_auth[password_variable(role)]
    return settings.model_copy(
        update={
            "kafka_username": principal,
            "kafka_password": None if password is None else SecretStr(password),
            "service_name": f"acl-test-{principal or 'anonymous'}",
        }
    )


@pytest.fixture
def authenticating(stack: Stack) -> Stack:
    if password_variable("relay") not in stack.kafka_auth:
        pytest.skip(
            f"the broker at {stack.kafka_bootstrap} was given without its roles' credentials "
            "(not scripts/stack.sh's authenticating broker): its ACLs cannot be tried"
        )
    return stack


async def _produce(settings: Settings, topic: str, value: bytes) -> None:
    producer = make_producer(settings)
    try:
        await producer.start()
        await producer.send_and_wait(topic, value, key=b"job-forged")
    finally:
        await producer.stop()


async def _records(settings: Settings, topic: str) -> int:
    consumer = make_consumer(settings, group_id=f"{settings.topic_prefix}.acl-count")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.topic_partitions)]
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        return sum(ends[p] - starts[p] for p in partitions)
    finally:
        await consumer.stop()


async def test_only_the_relay_may_produce_onto_the_jobs_topic(
    authenticating: Stack, settings: Settings, topics: Topics
) -> None:
    # As the admin (the fixture's principal): the topics, and each role's rights on them.
    await ensure_topics(settings)

    # No credentials: the broker speaks SASL only, so the client cannot even start.
    with pytest.raises(KafkaError):
        await _produce(_as(settings, authenticating, None), topics.jobs, b"anonymous")
    # A known name with a wrong password: authentication fails.
    with pytest.raises(KafkaError):
        await _produce(_as(settings, authenticating, RELAY, "guessed"), topics.jobs, b"guessed")
    # Authenticated, but not the relay: the broker refuses the topic.
    for principal in (SERVICE, AGENT):
        with pytest.raises(TopicAuthorizationFailedError):
            await _produce(_as(settings, authenticating, principal), topics.jobs, b"forged")

    await _produce(_as(settings, authenticating, RELAY), topics.jobs, b"the relay's")
    # What the others may write, they can: heartbeats from agents, dead letters from anyone.
    await _produce(_as(settings, authenticating, AGENT), topics.telemetry, b"heartbeat")
    await _produce(_as(settings, authenticating, SERVICE), topics.deadletter, b"dead letter")
    with pytest.raises(TopicAuthorizationFailedError):
        await _produce(_as(settings, authenticating, SERVICE), topics.telemetry, b"heartbeat")

    assert await _records(settings, topics.jobs) == 1


def test_each_service_is_given_its_own_role_and_no_other_password() -> None:
    given = {
        "GANGWAY_KAFKA_USERNAME": "gangway_admin",
        "GANGWAY_KAFKA_PASSWORD": "admin-secret",
        **{password_variable(role): f"{role}-secret" for role in ROLES},
    }
    for role, principal in ROLES.items():
        env = bus_credentials(dict(given), role)
        assert env["GANGWAY_KAFKA_USERNAME"] == principal
        assert env["GANGWAY_KAFKA_PASSWORD"] == f"{role}-secret"
        assert not any(
            value.endswith("-secret")
            for key, value in env.items()
            if key != "GANGWAY_KAFKA_PASSWORD"
        )


def test_a_rank_gets_none_of_the_brokers_credentials(tmp_path: Path) -> None:
    """The agent runs as a service, with its principal's password in its environment; the
    ranks it starts get none of it (nor the bus key, nor the database's DSNs)."""
    agent_env: Mapping[str, str] = {
        "PATH": "/usr/bin:/bin",
        "GANGWAY_KAFKA_USERNAME": AGENT,
        "GANGWAY_KAFKA_PASSWORD": "agent-secret",
        "GANGWAY_KAFKA_BOOTSTRAP": "127.0.0.1:29092",
        "GANGWAY_BUS_KEY": "bus-secret",
        "GANGWAY_PG_DSN": "postgresql://gangway_app:pg-secret@127.0.0.1:25432/gangway",
    }
    spec = JobSpec(name="probe", team="t", tasks=1, gpus_per_task=1, command=["true"])
    env = rank_env(
        spec=spec,
        job_id="j1",
        attempt=1,
        placement=RankPlacement(node_id="n1", rank=0, gpus=[0]),
        world_size=1,
        checkpoint_dir=None,
        checkpoint_request=tmp_path / "request",
        agent_env=agent_env,
    )
    assert not [key for key in env if key.startswith("GANGWAY_KAFKA_")]
    assert not any("secret" in value for value in env.values())
