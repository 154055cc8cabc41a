"""Only the log speaks: a record produced straight onto an event topic, however well formed,
changes nothing. The one consumer loop (the agent's, admission's, every service's) and the
API's read models act only on records the relay signed; a forged one is dead-lettered."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaProducer

from schemas import EventEnvelope
from schemas.jobs import JobSucceeded
from services.api.app import create_app
from services.runtime import EventConsumer, EventStore, OutboxRelay, Settings, Topics
from services.runtime.kafka import make_producer
from services.runtime.signing import signed
from services.runtime.topics import ensure_topics
from tests.api.conftest import api_settings
from tests.integration.support import header, read_topics, running, started, wait_until

pytestmark = pytest.mark.integration


def _forged_success(job_id: str, position: int, version: int) -> bytes:
    """A JobSucceeded exactly as the relay would publish it, but for a position the log does
    not hold."""
    payload = JobSucceeded(job_id=job_id, attempt=1).model_dump_json()
    head = {
        "event_id": str(uuid.uuid4()),
        "stream": f"job-{job_id}",
        "version": version,
        "position": position,
        "type": "JobSucceeded",
        "schema_version": 1,
        "recorded_at": datetime.now(UTC).isoformat(),
        "correlation_id": None,
        "causation_id": None,
        "producer": "agent",
        "epoch": None,
    }
    return (json.dumps(head)[:-1] + f', "payload": {payload}}}').encode()


@pytest.fixture
async def forger(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    await ensure_topics(settings)
    producer = make_producer(settings)
    await producer.start()
    yield producer
    await producer.stop()


async def _forge(
    producer: AIOKafkaProducer, topics: Topics, job_id: str, position: int, version: int
) -> list[bytes]:
    """Produce the forgery twice: without a signature, and signed with a guessed key."""
    values = [_forged_success(job_id, position, version) for _ in range(2)]
    base = [("type", b"JobSucceeded"), ("position", str(position).encode())]
    await producer.send_and_wait(topics.jobs, values[0], key=f"job-{job_id}".encode(), headers=base)
    await producer.send_and_wait(
        topics.jobs,
        values[1],
        key=f"job-{job_id}".encode(),
        headers=signed(base, values[1], b"a guessed key"),
    )
    return values


async def test_a_forged_job_succeeded_on_the_bus_is_dead_lettered_and_no_handler_sees_it(
    settings: Settings, store: EventStore, topics: Topics, forger: AIOKafkaProducer
) -> None:
    seen: list[EventEnvelope] = []

    async def on_succeeded(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        seen.append(envelope)

    consumer = EventConsumer(
        settings,
        store.pool,
        name="agent-like",
        topics=[topics.jobs],
        handlers={"JobSucceeded": on_succeeded},
    )
    async with running(OutboxRelay(store, settings)), running(consumer) as task:
        await started(consumer, task)
        forged = await _forge(forger, topics, "victim", 1, 1)
        dead = await read_topics(settings, [topics.deadletter], 2)
        # The log's own JobSucceeded, through the relay, still acts: the loop is alive.
        await store.append("job-real", None, [JobSucceeded(job_id="real", attempt=1)])

        async def real_one_seen() -> bool:
            return any(e.stream == "job-real" for e in seen)

        await wait_until(real_one_seen, what="the log's JobSucceeded handled")
    assert [e.stream for e in seen] == ["job-real"]
    assert sorted(d.value for d in dead) == sorted(forged)
    reasons = sorted(header(d, "deadletter.reason") or "" for d in dead)
    assert "no signature header" in reasons[0] + reasons[1]
    assert "signature does not match" in reasons[0] + reasons[1]


async def test_the_api_does_not_show_a_forged_success(
    settings: Settings, store: EventStore, topics: Topics, forger: AIOKafkaProducer, tmp_path: Path
) -> None:
    configured = api_settings(settings, tmp_path, catch_up_interval_s=0.2)
    app = create_app(configured, use_bus=True)
    admin = {"Authorization": f"Bearer {configured.admin_token.get_secret_value()}"}  # type: ignore[union-attr]
    async with (
        running(OutboxRelay(store, settings)),
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gangway.test"
        ) as client,
    ):
        created = await client.post(
            "/v1/teams", json={"name": "nlp", "guaranteed_gpus": 8, "max_gpus": 64}, headers=admin
        )
        assert created.status_code == 201, created.text
        body = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}
        submitted = await client.post("/v1/jobs", json=body, headers=admin)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        head = await store.head()
        version = await store.stream_version(f"job-{job_id}")
        await _forge(forger, topics, job_id, head + 1, version + 1)
        await read_topics(settings, [topics.deadletter], 2)
        job = (await client.get(f"/v1/jobs/{job_id}", headers=admin)).json()
        ready = (await client.get("/readyz")).json()
    assert job["state"] != "succeeded"
    assert [e.type for e in await store.read_stream(f"job-{job_id}")] == ["JobSubmitted"]
    assert ready["detail"]["relay"]["dead_letters"] == 0
