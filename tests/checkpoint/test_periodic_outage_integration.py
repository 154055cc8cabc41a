"""A periodic checkpoint that falls due while the event log is away is requested once the log
is back, not one interval later.

Found by an operator's run (PostgreSQL stopped for 20 s under a stream of submissions,
2026-11-25): the checkpoint service's round took the due gangs off the schedule (`due` moved
each one interval on) before it appended their requests; the append failed, the requests were
dropped, and each gang went a whole interval more (60 s at the least) without a checkpoint,
while the service logged a traceback for it. The log goes away here for real: the service's
pool reaches PostgreSQL through a TCP proxy the test cuts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.checkpoints import CheckpointRequested
from services.checkpoint.service import CheckpointService
from services.checkpoint.settings import CheckpointSettings
from services.runtime import EventStore, Settings
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.store import create_pool
from tests.agent.test_agent_integration import until
from tests.integration.conftest import proxy, settings, stack, store
from tests.integration.proxy import TcpProxy

pytestmark = pytest.mark.integration
__all__ = ["proxy", "settings", "stack", "store"]

JOB = "periodic-outage"
INTERVAL_S = 600.0  # far longer than the test: a request after the outage is the missed one


@pytest.fixture
async def service(
    settings: Settings, proxy: tuple[TcpProxy, str], tmp_path: Path
) -> AsyncIterator[CheckpointService]:
    """The checkpoint service, its every connection to the log through the proxy, with one
    gang whose periodic checkpoint is due now."""
    through = EventStore(
        await create_pool(settings, proxy[1]), producer="checkpoint", owns_pool=True
    )
    checkpoints = CheckpointService(
        CheckpointSettings(
            **{
                **settings.model_dump(),
                "checkpoint_root": tmp_path,
                "checkpoint_min_interval_s": 0.0,
            },
            _env_file=None,
        ),
        through,
    )
    checkpoints.periodic.started(JOB, 1, INTERVAL_S, time.monotonic() - INTERVAL_S)
    yield checkpoints
    await proxy[0].restore()  # a pool closes cleanly only over a live connection
    await through.close()


async def requests_in_log(store: EventStore) -> list[CheckpointRequested]:
    return [
        e.payload
        for e in await store.read_stream(f"checkpoint-{JOB}")
        if isinstance(e.payload, CheckpointRequested)
    ]


async def test_a_request_due_while_the_log_is_away_is_made_once_it_is_back(
    service: CheckpointService, store: EventStore, proxy: tuple[TcpProxy, str]
) -> None:
    await proxy[0].cut()
    with pytest.raises(DATABASE_UNAVAILABLE):
        await service.request_due()
    await proxy[0].restore()

    made = await service.request_due()

    assert [(r.job_id, r.attempt, r.reason) for r in made] == [(JOB, 1, "periodic")]
    assert len(await requests_in_log(store)) == 1
    assert await service.request_due() == []  # then one interval on, as before


async def test_the_periodic_loop_rides_out_the_outage_in_one_line_and_then_asks(
    service: CheckpointService,
    store: EventStore,
    proxy: tuple[TcpProxy, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="services.checkpoint.service")
    await proxy[0].cut()
    stop = asyncio.Event()
    loop = asyncio.create_task(service.request_forever(stop))
    try:

        async def lost() -> bool:
            return "the event log lost" in caplog.text

        await until(lost, "the periodic round noticed the log was away")
        await proxy[0].restore()

        async def asked() -> bool:
            return len(await requests_in_log(store)) == 1

        await until(asked, "the missed periodic request was made")
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    own = [r for r in caplog.records if r.name == "services.checkpoint.service"]
    assert not [r for r in own if r.exc_info or r.levelno >= logging.ERROR]
    assert "recovered" in caplog.text
