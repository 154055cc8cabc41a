"""The agent's heartbeats outlive a producer the broker no longer accepts."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import OutOfOrderSequenceNumber

import services.agent.agent as agent_module
from services.agent.agent import Agent
from services.runtime import EventStore, Settings
from services.runtime.kafka import make_producer
from tests.agent.test_agent_integration import make_agent, until
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]


class BrokenSequence:
    """An idempotent producer as aiokafka leaves it when a restarted broker lost the tail of
    its log: the broker refuses each later batch of its partitions (OutOfOrderSequenceNumber)
    and aiokafka never resets the sequence, so every send fails from then on."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        refused.set_exception(OutOfOrderSequenceNumber())
        return refused


def sent(agent: Agent) -> float:
    return float(agent.heartbeats_sent._value.get())


async def test_heartbeats_reach_the_bus_again_after_a_producer_the_broker_refuses(
    settings: Settings, store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After two broker restarts under load, five of sixteen nodes' heartbeats were refused
    round after round (OutOfOrderSequenceNumber) by the agent's one producer: the inventory
    declared them lost, the scheduler requeued their gangs, and they stayed lost until the
    agent was restarted by hand."""
    made: list[object] = []

    def producer(*args: Any, **kwargs: Any) -> AIOKafkaProducer | BrokenSequence:
        """The agent's first producer is the broken one; any later one is real."""
        made.append(None)
        return BrokenSequence() if len(made) == 1 else make_producer(*args, **kwargs)

    monkeypatch.setattr(agent_module, "make_producer", producer)
    agent = make_agent(settings, store, tmp_path)
    stop = asyncio.Event()
    loop = asyncio.create_task(agent.heartbeat_loop(stop))

    async def delivered() -> bool:
        return sent(agent) > 0

    try:
        await until(delivered, "a heartbeat reaching the bus after the refused round")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(loop, 10)
        await agent.shutdown()
    assert sent(agent) >= len(agent.nodes)
