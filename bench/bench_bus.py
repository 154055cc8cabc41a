"""Log → Kafka → consumer: end-to-end latency at a steady 1,000 events/s, then peak throughput.

The relay runs as its own process (`python -m services.runtime.relay`), as it does in
deployment; the consumer is the shared EventConsumer with its inbox, in this process.
Latency is from the event's `recorded_at` (taken in the append's transaction) to its handler.
Target: p99 < 50 ms at 1,000 events/s.
Run: `python bench/bench_bus.py [--seconds 20]` with the stack up (`make up`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scratch import scratch_settings

from schemas import EventEnvelope
from schemas.jobs import JobDeferred
from services.runtime import EventConsumer, EventStore, Settings, StreamAppend, Topics
from services.runtime.kafka import client_environment

ROOT = Path(__file__).resolve().parent.parent


class Latencies:
    def __init__(self) -> None:
        self.samples: list[float] = []
        self.target = 0
        self.reached = asyncio.Event()

    async def handle(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        self.samples.append((datetime.now(UTC) - envelope.recorded_at).total_seconds())
        if len(self.samples) >= self.target:
            self.reached.set()

    def percentile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def spawn_relay(settings: Settings) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "GANGWAY_PG_DSN": settings.pg_dsn,
        "GANGWAY_PG_OWNER_DSN": settings.migration_dsn,
        **client_environment(settings),
        "GANGWAY_TOPIC_PREFIX": settings.topic_prefix,
        "GANGWAY_SERVICE_NAME": "bench-relay",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.runtime.relay",
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def wait_for(count: int, latencies: Latencies, patience_s: float = 120.0) -> None:
    latencies.target = count
    latencies.reached.clear()
    if len(latencies.samples) < count:
        await asyncio.wait_for(latencies.reached.wait(), patience_s)


async def steady_rate(
    store: EventStore, latencies: Latencies, rate: int, seconds: float, per_tick: int, tag: str
) -> float:
    """Append `rate` events/s as `per_tick` events per append, on a fixed schedule.

    Appends are not awaited one by one: like independent API requests, they overlap, and the
    store's group commit shares a WAL flush among those that arrive together.
    """
    ticks = int(rate * seconds / per_tick)
    interval = per_tick / rate
    already = len(latencies.samples)
    in_flight: set[asyncio.Task[object]] = set()
    started = time.perf_counter()
    for tick in range(ticks):
        delay = started + tick * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        events = [
            JobDeferred(job_id=f"{tag}{tick}", code="q", message=str(i)) for i in range(per_tick)
        ]
        task = asyncio.create_task(store.append_many([StreamAppend(f"job-{tag}{tick}", 0, events)]))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)
    achieved = ticks * per_tick / (time.perf_counter() - started)
    await wait_for(already + ticks * per_tick, latencies)
    return achieved


async def peak(store: EventStore, latencies: Latencies, total: int) -> float:
    """Append `total` events as fast as batches allow; time until the consumer saw them all."""
    already = len(latencies.samples)
    started = time.perf_counter()
    for b in range(total // 1000):
        await store.append(
            f"job-p{b}",
            0,
            [JobDeferred(job_id=f"p{b}", code="q", message=str(i)) for i in range(1000)],
        )
    await wait_for(already + total, latencies)
    return total / (time.perf_counter() - started)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--peak-events", type=int, default=50_000)
    args = parser.parse_args()
    async with scratch_settings(relay_poll_interval_s=0.5) as settings:
        store = await EventStore.connect(settings, producer="bench")
        latencies = Latencies()
        consumer = EventConsumer(
            settings,
            store.pool,
            name="bench",
            topics=[Topics.from_settings(settings).jobs],
            handlers={"JobDeferred": latencies.handle},
        )
        stop = asyncio.Event()
        consuming = asyncio.create_task(consumer.run(stop))
        relay = await spawn_relay(settings)
        try:
            # Warm-up: the relay and the consumer are connected and assigned.
            await store.append("job-warm", 0, [JobDeferred(job_id="warm", code="q", message="")])
            await wait_for(1, latencies)
            for per_tick in (1, 10):
                latencies.samples.clear()
                achieved = await steady_rate(
                    store, latencies, args.rate, args.seconds, per_tick, f"s{per_tick}-"
                )
                print(
                    f"steady {achieved:,.0f} events/s ({per_tick} per append):"
                    f" p50 {latencies.percentile(0.50) * 1000:.1f} ms,"
                    f" p99 {latencies.percentile(0.99) * 1000:.1f} ms,"
                    f" max {max(latencies.samples) * 1000:.1f} ms"
                    f" over {len(latencies.samples):,} events"
                )
            rate = await peak(store, latencies, args.peak_events)
            print(
                f"peak log -> Kafka -> consumer: {rate:,.0f} events/s"
                f" ({args.peak_events:,} events, 1,000 per append)"
            )
        finally:
            relay.send_signal(signal.SIGTERM)
            await relay.wait()
            stop.set()
            await consuming
            await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
