"""`python -m services.api`: serve the API with uvicorn on the configured host and port.

With `GANGWAY_API_WORKERS` (or `--workers`) above one, this process starts that many worker
processes sharing the port and watches them (services/api/workers.py).
"""

from __future__ import annotations

import argparse
import sys

from services.api.settings import ApiSettings
from services.api.workers import configure_logging, run_workers, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.api", description=__doc__)
    parser.add_argument("--workers", type=int, help="worker processes (GANGWAY_API_WORKERS)")
    args = parser.parse_args(argv)
    settings = ApiSettings()
    workers = args.workers if args.workers is not None else settings.api_workers
    if workers < 1:
        parser.error("--workers must be at least 1")
    if workers == 1:
        configure_logging("api")
        serve(settings)
        return 0
    configure_logging("api")
    return run_workers(workers)


if __name__ == "__main__":
    sys.exit(main())
