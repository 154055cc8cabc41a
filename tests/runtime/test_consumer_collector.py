"""A consumer's fetched batch is processed with the young collections deferred to its end
(runtime/collector.py `collection_deferred`): a batch keeps its records and envelopes alive
until it ends, and the young collections inside it scanned them for nothing (admission's
collector was a tenth of its CPU in a burst of batch submissions)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import TopicPartition

from services.runtime import Settings
from services.runtime.collector import DEFERRED_YOUNG_THRESHOLD
from services.runtime.consumer import ConsumerLoop, Outcome

PARTITION = TopicPartition("gangway.jobs", 0)


class Record:
    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.topic, self.partition = PARTITION.topic, PARTITION.partition
        self.headers: list[tuple[str, bytes]] = []
        self.value = b"{}"


class Consumer:
    """One fetched batch of three records, then nothing; the stop set on the second fetch."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stopping = stop
        self.fetches = 0
        self.thresholds_at_fetch: list[int] = []

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Record]]:
        self.fetches += 1
        self.thresholds_at_fetch.append(gc.get_threshold()[0])
        if self.fetches == 1:
            return {PARTITION: [Record(0), Record(1), Record(2)]}
        self.stopping.set()
        return {}

    def assignment(self) -> set[TopicPartition]:
        return {PARTITION}

    def highwater(self, tp: TopicPartition) -> int:
        return 3

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        pass

    async def stop(self) -> None:
        pass


class Producer:
    async def stop(self) -> None:
        pass


class Loop(ConsumerLoop):
    def __init__(self, consumer: Consumer) -> None:
        super().__init__(Settings(_env_file=None), name="admission", topics=["gangway.jobs"])
        self.consumer = consumer
        self.thresholds: list[int] = []

    async def _connect(self, stop: asyncio.Event) -> Any:
        return self.consumer, Producer()

    async def process(self, record: Any) -> Outcome:
        self.thresholds.append(gc.get_threshold()[0])
        await asyncio.sleep(0)
        return Outcome.APPLIED


@pytest.fixture
def young_at_700() -> Iterator[None]:
    threshold = gc.get_threshold()
    gc.set_threshold(700, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("young_at_700")
async def test_a_batch_is_processed_with_young_collections_deferred_and_the_fetch_without() -> None:
    stop = asyncio.Event()
    loop = Loop(Consumer(stop))
    await loop.run(stop)
    assert loop.thresholds == [DEFERRED_YOUNG_THRESHOLD] * 3
    # The wait for the next batch is not deferred (the process's other tasks run meanwhile).
    assert loop.consumer.thresholds_at_fetch == [700, 700]
    assert gc.get_threshold()[0] == 700
    assert loop.counts[Outcome.APPLIED] == 3
