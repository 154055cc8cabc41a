"""`python -m services.admission`: admit or reject submitted jobs until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.admission.bootstrap import serve
from services.admission.settings import AdmissionSettings


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(serve(AdmissionSettings()))


if __name__ == "__main__":
    sys.exit(main())
