"""A live rank tries to speak for the log: nothing acts on it.

A real agent launches a job whose rank, a Python program, tries what a hostile tenant's code
would: produce a well-formed JobSucceeded for its own job onto the jobs topic and an XID-79
heartbeat of its node onto the telemetry topic (with no credentials, and with guessed ones),
and append a JobSucceeded to the log through PostgreSQL as the application role (with the
password a tenant could guess). It writes what it could do into its log and stays running.
Meanwhile the agent's own consumer and the health monitor read those topics.

The rank must still run afterwards, and neither the log nor the node's health show anything of
it. On scripts/stack.sh's broker, which authenticates, the productions must be refused outright;
on a broker without authentication (one given from outside) they land, and the signatures are
what stops them: the test says which held.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from aiokafka import TopicPartition

from schemas.jobs import GangReserved, JobSpec, JobSubmitted, RankPlacement
from services.agent import isolation
from services.agent.agent import Agent
from services.agent.settings import AgentSettings
from services.health.service import HealthService
from services.health.settings import HealthSettings
from services.runtime import EventStore, Settings, Topics
from services.runtime.bus_acl import password_variable
from services.runtime.consumer import TelemetryConsumer
from services.runtime.discovery import load_cluster_spec
from services.runtime.kafka import make_consumer
from services.runtime.topics import ensure_topics
from tests.integration.conftest import Stack
from tests.integration.support import read_topics, running, wait_until

pytestmark = pytest.mark.integration

NODES = load_cluster_spec("2x8")

# The rank's program. Each line of its log: "<attempt> ALLOWED|refused|untestable <detail>".
RANK = r"""
import asyncio, json, os, sys, time, uuid
from datetime import datetime, timezone

job, node = os.environ["GANGWAY_JOB_ID"], os.environ["GANGWAY_NODE_ID"]

def say(name, result, detail=""):
    print(name, result, str(detail).replace("\n", " ")[:200], flush=True)

def success(position):
    head = {"event_id": str(uuid.uuid4()), "stream": f"job-{job}", "version": 3,
            "position": position, "type": "JobSucceeded", "schema_version": 1,
            "recorded_at": datetime.now(timezone.utc).isoformat(), "correlation_id": None,
            "causation_id": None, "producer": "agent", "epoch": None}
    return json.dumps({**head, "payload": {"job_id": job, "attempt": 1}}).encode(), head

def heartbeat():
    return json.dumps({"kind": "heartbeat", "node_id": node,
                       "at": datetime.now(timezone.utc).isoformat(),
                       "gpus": [{"index": 0, "xid_errors": [79]}]}).encode()

async def produce(name, topic, value, headers, **auth):
    from aiokafka import AIOKafkaProducer
    producer = AIOKafkaProducer(bootstrap_servers=os.environ["BOOTSTRAP"],
                                request_timeout_ms=5000, **auth)
    try:
        await asyncio.wait_for(producer.start(), 20)
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=node.encode(),
                                                      headers=headers), 20)
        say(name, "ALLOWED")
    except Exception as error:
        say(name, "refused", repr(error))
    finally:
        try:
            await asyncio.wait_for(producer.stop(), 10)
        except Exception:
            pass

async def append_to_log():
    import asyncpg
    try:
        conn = await asyncio.wait_for(asyncpg.connect(os.environ["APP_DSN"]), 20)
    except Exception as error:
        say("pg-append", "refused", repr(error))
        return
    try:
        value, head = success(1)
        await conn.execute(
            "INSERT INTO events (stream_id, stream_version, event_id, event_type, payload) "
            "VALUES ($1, 3, $2, 'JobSucceeded', $3::jsonb)",
            f"job-{job}", uuid.UUID(head["event_id"]), json.dumps({"job_id": job, "attempt": 1}))
        say("pg-append", "ALLOWED")
    except Exception as error:
        say("pg-append", "refused", repr(error))
    finally:
        await conn.close()

async def main():
    try:
        import aiokafka  # noqa: F401
    except Exception as error:
        for name in ("kafka-jobs", "kafka-jobs-guessed", "kafka-telemetry"):
            say(name, "untestable", repr(error))
    else:
        value, head = success(10**6)
        headers = [("type", b"JobSucceeded"), ("position", str(head["position"]).encode()),
                   ("event_id", head["event_id"].encode())]
        await produce("kafka-jobs", os.environ["TOPIC_JOBS"], value, headers)
        await produce("kafka-jobs-guessed", os.environ["TOPIC_JOBS"], value, headers,
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                      sasl_plain_username="gangway_relay", sasl_plain_password="gangway_relay")
        await produce("kafka-telemetry", os.environ["TOPIC_TELEMETRY"], heartbeat(), [])
    try:
        import asyncpg  # noqa: F401
    except Exception as error:
        say("pg-append", "untestable", repr(error))
    else:
        await append_to_log()

asyncio.run(main())
print("probe-done", flush=True)
time.sleep(600)
"""


def _guessed(dsn: str) -> str:
    """The application role's DSN as a tenant could guess it: the address, the role's name and
    the password this repository used to hard-code (the real one is random)."""
    parts = urlsplit(dsn)
    netloc = f"{parts.username}:{parts.username}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
async def agent(settings: Settings, store: EventStore, tmp_path: Path) -> AsyncIterator[Agent]:
    """The agent as `make up` runs it: its ranks sandboxed where bubblewrap works."""
    state = tmp_path / ".gangway"
    (state / "faults").mkdir(parents=True)
    agent_settings = AgentSettings(
        **{
            **settings.model_dump(),
            "work_dir": state / "agent",
            "checkpoint_root": state / "checkpoints",
            "fault_dir": state / "faults",
            "stop_timeout_s": 2.0,
            "rank_sandbox": "bwrap" if isolation.bwrap_works() else "none",
        },
        _env_file=None,
    )
    started = Agent(agent_settings, store, NODES)
    yield started
    await started.shutdown()


async def _records(settings: Settings, topic: str) -> int:
    consumer = make_consumer(settings, group_id=f"{settings.topic_prefix}.count")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.topic_partitions)]
        return sum((await consumer.end_offsets(partitions)).values())
    finally:
        await consumer.stop()


async def test_a_live_rank_cannot_forge_its_success_nor_a_heartbeat_nor_a_log_entry(
    agent: Agent, store: EventStore, settings: Settings, topics: Topics, stack: Stack
) -> None:
    await ensure_topics(settings)
    authenticating = password_variable("relay") in stack.kafka_auth
    health = HealthService(HealthSettings(**settings.model_dump(), _env_file=None), store)

    spec = JobSpec(
        name="forger",
        team="ml",
        tasks=1,
        gpus_per_task=8,
        command=[sys.executable, "-c", RANK],
        env={
            "BOOTSTRAP": settings.kafka_bootstrap,
            "TOPIC_JOBS": topics.jobs,
            "TOPIC_TELEMETRY": topics.telemetry,
            "APP_DSN": _guessed(settings.pg_dsn),
        },
    )
    await store.append(
        "job-forger", 0, [JobSubmitted(job_id="forger", spec=spec, submitted_by="t")]
    )
    [reserved] = await store.append(
        "job-forger",
        1,
        [
            GangReserved(
                job_id="forger",
                attempt=1,
                ranks=[RankPlacement(rank=0, node_id="n0000", gpus=list(range(8)))],
            )
        ],
    )

    async with (
        running(agent.consumer()),
        running(TelemetryConsumer(settings, name="health", handler=health.on_telemetry)),
    ):
        async with store.pool.acquire() as conn:
            await agent.handlers()["GangReserved"](reserved, conn)
        await agent.launches_done()
        [rank] = [r for r in agent.ranks.values() if r.key.job_id == "forger"]
        log_file = rank.workdir / "rank.log"

        async def probe_done() -> bool:
            return log_file.exists() and "probe-done" in log_file.read_text()

        await wait_until(probe_done, what="the rank tried every forgery")
        log = log_file.read_text()
        outcome = {
            line.split(" ")[0]: line.split(" ")[1]
            for line in log.splitlines()
            if len(line.split(" ")) > 1
            and line.split(" ")[1] in ("ALLOWED", "refused", "untestable")
        }
        print(f"rank uid {os.stat(rank.workdir).st_uid}; outcomes {outcome}")
        untestable = sorted(name for name, result in outcome.items() if result == "untestable")
        if untestable:
            print(
                f"could not be tried from the rank (its interpreter lacks a client): {untestable}"
            )
        landed = sorted(
            name
            for name, result in outcome.items()
            if name.startswith("kafka-") and result == "ALLOWED"
        )
        if authenticating:
            # The broker itself refuses: nothing of the rank's is on any topic.
            assert landed == [], f"the broker took the rank's records: {landed}\n{log}"
            assert await _records(settings, topics.jobs) == 0
            assert await _records(settings, topics.telemetry) == 0
        else:
            print(
                f"the broker at {settings.kafka_bootstrap} does not authenticate: the rank's "
                f"records {landed} landed; the signatures must stop them"
            )
            # Every record that landed is read and refused by its consumer.
            await read_topics(settings, [topics.deadletter], len(landed))
        assert outcome.get("pg-append") in ("refused", "untestable"), log

        # Nothing acted: the rank still runs, its job has no success, its node no failure.
        assert rank.running
        os.kill(rank.pid, 0)
    types = [e.type for e in await store.read_stream("job-forger")]
    assert types == ["JobSubmitted", "GangReserved", "TaskStarted"], types
    assert [e.type for e in await store.read_stream("node-n0000")] == []
