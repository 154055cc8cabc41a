"""The relay's producer: one whose start fails is stopped, not left behind (services/runtime/
kafka.py start_producer, as the consumers' dead letters and the agent's heartbeats do)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from services.runtime import OutboxRelay, Settings, relay


class Producer:
    """A producer whose start fails (the broker away)."""

    def __init__(self) -> None:
        self.stopped = False

    async def start(self) -> None:
        raise KafkaConnectionError("Unable to bootstrap from [('localhost', 9092)]")

    async def stop(self) -> None:
        self.stopped = True


def test_a_producer_whose_start_failed_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the broker away the relay retries a start per round; each failed producer was left
    unstopped (aiokafka then reports every one, 'Unclosed AIOKafkaProducer', when collected)."""
    made: list[Producer] = []

    def make_producer(*args: Any, **kwargs: Any) -> Producer:
        made.append(Producer())
        return made[-1]

    monkeypatch.setattr(relay, "make_producer", make_producer)
    outbox = OutboxRelay(None, Settings(_env_file=None))  # type: ignore[arg-type]

    async def start_twice() -> None:
        for _ in range(2):
            with pytest.raises(KafkaConnectionError):
                await outbox._ensure_producer()

    asyncio.run(start_twice())
    assert [producer.stopped for producer in made] == [True, True]
