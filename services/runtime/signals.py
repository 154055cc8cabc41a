"""Graceful shutdown: SIGTERM and SIGINT set a stop event that every loop watches.

Whatever the broker's or the database's state, a stop is bounded: `shutdown_grace_s` after the
first signal (or at a second one) the process exits, because everything it acknowledged is
already durable in the log (effects commit before offsets, the relay stores a position only
after Kafka's acks) and a client library waiting on an absent server must not hold it up.

`stop_on_signals` also quiets the Kafka and PostgreSQL clients' own logging (see
`quiet_library_logs`): every service calls it once at start, after configuring logging.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from asyncpg.exceptions import OperatorInterventionError, PostgresConnectionError

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = float(os.environ.get("GANGWAY_SHUTDOWN_GRACE_S", "5"))
# Signals this close to the first are one request delivered twice, not a second request.
_SAME_REQUEST_S = 1.0


def stop_on_signals(
    stop: asyncio.Event | None = None, *, shutdown_grace_s: float = SHUTDOWN_GRACE_S
) -> asyncio.Event:
    """Return an event set by SIGTERM or SIGINT (call from inside the running loop)."""
    event = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    first_at: list[float] = []

    def on_signal(sig: signal.Signals) -> None:
        if event.is_set():
            # The same request delivered twice (a supervisor or a shell signalling both the
            # process group and the process) is not an operator asking again: only a signal
            # some time after the first cuts the graceful stop short.
            if first_at and time.monotonic() - first_at[0] < _SAME_REQUEST_S:
                return
            log.warning("second %s: exiting now", sig.name)
            _exit_now()
        first_at.append(time.monotonic())
        event.set()
        log.info("%s: stopping (at most %.0f s)", sig.name, shutdown_grace_s)
        loop.call_later(shutdown_grace_s, _overdue, shutdown_grace_s)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    quiet_library_logs()
    return event


async def sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if `stop` is set; return whether it is set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


def _overdue(grace_s: float) -> None:
    log.warning("shutdown still incomplete after %.0f s; exiting now", grace_s)
    _exit_now()


def _exit_now() -> None:
    logging.shutdown()
    os._exit(0)


class RepeatFilter(logging.Filter):
    """Lets one record per (logger, message template) through every `every_s`, and says how
    many it held back: a client library retrying a dead broker logs each attempt (tens of
    thousands of lines in seconds), which says nothing the first line did not."""

    def __init__(self, prefixes: tuple[str, ...], every_s: float = 30.0) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.every_s = every_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        at, held = self._last.get(key, (float("-inf"), 0))
        if now - at < self.every_s:
            self._last[key] = (at, held + 1)
            return False
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in {now - at:.0f} s)"
        _fold_lost_server(record)
        return True


# A library's attempt to reach an absent or stopping server: its traceback is the library's
# own reconnect path, the same every time, and says nothing that the error's name does not.
_LOST_SERVER: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    PostgresConnectionError,
    OperatorInterventionError,  # shutting down, terminated by the administrator
)


def _fold_lost_server(record: logging.LogRecord) -> None:
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, _LOST_SERVER):
        return
    said = repr(error)
    record.msg = f"{record.msg}: {said.replace('%', '%%') if record.args else said}"
    record.exc_info = None
    record.exc_text = None


def quiet_library_logs(prefixes: tuple[str, ...] = ("aiokafka", "kafka", "asyncpg")) -> None:
    """Install a RepeatFilter on every handler of the root logger (once)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.addFilter(RepeatFilter(prefixes))
