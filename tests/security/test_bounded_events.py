"""Bounded events, and a relay no event can stop: the largest request the API accepts flows
through the whole pipeline, one byte more is a 413, an event over the log's bound is never
appended, and an event the bus refuses is dead-lettered while later jobs are still admitted."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from schemas.jobs import JobAdmitted, JobSpec, JobSubmitted
from services.runtime import EventConsumer, EventStore, OutboxRelay, Settings, Topics
from services.runtime.errors import EventTooLarge
from services.runtime.kafka import make_admin
from services.runtime.limits import (
    MAX_EVENT_BYTES,
    MAX_FETCH_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BODY_BYTES,
)
from services.runtime.topics import ensure_topics
from tests.api.conftest import Api
from tests.integration.conftest import ROOT
from tests.integration.support import header, read_topics, running, started, wait_until
from tests.integration.test_admission_service import admission, create_team, register_nodes

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


def test_each_bound_is_below_the_next_from_the_request_to_the_fetch() -> None:
    assert MAX_REQUEST_BODY_BYTES < MAX_EVENT_BYTES < MAX_MESSAGE_BYTES <= MAX_FETCH_BYTES
    stack = (ROOT / "scripts" / "stack.sh").read_text()
    [broker] = re.findall(r"^KAFKA_MAX_MESSAGE_BYTES=(\d+)$", stack, re.MULTILINE)
    assert int(broker) == MAX_MESSAGE_BYTES
    assert "message.max.bytes=$KAFKA_MAX_MESSAGE_BYTES" in stack


def _job_body(team: str, size: int) -> bytes:
    """A job whose JSON body is exactly `size` bytes, padded in one env value."""
    body: dict[str, Any] = {
        "name": "big",
        "team": team,
        "tasks": 1,
        "gpus_per_task": 1,
        "command": ["true"],
        "env": {"PAD": ""},
    }
    bare = len(json.dumps(body).encode())
    body["env"]["PAD"] = "x" * (size - bare)
    encoded = json.dumps(body).encode()
    assert len(encoded) == size
    return encoded


async def _state(api: Api, job_id: str) -> str:
    response = await api.client.get(f"/v1/jobs/{job_id}", headers=api.as_admin())
    return str(response.json().get("state"))


async def test_the_largest_accepted_job_flows_through_the_pipeline_and_one_byte_more_is_413(
    api: Api, settings: Settings, store: EventStore, topics: Topics
) -> None:
    await register_nodes(store)
    team = await api.create_team("nlp")
    limit = api.settings.max_body_bytes
    assert limit == MAX_REQUEST_BODY_BYTES
    headers = {**team, "Content-Type": "application/json"}

    over = await api.client.post("/v1/jobs", content=_job_body("nlp", limit + 1), headers=headers)
    assert (over.status_code, over.headers["content-type"]) == (413, PROBLEM)

    deciding = admission(store)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="admission",
        topics=[topics.jobs],
        handlers={"JobSubmitted": deciding.on_submitted},
    )
    async with running(OutboxRelay(store, settings)), running(consumer) as task:
        await started(consumer, task)
        accepted = await api.client.post(
            "/v1/jobs", content=_job_body("nlp", limit), headers=headers
        )
        assert accepted.status_code == 201, accepted.text[:500]
        job_id = accepted.json()["id"]

        async def admitted() -> bool:
            stream = await store.read_stream(f"job-{job_id}")
            return any(isinstance(e.payload, JobAdmitted) for e in stream)

        await wait_until(admitted, what="the largest job admitted through the bus")
    [submitted] = [e for e in await store.read_stream(f"job-{job_id}") if e.type == "JobSubmitted"]
    assert isinstance(submitted.payload, JobSubmitted)
    assert len(submitted.payload.spec.env["PAD"]) > limit - 300


async def test_an_event_over_the_logs_bound_is_not_appended(store: EventStore) -> None:
    spec = JobSpec(
        name="huge", team="nlp", tasks=1, gpus_per_task=1, env={"P": "x" * MAX_EVENT_BYTES}
    )
    with pytest.raises(EventTooLarge):
        await store.append(
            "job-huge", 0, [JobSubmitted(job_id="huge", spec=spec, submitted_by="t")]
        )
    assert await store.head() == 0


async def _shrink_topic(settings: Settings, topic: str, max_bytes: int) -> None:
    """Make the broker refuse the topic's records over `max_bytes` (a bus that was configured
    by someone else, or a bug: what the relay must survive)."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic)
    admin = make_admin(settings)
    await admin.start()
    try:

        async def shrunk() -> bool:
            # A topic created a moment ago may not take a new configuration yet: ask again.
            await admin.alter_configs(
                [
                    ConfigResource(
                        resource.resource_type, topic, {"max.message.bytes": str(max_bytes)}
                    )
                ]
            )
            [described] = await admin.describe_configs([resource])
            entries = described.resources[0][4]
            return any(e[0] == "max.message.bytes" and e[1] == str(max_bytes) for e in entries)

        await wait_until(shrunk, what=f"{topic} takes max.message.bytes={max_bytes}")
    finally:
        await admin.close()


async def test_an_event_the_bus_refuses_is_dead_lettered_and_later_jobs_are_still_admitted(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    await register_nodes(store)
    await create_team(store)
    await ensure_topics(settings, topics)
    await _shrink_topic(settings, topics.jobs, 4096)

    async def submit(job_id: str, pad: int) -> int:
        spec = JobSpec(name=job_id, team="vision", tasks=1, gpus_per_task=1, env={"P": "x" * pad})
        [envelope] = await store.append(
            f"job-{job_id}", 0, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="tests")]
        )
        return envelope.position or 0

    refused = await submit("refused", 16_384)
    later = [f"later{i}" for i in range(3)]
    for job_id in later:
        await submit(job_id, 10)

    deciding = admission(store)
    consumer = EventConsumer(
        settings,
        store.pool,
        name="admission",
        topics=[topics.jobs],
        handlers={"JobSubmitted": deciding.on_submitted},
    )
    relay = OutboxRelay(store, settings)
    async with running(relay), running(consumer) as task:
        await started(consumer, task)

        async def later_ones_admitted() -> bool:
            streams = await asyncio.gather(*(store.read_stream(f"job-{j}") for j in later))
            return all(any(e.type == "JobAdmitted" for e in s) for s in streams)

        await wait_until(later_ones_admitted, what="the jobs after the refused one admitted")
        ready, detail = relay.readiness()

    [note] = await read_topics(settings, [topics.deadletter], 1)
    assert header(note, "deadletter.position") == str(refused)
    assert "TooLarge" in (header(note, "deadletter.reason") or "")
    assert json.loads(note.value)["position"] == refused
    async with store.pool.acquire() as c:
        rows = await c.fetch("SELECT position, type FROM relay_dead_letters")
    assert [(r["position"], r["type"]) for r in rows] == [(refused, "JobSubmitted")]
    assert relay.dead_letters == 1 and detail["dead_letters"] == 1
    metrics = relay.registry.get_sample_value("gangway_relay_dead_letters_total")
    assert metrics == 1.0
    assert ready  # the relay went on: it is not behind
    refused_stream = await store.read_stream("job-refused")
    assert [e.type for e in refused_stream] == ["JobSubmitted"]  # in the log, never decided
