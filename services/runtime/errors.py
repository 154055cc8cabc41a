"""The errors the runtime raises to its callers: one type per thing a caller decides on."""

from __future__ import annotations

import asyncpg


class ConcurrencyConflict(Exception):
    """A stream was not at the version its writer expected: reload it and decide again."""

    def __init__(self, stream: str, expected: int | None, actual: int) -> None:
        super().__init__(f"stream {stream!r} is at version {actual}, expected {expected}")
        self.stream = stream
        self.expected = expected
        self.actual = actual


class StaleLeader(Exception):
    """The writer's leader epoch is not the current one: a newer leader has taken over."""

    def __init__(self, name: str, epoch: int, current: int) -> None:
        super().__init__(f"epoch {epoch} of {name!r} is fenced; the current epoch is {current}")
        self.name = name
        self.epoch = epoch
        self.current = current


class DomainError(Exception):
    """A handler's refusal of a well-formed event: the consumer dead-letters it and goes on.

    Handlers raise it (or a subclass) for input they can never process. Transient errors
    (connections, conflicts) are retried until they pass; any other exception is retried a few
    times, then dead-lettered too.
    """


# The errors that mean "PostgreSQL cannot be reached now", not "the request is wrong": retried
# by the services, answered 503 by the API.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    OSError,  # refused, reset, unreachable
    TimeoutError,
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.InterfaceError,  # the connection was closed under the call
    asyncpg.CannotConnectNowError,  # starting up or shutting down
    asyncpg.AdminShutdownError,  # terminated by a restart or pg_terminate_backend
    asyncpg.CrashShutdownError,
    # A connection whose server went away while it was idle can refuse its next statement
    # ("cannot switch to state …; another operation is in progress"): it is discarded.
    asyncpg.InternalClientError,
)


class EventTooLarge(DomainError):
    """An event's payload is over the log's bound (services/runtime/limits.py); not appended."""

    def __init__(self, event_type: str, size: int, limit: int) -> None:
        super().__init__(f"{event_type} is {size} bytes, over the event bound of {limit} bytes")
        self.event_type = event_type
        self.size = size
        self.limit = limit
