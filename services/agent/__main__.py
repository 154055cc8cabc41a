"""`python -m services.agent [--cluster SPEC]`: the agents of the discovered node or the fleet."""

from __future__ import annotations

import argparse
import asyncio
import logging

from services.agent.bootstrap import run
from services.agent.settings import AgentSettings
from services.runtime.signals import stop_on_signals


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.agent")
    parser.add_argument("--cluster", help="shorthand NODESxGPUS[:RACK[:BLOCK]] or a YAML file")
    args = parser.parse_args()
    settings = AgentSettings()
    if args.cluster:
        settings = settings.model_copy(update={"cluster": args.cluster})
    await run(settings, stop_on_signals())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main())
