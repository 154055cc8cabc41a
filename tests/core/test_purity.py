"""The core is a pure library: importing it pulls in no database, broker or web client."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("asyncpg", "aiokafka", "fastapi", "httpx", "uvicorn", "starlette")


def test_importing_the_core_loads_no_io_library() -> None:
    probe = (
        "import sys, core as core; core.schedule; "
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_the_core_reads_no_clock_and_draws_no_randomness() -> None:
    probe = (
        "import sys, core\n"
        "mods = [m for m in sys.modules if m.startswith('core')]\n"
        "import inspect\n"
        "bad = [m for m in mods if any(w in inspect.getsource(sys.modules[m]) for w in "
        "('time.time(', 'datetime.now(', 'random.', 'open('))]\n"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""
