"""`python -m services.health`: telemetry → NodeDegraded, GpuUnhealthy, NodeDrainRequested …"""

from __future__ import annotations

import asyncio
import logging

from services.health.bootstrap import run
from services.health.settings import HealthSettings
from services.runtime.signals import stop_on_signals


async def main() -> None:
    await run(HealthSettings(), stop_on_signals())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main())
