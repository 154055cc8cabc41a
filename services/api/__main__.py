"""`python -m services.api`: serve the API with uvicorn on the configured host and port."""

from __future__ import annotations

import logging

import uvicorn

from services.api.app import create_app
from services.api.settings import ApiSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = ApiSettings()
    uvicorn.run(
        create_app(settings),
        host=settings.listen_host,
        port=settings.listen_port,
        log_level="info",
        # Every change is already an event in the log; a line per request would cost a tenth of
        # the API's throughput for no new information.
        access_log=False,
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
