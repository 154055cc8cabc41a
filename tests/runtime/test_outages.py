"""Riding out outages quietly: backoff with jitter, one log line per change, bounded stops."""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from asyncpg.exceptions import CannotConnectNowError

from services.runtime.retry import Backoff, Outage
from services.runtime.signals import RepeatFilter


def test_backoff_grows_to_its_ceiling_with_jitter_and_resets() -> None:
    backoff = Backoff(0.1, 2.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(10)]
    assert all(0.05 <= d <= 2.0 for d in delays)
    assert delays[-1] >= 1.0  # at the ceiling: between half of it and all of it
    assert len(set(delays)) == len(delays)  # jittered: no two clients in lockstep
    backoff.reset()
    assert backoff.next_delay() <= 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_logs_when_lost_a_summary_now_and_then_and_when_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = Outage(logging.getLogger("t"), "the database", summary_every_s=30, clock=clock)
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(200):  # 200 failed attempts over 100 s
            outage.failed(ConnectionRefusedError())
            clock.now += 0.5
        outage.recovered()
        outage.recovered()  # already up: nothing to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("the database lost")
    assert [line for line in lines if "still unavailable" in line] == [
        "the database still unavailable after 30 s (60 attempts; last: ConnectionRefusedError())",
        "the database still unavailable after 60 s (120 attempts; last: ConnectionRefusedError())",
        "the database still unavailable after 90 s (180 attempts; last: ConnectionRefusedError())",
    ]
    assert lines[-1] == "the database recovered after 100.0 s (200 attempts)"
    assert len(lines) == 5
    assert outage.outages == 1


def test_a_library_repeating_itself_is_logged_once_per_period_with_a_count() -> None:
    repeats = RepeatFilter(("aiokafka",), every_s=3600)

    def record(name: str, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (), None)

    unable = "Unable connect to node %s"
    passed = [repeats.filter(record("aiokafka.conn", unable)) for _ in range(5)]
    assert passed == [True, False, False, False, False]
    assert repeats.filter(record("aiokafka.conn", "another message"))
    assert all(repeats.filter(record("services.relay", "ours")) for _ in range(3))


def test_a_library_losing_its_server_says_so_in_one_line_without_a_traceback() -> None:
    """asyncpg's pool logs each failed reconnect with its traceback (every service printed ~50
    lines whenever PostgreSQL shut down); the line and the error's name say all of it."""
    repeats = RepeatFilter(("asyncpg",), every_s=3600)

    def failed(error: BaseException, name: str = "asyncpg.pool") -> logging.LogRecord:
        try:
            raise error
        except BaseException:
            info = sys.exc_info()
        message = "Failed to restore the pool connection floor; retrying"
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, (), info)

    shutting_down = failed(CannotConnectNowError("the database system is shutting down"))
    assert repeats.filter(shutting_down)
    assert shutting_down.exc_info is None
    assert shutting_down.getMessage() == (
        "Failed to restore the pool connection floor; retrying: "
        "CannotConnectNowError('the database system is shutting down')"
    )
    assert logging.Formatter().format(shutting_down).count("\n") == 0
    refused = failed(ConnectionRefusedError(111, "Connect call failed"), "asyncpg.pool.x")
    assert repeats.filter(refused) and refused.exc_info is None
    # A library's own defect keeps its traceback: it is what a report needs.
    defect = failed(KeyError("holder"), "asyncpg.connect_utils")
    assert repeats.filter(defect) and defect.exc_info is not None
    # Our own loggers are never rewritten.
    ours = failed(ConnectionRefusedError(111, "refused"), "services.relay")
    assert repeats.filter(ours) and ours.exc_info is not None


def test_sigterm_ends_a_process_whose_shutdown_hangs_within_its_grace() -> None:
    program = textwrap.dedent(
        """
        import asyncio
        from services.runtime.signals import stop_on_signals

        async def main():
            stop_on_signals(shutdown_grace_s=0.5)
            print("ready", flush=True)
            await asyncio.Event().wait()  # a client waiting on a server that never answers

        asyncio.run(main())
        """
    )
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_a_sigterm_delivered_twice_at_once_still_stops_gracefully() -> None:
    """A signal sent to the process group and to the process arrives twice; services took the
    second as "exit now" and skipped their graceful stop (a leader's last snapshot)."""
    program = textwrap.dedent(
        """
        import asyncio
        from services.runtime.signals import stop_on_signals

        async def main():
            stop = stop_on_signals(shutdown_grace_s=30)
            print("ready", flush=True)
            await stop.wait()
            await asyncio.sleep(0.5)  # the graceful stop
            print("stopped gracefully", flush=True)

        asyncio.run(main())
        """
    )
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    time.sleep(0.1)  # handled apart, as on a busy machine, not coalesced by the kernel
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert "stopped gracefully" in out


def test_readyz_is_not_ready_while_a_dependency_is_away() -> None:
    """A service riding out an outage stays up and says it is not ready, then ready again."""
    from services.runtime.metrics import readiness

    database = Outage(logging.getLogger("test"), "test: the event log")
    assert readiness([])[0]
    database.failed(ConnectionRefusedError("refused"))
    ready, detail = readiness([])
    assert not ready and detail["unavailable"] == ["test: the event log"]
    database.recovered()
    assert readiness([])[0]
