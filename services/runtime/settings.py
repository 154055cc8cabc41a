"""The one configuration object of every Gangway process, read from GANGWAY_* variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.runtime.gather import GatherPolicy


class Settings(BaseSettings):
    """Connection settings and runtime knobs; `.gangway/env` (written by `make up`) fills gaps.

    Services extend this class's fields rather than reading the environment themselves, so that
    one object describes a process's whole configuration.
    """

    model_config = SettingsConfigDict(
        env_prefix="GANGWAY_",
        env_file=".gangway/env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
    )

    pg_dsn: str = "postgresql://gangway_app:gangway_app@127.0.0.1:25432/gangway"
    # Runs the migrations (DDL, grants); the services' own role cannot alter the log.
    pg_owner_dsn: str | None = None
    pg_pool_min: int = Field(default=1, ge=0)
    pg_pool_max: int = Field(default=10, ge=1)
    # The bound on each statement of a pooled connection. A partition that drops packets, or a
    # database host that froze, sends no reset: without it a statement already delivered waits
    # forever (and one not yet acknowledged waits for TCP's retransmissions to give up, about
    # 15 minutes). The longest statement here (a large snapshot's insert) takes seconds.
    pg_command_timeout_s: float = Field(default=60.0, gt=0)
    # The bound on opening a connection, for the same reason: a SYN into a silent partition is
    # retried by TCP for minutes. A healthy server answers in milliseconds.
    pg_connect_timeout_s: float = Field(default=10.0, gt=0)

    kafka_bootstrap: str = "127.0.0.1:29092"
    # The broker's credentials (SASL over plaintext; scripts/stack.sh's broker accepts nothing
    # else). None: a broker without authentication (docker-compose, an external one). The
    # launcher gives each service its own role's principal (services/runtime/bus_acl.py).
    kafka_username: str | None = None
    kafka_password: SecretStr | None = None
    kafka_sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = "SCRAM-SHA-256"
    # Every topic name starts with it; the tests isolate themselves with a unique prefix.
    topic_prefix: str = "gangway"
    topic_partitions: int = Field(default=3, ge=1)
    topic_replication: int = Field(default=1, ge=1)

    api_url: str = "http://127.0.0.1:8080"

    # Recorded as the producer of every appended event and used as the Kafka client id.
    service_name: str = "gangway"

    relay_name: str = "outbox"
    relay_batch_size: int = Field(default=5000, ge=1)
    relay_poll_interval_s: float = Field(default=1.0, gt=0)

    # The key the relay signs the bus's records with and consumers check (runtime/signing.py).
    bus_key: SecretStr | None = None
    # /readyz turns not-ready while a follower (or the relay) trails the log by more events.
    ready_max_lag_events: int = Field(default=10_000, ge=1)

    consumer_max_batch: int = Field(default=500, ge=1)
    # After a round (the relay's read of the log) of at least
    # gather_busy_records records and fewer than gather_enough_records, the next one waits up
    # to gather_max_wait_s to carry more (runtime/gather.py); after a smaller or a larger one
    # it starts at once. 0 s: never waits.
    gather_busy_records: int = Field(default=8, ge=1)
    gather_enough_records: int = Field(default=128, ge=2)
    gather_max_wait_s: float = Field(default=0.020, ge=0, le=0.1)
    consumer_max_attempts: int = Field(default=3, ge=1)

    @property
    def gather_policy(self) -> GatherPolicy:
        return GatherPolicy(
            busy_records=self.gather_busy_records,
            enough_records=self.gather_enough_records,
            max_wait_s=self.gather_max_wait_s,
        )

    @property
    def migration_dsn(self) -> str:
        return self.pg_owner_dsn or self.pg_dsn

    @property
    def bus_signing_key(self) -> bytes:
        from services.runtime.signing import DEVELOPMENT_KEY

        if self.bus_key is None:
            return DEVELOPMENT_KEY
        return self.bus_key.get_secret_value().encode()
