"""/readyz of every service turns not-ready while its consumer trails the bus past the
threshold, and ready again once it has caught up (and the relay's, likewise, for the log)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import httpx
import pytest

from schemas import EventEnvelope
from services.api.app import create_app
from services.runtime import EventConsumer, EventStore, OutboxRelay, Settings, Topics
from services.runtime.metrics import new_registry, start_metrics_server
from tests.api.conftest import api_settings
from tests.integration.support import deferrals, running, started, wait_until

pytestmark = pytest.mark.integration


async def test_readyz_is_503_while_the_consumer_lags_past_the_threshold_and_200_after(
    settings: Settings, store: EventStore, topics: Topics
) -> None:
    lagging = settings.model_copy(update={"ready_max_lag_events": 5, "consumer_max_batch": 1})
    release = asyncio.Event()

    async def slow(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        await release.wait()

    consumer = EventConsumer(
        lagging, store.pool, name="slow", topics=[topics.jobs], handlers={"JobDeferred": slow}
    )
    server = start_metrics_server(0, new_registry(), addr="127.0.0.1", fallback=False)
    url = f"http://127.0.0.1:{server.port}/readyz"
    try:
        async with (
            httpx.AsyncClient() as client,
            running(OutboxRelay(store, settings)),
            running(consumer) as task,
        ):
            await started(consumer, task)
            assert (await client.get(url)).status_code == 200
            await store.append("job-a", 0, deferrals("a", 30))

            async def not_ready() -> bool:
                response = await client.get(url)
                return response.status_code == 503 and "slow" in response.json()["detail"]["behind"]

            await wait_until(not_ready, what="/readyz says the consumer lags")
            release.set()

            async def ready() -> bool:
                return (await client.get(url)).status_code == 200

            await wait_until(ready, what="/readyz ready again once caught up")
    finally:
        release.set()
        server.stop()


async def test_the_api_is_not_ready_while_the_relay_trails_the_log(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    configured = api_settings(settings, tmp_path, ready_max_lag_events=3)
    app = create_app(configured, use_bus=False)
    await store.append("job-a", 0, deferrals("a", 10))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gangway.test"
        ) as client,
    ):
        behind = await client.get("/readyz")
        assert behind.status_code == 503
        assert "relay trails the log by 10 events" in behind.text
        async with running(OutboxRelay(store, settings)):

            async def ready() -> bool:
                return (await client.get("/readyz")).status_code == 200

            await wait_until(ready, what="the API ready once the relay caught up")
        relay = (await client.get("/readyz")).json()["detail"]["relay"]
    assert relay == {"position": 10, "lag": 0, "dead_letters": 0}
