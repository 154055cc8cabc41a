"""The read models fed from the bus: the relay publishes the log, the API's consumer applies it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from aiokafka import ConsumerRecord

from schemas.jobs import JobAdmitted
from services.api.app import create_app
from services.api.bus import ReadModelConsumer
from services.api.feed import ReadModelFeed
from services.api.projections.model import ReadModels
from services.runtime import EventStore, OutboxRelay, Settings
from services.runtime.consumer import Outcome, Unprocessable
from services.runtime.records import RawEvent, StreamAppend
from tests.api.conftest import ADMIN_TOKEN, api_settings
from tests.integration.support import running

pytestmark = pytest.mark.integration


async def test_events_of_other_services_reach_the_read_models_through_the_bus(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    # The log poll runs once at start and then not for an hour: only the bus can deliver.
    configured = api_settings(settings, tmp_path, catch_up_interval_s=3600)
    app = create_app(configured, use_bus=True)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        running(OutboxRelay(store, settings)),
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        team = await client.post("/v1/teams", json={"name": "nlp"}, headers=headers)
        assert team.status_code == 201, team.text
        created = await client.post(
            "/v1/jobs", json={"name": "train", "team": "nlp"}, headers=headers
        )
        job_id = created.json()["id"]
        await store.append(
            f"job-{job_id}", 1, [JobAdmitted(job_id=job_id, queue="nlp", priority="research")]
        )
        # Read from the models, not through a GET: a read catches up with the log's head
        # itself (read-your-writes across workers), which would prove nothing of the bus.
        models = (await app.state.bootstrap.context()).models
        async with asyncio.timeout(60):
            while True:
                if models.jobs[job_id].state == "queued":
                    break
                await asyncio.sleep(0.1)


def record(position: int, value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="t.jobs",
        partition=0,
        offset=position,
        timestamp=0,
        timestamp_type=0,
        key=b"job-x",
        value=value,
        checksum=None,
        serialized_key_size=5,
        serialized_value_size=len(value),
        headers=[("position", str(position).encode())],
    )


async def test_the_bus_leaves_events_the_models_hold_undecoded(
    settings: Settings, store: EventStore
) -> None:
    feed = ReadModelFeed(store, ReadModels())
    for position in (1, 2, 4):
        feed.models.watermark.mark(position)
    consumer = ReadModelConsumer(settings, feed, group="g")
    # Applied already (its own append, or the log poll first): not even parsed.
    for position in (1, 2, 4):
        assert await consumer.process(record(position, b"not json")) is Outcome.DUPLICATE
    # Not applied yet: parsed, and this one is refused as undecodable (a dead letter).
    with pytest.raises(Unprocessable):
        await consumer.process(record(3, b"not json"))


async def test_reads_that_arrive_while_a_worker_lags_read_the_log_once(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read waits for its worker's fold to reach the log's head; twenty reads arriving
    while it lags a thousand events behind must not each read those thousand events."""
    feed = ReadModelFeed(store, ReadModels())
    await store.append_many(
        [
            StreamAppend(
                f"job-j{index}",
                0,
                [JobAdmitted(job_id=f"j{index}", queue="q", priority="research")],
            )
            for index in range(1000)
        ]
    )
    reads = 0
    read_all_raw = store.read_all_raw

    async def counted(after: int, limit: int) -> list[RawEvent]:
        nonlocal reads
        reads += 1
        return await read_all_raw(after, limit)

    monkeypatch.setattr(store, "read_all_raw", counted)
    applied = await asyncio.gather(*(feed.reach_head() for _ in range(20)))
    assert sum(applied) == 1000
    assert reads == 1
    assert feed.models.watermark.position == await store.head()


async def test_reads_that_arrive_together_share_one_look_at_the_log_head(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood of reads on one worker asks the log for its head once per round trip, not once
    per read: fifty reads arriving together cost the look under way and one after it."""
    feed = ReadModelFeed(store, ReadModels())
    looks = 0
    head = store.head

    async def counted() -> int:
        nonlocal looks
        looks += 1
        return await head()

    monkeypatch.setattr(store, "head", counted)
    await asyncio.gather(*(feed.reach_head() for _ in range(50)))
    assert looks == 2


async def test_a_read_arriving_during_a_look_at_the_head_waits_for_a_look_after_it(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look begun before a write cannot answer a read made after the write was acknowledged:
    the read waits for the next look, and sees the write."""
    feed = ReadModelFeed(store, ReadModels())
    head = store.head
    stale_asked = asyncio.Event()
    release_stale = asyncio.Event()
    looks = 0

    async def slow_first_look() -> int:
        nonlocal looks
        looks += 1
        answer = await head()
        if looks == 1:  # read before the write below; answered after it
            stale_asked.set()
            await release_stale.wait()
        return answer

    monkeypatch.setattr(store, "head", slow_first_look)
    early = asyncio.create_task(feed.reach_head())
    await stale_asked.wait()
    written = await store.append(
        "job-late", 0, [JobAdmitted(job_id="late", queue="q", priority="research")]
    )
    late = asyncio.create_task(feed.reach_head())
    await asyncio.sleep(0)
    release_stale.set()
    await asyncio.gather(early, late)
    position = written[-1].position
    assert position is not None
    assert feed.models.watermark.covers(position)
    assert looks == 2
