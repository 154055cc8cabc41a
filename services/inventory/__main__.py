"""`python -m services.inventory [--cluster SPEC]`: discovery, registration, liveness."""

from __future__ import annotations

import argparse
import asyncio
import logging

from services.inventory.bootstrap import run
from services.inventory.settings import InventorySettings
from services.runtime.signals import stop_on_signals


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.inventory")
    parser.add_argument("--cluster", help="shorthand NODESxGPUS[:RACK[:BLOCK]] or a YAML file")
    args = parser.parse_args()
    settings = InventorySettings()
    if args.cluster:
        settings = settings.model_copy(update={"cluster": args.cluster})
    await run(settings, stop_on_signals())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main())
