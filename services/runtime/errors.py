"""The errors the runtime raises to its callers: one type per thing a caller decides on."""

from __future__ import annotations


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


class EventTooLarge(DomainError):
    """An event's payload is over the log's bound (services/runtime/limits.py); not appended."""

    def __init__(self, event_type: str, size: int, limit: int) -> None:
        super().__init__(f"{event_type} is {size} bytes, over the event bound of {limit} bytes")
        self.event_type = event_type
        self.size = size
        self.limit = limit
