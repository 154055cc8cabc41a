"""A team secret end to end, with the services as processes: set through the API, it reaches
the rank's environment, and appears in no event, no Kafka record and no file the system
writes; once the team's key is deleted, the log still replays and the secret is lost."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.jobs import JobSpec
from schemas.teams import TeamSecretSet
from services.agent.secrets import SecretUnavailable, resolve_secret_env
from services.runtime import Settings
from services.runtime.kafka import connection_options, make_admin
from services.runtime.vault import key_by_id
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

SECRET = "hf_e2e-7b1d4c93a0f2-never-written-down"
SECRET_SHA256 = hashlib.sha256(SECRET.encode()).hexdigest()


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("secrets-e2e")
    async with running_system(stack, state_dir, cluster="2x8", scheduler_replicas=1) as running:
        yield running


async def kafka_bytes(settings: Settings) -> list[bytes]:
    """Every record's key, value and headers on every topic of this system, from the start."""
    admin = make_admin(settings)
    await admin.start()
    try:
        ours = [t for t in await admin.list_topics() if t.startswith(f"{settings.topic_prefix}.")]
        described = await admin.describe_topics(ours)
    finally:
        await admin.close()
    partitions = [
        TopicPartition(topic["topic"], partition["partition"])
        for topic in described
        for partition in topic["partitions"]
    ]
    consumer = AIOKafkaConsumer(**connection_options(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: list[bytes] = []
        remaining = {tp for tp in partitions if ends[tp] > 0}
        while remaining:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                for record in records:
                    found += [record.key or b"", record.value or b""]
                    found += [value for _, value in record.headers or ()]
                    if record.offset + 1 >= ends[tp]:
                        remaining.discard(tp)
        return found
    finally:
        await consumer.stop()


def files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def test_a_secret_reaches_the_rank_and_nothing_else_then_is_forgotten(
    system: System, tmp_path_factory: pytest.TempPathFactory
) -> None:
    async with system.client() as admin:
        team = await admin.post("/v1/teams", json={"name": "ml", "guaranteed_gpus": 16})
        assert team.status_code == 201, team.text
        ml_token = team.json()["token"]
    async with system.client(ml_token) as ml:
        put = await ml.put("/v1/teams/ml/secrets/hf", json={"value": SECRET})
        assert put.status_code == 200, put.text
        # The rank proves it saw the value by its hash, so that its log holds no secret.
        job = {
            "name": "uses-a-secret",
            "team": "ml",
            "tasks": 1,
            "gpus_per_task": 1,
            "command": ["sh", "-c", 'printf %s "$HF_TOKEN" | sha256sum'],
            "secret_env": {"HF_TOKEN": "hf"},
        }
        submitted = await ml.post("/v1/jobs", json=job)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]

        async def finished() -> str | None:
            state = (await ml.get(f"/v1/jobs/{job_id}")).json()["state"]
            return state if state in ("succeeded", "failed") else None

        assert await eventually(finished, what="the job finished") == "succeeded"

    state_dir = system.launcher.logs_dir.parent
    # The rank's environment held the value: its log holds the value's hash.
    assert files_holding(state_dir / "agent" / job_id, SECRET_SHA256.encode())
    # ... and nothing anywhere holds the value itself: no log, no event, no Kafka record.
    assert files_holding(state_dir, SECRET.encode()) == []
    raw = [r for batch in [b async for b in system.store.iter_raw()] for r in batch]
    assert not any(SECRET in r.payload for r in raw)
    records = await kafka_bytes(system.settings)
    assert records and not any(SECRET.encode() in record for record in records)

    async with system.client() as admin:
        assert (await admin.delete("/v1/teams/ml/key")).status_code == 204
    # The log replays whole, and the auditor finds it sound ...
    violations, _ = await system.audit()
    assert violations == []
    sealed = [e.payload async for e in system.store.replay() if e.type == "TeamSecretSet"]
    assert [s.name for s in sealed if isinstance(s, TeamSecretSet)] == ["hf"]
    # ... but what it sealed cannot be opened any more: the key is gone.
    assert isinstance(sealed[0], TeamSecretSet)
    assert await key_by_id(system.store.pool, sealed[0].key_id) is None
    spec = JobSpec.model_validate({**job, "command": ["true"]})
    with pytest.raises(SecretUnavailable):
        await resolve_secret_env(system.store, spec)
