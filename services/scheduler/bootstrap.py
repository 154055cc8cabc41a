"""Wires the scheduler's pieces from settings: pool, store, policy, snapshots, metrics."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from core.policy import SchedulingPolicy
from services.runtime.collector import settle_started_service
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.metrics import new_registry, start_metrics_server
from services.runtime.migrate import migrate_settings
from services.runtime.retry import Outage, until_available
from services.runtime.signals import stop_on_signals
from services.runtime.store import EventStore, create_pool
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.replay import VerifyReport, rebuild, verify_replay
from services.scheduler.service import SchedulerService, with_server_settings
from services.scheduler.settings import SchedulerSettings
from services.scheduler.snapshots import SnapshotStore, code_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wiring:
    store: EventStore
    policy: SchedulingPolicy
    snapshots: SnapshotStore


@contextlib.asynccontextmanager
async def wired(settings: SchedulerSettings) -> AsyncIterator[Wiring]:
    # A paused leader must not hold the log's head row (every append waits on it) or the epoch
    # row past the lock timeout: the server aborts its idle transaction instead.
    timeout_ms = int(settings.scheduler_lock_timeout_s * 1000)
    dsn = with_server_settings(settings.pg_dsn, idle_in_transaction_session_timeout=str(timeout_ms))
    pool = await create_pool(settings, dsn)
    try:
        policy = SchedulingPolicy(
            retry_backoff_base_s=settings.scheduler_retry_backoff_base_s,
            retry_backoff_cap_s=settings.scheduler_retry_backoff_cap_s,
            inference_headroom_gpus=settings.scheduler_inference_headroom_gpus,
            inference_max_victim_gpus=settings.scheduler_inference_max_victim_gpus,
            sharing_packing=settings.scheduler_sharing_packing,
            max_new_jobs_per_cycle=settings.scheduler_max_new_jobs_per_cycle,
        )
        yield Wiring(
            store=EventStore(pool, producer=settings.service_name),
            policy=policy,
            snapshots=SnapshotStore(pool, code_version(policy)),
        )
    finally:
        await pool.close()


async def serve(settings: SchedulerSettings) -> int:
    stop = stop_on_signals()
    # Started while the database is away (a supervisor's restart during an outage): wait.
    migrated = await until_available(
        lambda: migrate_settings(settings),
        Outage(log, "scheduler: the event log"),
        stop,
        transient=DATABASE_UNAVAILABLE,
    )
    if migrated is None and stop.is_set():
        return 0
    registry = new_registry()
    metrics = SchedulerMetrics.create(registry)
    server = start_metrics_server(settings.metrics_port, registry)
    try:
        async with wired(settings) as wiring:
            service = SchedulerService(
                settings, wiring.store, wiring.policy, wiring.snapshots, metrics
            )
            settle_started_service()
            return await service.run(stop)
    finally:
        server.stop()


async def verify(settings: SchedulerSettings) -> VerifyReport:
    """Snapshot + tail against a full replay of the log as it is now (for the CLI)."""
    async with wired(settings) as wiring:
        return await verify_replay(wiring.store, wiring.policy, wiring.snapshots)


async def print_verify(settings: SchedulerSettings) -> int:
    report = await verify(settings)
    origin = "stored snapshot" if report.snapshot_stored else "in-memory snapshot"
    print(
        f"log position {report.position}: full replay of {report.events_full} events in "
        f"{report.full_seconds:.2f} s; {origin} at {report.snapshot_position} + "
        f"{report.events_tail} events in {report.snapshot_seconds:.2f} s; {report.jobs} jobs"
    )
    for line in report.differences:
        print(f"DIFFERENT {line}")
    print("OK: snapshot + tail equals full replay" if report.ok else "FAILED")
    return 0 if report.ok else 1


async def print_replay(settings: SchedulerSettings) -> int:
    async with wired(settings) as wiring:
        rebuilt = await rebuild(wiring.store, wiring.policy, snapshots=wiring.snapshots)
    state = rebuilt.folded.state
    print(
        f"position {rebuilt.folded.position} in {rebuilt.seconds:.2f} s "
        f"(snapshot at {rebuilt.snapshot_position}, {rebuilt.events_replayed} events replayed): "
        f"{sum(1 for _ in state.jobs())} jobs, {state.pending} pending, "
        f"{state.allocated_gpus}/{state.total_gpus} GPUs allocated"
    )
    return 0
