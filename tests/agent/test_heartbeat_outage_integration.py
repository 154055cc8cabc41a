"""An agent started while the broker is away says so once, not a traceback every round."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

import services.agent.agent as agent_module
from services.runtime import EventStore, Settings
from tests.agent.test_agent_integration import make_agent
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]


async def test_heartbeat_rounds_without_a_broker_log_one_outage_not_a_traceback_each(
    settings: Settings,
    store: EventStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """attack12: an agent restarted while Kafka was stopped logged `heartbeat round failed`
    with a 15-line KafkaConnectionError traceback every second (31 in 30 s), where every
    other service logs an outage once, a summary now and then, and its end."""
    stop = asyncio.Event()
    tries: list[None] = []

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        tries.append(None)
        if len(tries) >= 5:
            stop.set()
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    monkeypatch.setattr(agent_module, "start_producer", unreachable)
    agent = make_agent(settings, store, tmp_path, heartbeat_interval_s=0.05)
    try:
        with caplog.at_level(logging.INFO, logger="services.agent"):
            await asyncio.wait_for(agent.heartbeat_loop(stop), 120)
    finally:
        await agent.shutdown()
    ours = [r for r in caplog.records if r.name.startswith("services.agent")]
    assert len(tries) >= 5
    assert [r for r in ours if r.exc_info] == []
    assert len([r for r in ours if "lost" in r.getMessage()]) == 1
