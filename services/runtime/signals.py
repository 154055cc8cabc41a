"""Graceful shutdown: SIGTERM and SIGINT set a stop event that every loop watches."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """Return an event set by SIGTERM or SIGINT (call from inside the running loop)."""
    event = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event


async def sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if `stop` is set; return whether it is set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
