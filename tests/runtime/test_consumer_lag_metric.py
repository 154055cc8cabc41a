"""`gangway_consumer_lag_messages{service, consumer}`: every consuming service reports how far
its consumer trails the bus under one name, served on its metrics endpoint."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas import EventEnvelope
from services.runtime import EventConsumer, EventStore, OutboxRelay, Settings, Topics
from services.runtime.metrics import ConsumerLag, new_registry, start_metrics_server
from tests.integration.conftest import settings, stack, store, topics  # noqa: F401
from tests.integration.support import deferrals, running, started, wait_until


def lag_samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["service"], sample.labels["consumer"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gangway_consumer_lag_messages"
        for sample in family.samples
    }


def test_each_source_is_one_series_labelled_by_service_and_what_it_consumes() -> None:
    registry = new_registry()
    lag = ConsumerLag("scheduler", registry)
    behind = [7.0]
    lag.watch("events", lambda: behind[0])
    assert (
        registry.get_sample_value(
            "gangway_consumer_lag_messages", {"service": "scheduler", "consumer": "events"}
        )
        == 7.0
    )
    behind[0] = 0.0
    assert (
        registry.get_sample_value(
            "gangway_consumer_lag_messages", {"service": "scheduler", "consumer": "events"}
        )
        == 0.0
    )


def test_a_finished_consumer_loop_is_not_kept_alive_and_drops_out() -> None:
    class Loop:
        lag = 3

    registry = new_registry()
    lag = ConsumerLag("health", registry)
    loop = Loop()
    lag.watch("telemetry", loop)
    assert lag.lags() == {"telemetry": 3.0}
    del loop
    assert lag.lags() == {}


@pytest.mark.integration
async def test_a_consumer_that_trails_the_bus_shows_its_lag_until_it_catches_up(
    settings: Settings,  # noqa: F811
    store: EventStore,  # noqa: F811
    topics: Topics,  # noqa: F811
) -> None:
    one_at_a_time = settings.model_copy(update={"consumer_max_batch": 1})
    release = asyncio.Event()

    async def slow(envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        await release.wait()

    consumer = EventConsumer(
        one_at_a_time, store.pool, name="slow", topics=[topics.jobs], handlers={"JobDeferred": slow}
    )
    registry = new_registry()
    ConsumerLag("admission", registry).watch("events", consumer)
    server = start_metrics_server(0, registry, addr="127.0.0.1", fallback=False)
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        async with (
            httpx.AsyncClient() as client,
            running(OutboxRelay(store, settings)),
            running(consumer) as task,
        ):
            await started(consumer, task)
            await store.append("job-a", 0, deferrals("a", 20))

            async def lag() -> float:
                samples = lag_samples((await client.get(url)).text)
                return samples.get(("admission", "events"), -1.0)

            async def trails() -> bool:
                return await lag() > 0

            await wait_until(trails, what="the scrape shows the admission consumer's lag")
            release.set()

            async def caught_up() -> bool:
                return await lag() == 0

            await wait_until(caught_up, what="the lag back at 0 once caught up")
    finally:
        release.set()
        server.stop()
