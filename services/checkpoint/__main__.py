"""`python -m services.checkpoint`: verify and commit sharded checkpoints."""

from __future__ import annotations

import asyncio
import logging

from services.checkpoint.bootstrap import run
from services.checkpoint.settings import CheckpointSettings
from services.runtime.signals import stop_on_signals


async def main() -> None:
    await run(CheckpointSettings(), stop_on_signals())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main())
