"""Kafka topic names: one topic per event category, plus telemetry and dead letters."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import NewTopic

from services.runtime.kafka import make_admin
from services.runtime.limits import MAX_MESSAGE_BYTES
from services.runtime.settings import Settings

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36

# Stream prefix → category. A stream's events all go to one topic, keyed by stream, so a
# consumer sees each stream in order. Health events live in node streams, hence in `nodes`.
_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("job-", "jobs"),
    ("node-", "nodes"),
    ("team-", "teams"),
    ("queue-", "teams"),
    ("checkpoint-", "checkpoints"),
    ("scheduler", "scheduler"),
)
LOG_CATEGORIES: tuple[str, ...] = ("jobs", "nodes", "teams", "checkpoints", "scheduler", "misc")


def category_of(stream: str) -> str:
    for prefix, category in _CATEGORIES:
        if stream.startswith(prefix):
            return category
    # Never drop an event for want of a topic; `misc` makes the unexpected stream visible.
    return "misc"


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str = "gangway"

    @classmethod
    def from_settings(cls, settings: Settings) -> Topics:
        return cls(settings.topic_prefix)

    def category(self, category: str) -> str:
        return f"{self.prefix}.{category}"

    def for_stream(self, stream: str) -> str:
        return self.category(category_of(stream))

    @property
    def jobs(self) -> str:
        return self.category("jobs")

    @property
    def nodes(self) -> str:
        return self.category("nodes")

    @property
    def teams(self) -> str:
        return self.category("teams")

    @property
    def checkpoints(self) -> str:
        return self.category("checkpoints")

    @property
    def scheduler(self) -> str:
        return self.category("scheduler")

    @property
    def telemetry(self) -> str:
        """Heartbeats and raw samples: on the bus only, never in the log."""
        return self.category("telemetry")

    @property
    def deadletter(self) -> str:
        return self.category("deadletter")

    @property
    def log_topics(self) -> tuple[str, ...]:
        """The topics the outbox relay publishes the log to."""
        return tuple(self.category(c) for c in LOG_CATEGORIES)

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.log_topics, self.telemetry, self.deadletter)


async def ensure_topics(settings: Settings, topics: Topics | None = None) -> None:
    """Create every Gangway topic that does not exist yet (idempotent); as the broker's admin,
    also grant the roles their rights on the prefix (services/runtime/bus_acl.py).

    A service, which may not create topics, finds them made: the launcher (and each test's
    fixture) runs this as the admin before starting any.
    """
    from services.runtime import bus_acl  # it builds on this module's Topics

    topics = topics or Topics.from_settings(settings)
    await _create_missing(settings, topics.all)
    if bus_acl.is_admin(settings):
        await bus_acl.grant_prefix(settings, topics)


async def _create_missing(settings: Settings, names: tuple[str, ...]) -> None:
    admin = make_admin(settings)
    await admin.start()
    try:
        # A principal lists only the topics it may see: with its rights granted, all of ours.
        existing = set(await admin.list_topics())
        missing = [n for n in names if n not in existing]
        if not missing:
            return
        # The record bound travels with each topic, whatever the broker's default is.
        config = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        new = [
            NewTopic(n, settings.topic_partitions, settings.topic_replication, topic_configs=config)
            for n in missing
        ]
        response = await admin.create_topics(new)
        for topic, code, message in response.topic_errors:
            # 36: created by a concurrent process since the listing; fine.
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create topic {topic}: error {code} {message}")
        log.info("created topics %s", ", ".join(missing))
    finally:
        await admin.close()
