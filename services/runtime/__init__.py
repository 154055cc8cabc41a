"""The runtime every Gangway service shares: settings, migrations, the event store, leadership,
the outbox relay, the consumer loop and topic names. Import from here."""

from services.runtime.consumer import (
    ConsumerLoop,
    EventConsumer,
    EventHandler,
    Outcome,
    TelemetryConsumer,
    TelemetryHandler,
    Unprocessable,
    publish_telemetry,
)
from services.runtime.errors import ConcurrencyConflict, DomainError, StaleLeader
from services.runtime.kafka import make_consumer, make_producer
from services.runtime.leadership import Leadership, acquire_leadership
from services.runtime.migrate import MigrationError, migrate, migrate_settings
from services.runtime.records import Metadata, RawEvent, StreamAppend
from services.runtime.relay import OutboxRelay
from services.runtime.settings import Settings
from services.runtime.signals import stop_on_signals
from services.runtime.store import NOTIFY_CHANNEL, EventStore, create_pool
from services.runtime.topics import Topics, category_of, ensure_topics

__all__ = [
    "NOTIFY_CHANNEL",
    "ConcurrencyConflict",
    "ConsumerLoop",
    "DomainError",
    "EventConsumer",
    "EventHandler",
    "EventStore",
    "Leadership",
    "Metadata",
    "MigrationError",
    "OutboxRelay",
    "Outcome",
    "RawEvent",
    "Settings",
    "StaleLeader",
    "StreamAppend",
    "TelemetryConsumer",
    "TelemetryHandler",
    "Topics",
    "Unprocessable",
    "acquire_leadership",
    "category_of",
    "create_pool",
    "ensure_topics",
    "make_consumer",
    "make_producer",
    "migrate",
    "migrate_settings",
    "publish_telemetry",
    "stop_on_signals",
]
