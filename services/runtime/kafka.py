"""Kafka clients configured the one way Gangway uses them."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from services.runtime.limits import MAX_FETCH_BYTES, MAX_MESSAGE_BYTES
from services.runtime.settings import Settings


def make_producer(settings: Settings, *, client_id: str | None = None) -> AIOKafkaProducer:
    """An idempotent producer (acks=all): a retried send is never written twice by the broker."""
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        client_id=client_id or settings.service_name,
        enable_idempotence=True,
        acks="all",
        linger_ms=2,
        max_batch_size=256 * 1024,
        # The bus's record bound (limits.py): every event the log accepts fits in one record.
        max_request_size=MAX_MESSAGE_BYTES,
        request_timeout_ms=30_000,
    )


def make_consumer(
    settings: Settings, *topics: str, group_id: str, client_id: str | None = None
) -> AIOKafkaConsumer:
    """A group consumer that commits only by hand, after the effects are durable."""
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_bootstrap,
        client_id=client_id or settings.service_name,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_poll_interval_ms=300_000,
        # At least one whole record of the largest size per partition and per fetch.
        max_partition_fetch_bytes=MAX_FETCH_BYTES,
        fetch_max_bytes=max(52_428_800, MAX_FETCH_BYTES),
    )
