"""`python -m services.scheduler`: run a scheduler replica (leader or standby) until SIGTERM.

`python -m services.scheduler --verify` compares snapshot + tail with a full replay and exits
non-zero on any difference; `--replay` rebuilds the state and prints what it holds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from services.scheduler.bootstrap import print_replay, print_verify, serve
from services.scheduler.settings import SchedulerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.scheduler")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--verify", action="store_true", help="check snapshot + tail = full replay")
    mode.add_argument("--replay", action="store_true", help="rebuild the state and summarise it")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = SchedulerSettings()
    if args.verify:
        return asyncio.run(print_verify(settings))
    if args.replay:
        return asyncio.run(print_replay(settings))
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
