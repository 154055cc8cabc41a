"""Kafka clients configured the one way Gangway uses them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from services.runtime.limits import MAX_FETCH_BYTES, MAX_MESSAGE_BYTES
from services.runtime.settings import Settings

log = logging.getLogger(__name__)

# How long a producer may take to reach the broker, and a broken one to stop: with the broker
# away, a start waits for it and a stop waits on the producer's unsent batches.
PRODUCER_START_TIMEOUT_S = 5.0
PRODUCER_STOP_TIMEOUT_S = 2.0


def connection_options(settings: Settings) -> dict[str, Any]:
    """Where the broker is and who this process is to it: every client of the bus (producer,
    consumer, admin, the tests' own) is built with these."""
    options: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap}
    if settings.kafka_username is not None:
        password = settings.kafka_password
        options.update(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_plain_username=settings.kafka_username,
            sasl_plain_password=password.get_secret_value() if password is not None else "",
        )
    return options


def make_producer(
    settings: Settings,
    *,
    client_id: str | None = None,
    linger_ms: int = 2,
    partitioner: Callable[[bytes | None, list[int], list[int]], int] | None = None,
) -> AIOKafkaProducer:
    """An idempotent producer (acks=all): a retried send is never written twice by the broker.

    `linger_ms` is how long a send waits for others to share its request; a producer that
    hands over a whole batch before awaiting any of it (the relay) batches without it."""
    return AIOKafkaProducer(
        **connection_options(settings),
        client_id=client_id or settings.service_name,
        enable_idempotence=True,
        acks="all",
        linger_ms=linger_ms,
        max_batch_size=256 * 1024,
        # The bus's record bound (limits.py): every event the log accepts fits in one record.
        max_request_size=MAX_MESSAGE_BYTES,
        request_timeout_ms=30_000,
        **({} if partitioner is None else {"partitioner": partitioner}),
    )


async def start_producer(producer: AIOKafkaProducer) -> AIOKafkaProducer:
    """`producer`, started within PRODUCER_START_TIMEOUT_S, else stopped and the error raised.

    A producer is replaced, not retried, after a send fails: an idempotent producer whose batch
    failed may hold a sequence the broker no longer accepts (after a restart that lost the tail
    of its log, every later batch of those partitions is refused, OutOfOrderSequenceNumber, and
    aiokafka never resets it)."""
    try:
        await asyncio.wait_for(producer.start(), PRODUCER_START_TIMEOUT_S)
    except BaseException:
        await stop_producer(producer)
        raise
    return producer


async def stop_producer(producer: AIOKafkaProducer | None) -> None:
    """Stop `producer` within PRODUCER_STOP_TIMEOUT_S; one that cannot is left behind."""
    if producer is None:
        return
    try:
        await asyncio.wait_for(producer.stop(), PRODUCER_STOP_TIMEOUT_S)
    except Exception as error:
        log.debug("producer did not stop cleanly: %r", error)


def make_consumer(
    settings: Settings, *topics: str, group_id: str, client_id: str | None = None
) -> AIOKafkaConsumer:
    """A group consumer that commits only by hand, after the effects are durable."""
    return AIOKafkaConsumer(
        *topics,
        **connection_options(settings),
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


def make_admin(
    settings: Settings, *, client_id: str | None = None, **options: Any
) -> AIOKafkaAdminClient:
    """An admin client (topics, ACLs, metadata) as this process's principal."""
    return AIOKafkaAdminClient(
        **connection_options(settings),
        client_id=client_id or f"{settings.service_name}-admin",
        **options,
    )


def client_environment(settings: Settings) -> dict[str, str]:
    """The GANGWAY_KAFKA_* variables that make a child process the same client of the same
    broker as `settings` (tests and benchmarks start services as processes)."""
    env = {"GANGWAY_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    if settings.kafka_username is not None:
        password = settings.kafka_password
        env.update(
            GANGWAY_KAFKA_USERNAME=settings.kafka_username,
            GANGWAY_KAFKA_PASSWORD=password.get_secret_value() if password is not None else "",
            GANGWAY_KAFKA_SASL_MECHANISM=settings.kafka_sasl_mechanism,
        )
    return env
