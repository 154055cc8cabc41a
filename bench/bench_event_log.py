"""Event log speed on the local PostgreSQL: appends (single and batched) and full sequential reads.

Targets: batched appends >= 20,000 events/s; a full read of 1,000,000 events >= 200,000 events/s.
Run: `python bench/bench_event_log.py [--events 1000000]` with the stack up (`make up`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scratch import scratch_settings

from schemas.jobs import JobDeferred
from services.runtime import EventStore, StreamAppend


def _events(job: int, count: int) -> list[JobDeferred]:
    return [
        JobDeferred(job_id=f"j{job}", code="quota", message=f"waiting {i}") for i in range(count)
    ]


async def single_appends(store: EventStore, count: int) -> float:
    """One event per append, one writer: each append is a transaction with its own commit."""
    events = _events(0, count)
    started = time.perf_counter()
    for i, event in enumerate(events):
        await store.append("job-j0", i, [event])
    return count / (time.perf_counter() - started)


async def concurrent_single_appends(store: EventStore, writers: int, each: int) -> float:
    """One event per append, several writers on their own streams."""

    async def writer(w: int) -> None:
        for i, event in enumerate(_events(100 + w, each)):
            await store.append(f"job-j{100 + w}", i, [event])

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return writers * each / (time.perf_counter() - started)


async def batched_appends(
    store: EventStore, batch: int, batches: int, streams: int, base: int
) -> float:
    """`batch` events per append, spread over `streams` streams in one transaction."""
    per_stream = batch // streams
    payloads = {s: _events(base + s, per_stream) for s in range(streams)}
    versions = dict.fromkeys(range(streams), 0)
    started = time.perf_counter()
    for _ in range(batches):
        await store.append_many(
            [StreamAppend(f"job-j{base + s}", versions[s], payloads[s]) for s in range(streams)]
        )
        for s in range(streams):
            versions[s] += per_stream
    return batches * per_stream * streams / (time.perf_counter() - started)


async def fill(store: EventStore, total: int) -> None:
    head = await store.head()
    job = 100_000
    while head < total:
        count = min(5_000, total - head)
        await store.append(f"job-j{job}", 0, _events(job, count))
        head += count
        job += 1


async def full_read(store: EventStore) -> tuple[int, float]:
    started = time.perf_counter()
    read = 0
    async for batch in store.iter_raw():
        read += len(batch)
    return read, read / (time.perf_counter() - started)


async def full_replay_decoded(store: EventStore, limit: int) -> float:
    started = time.perf_counter()
    decoded = 0
    async for _ in store.replay():
        decoded += 1
        if decoded >= limit:
            break
    return decoded / (time.perf_counter() - started)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="log size for the read")
    args = parser.parse_args()
    async with scratch_settings(pg_pool_max=16) as settings:
        store = await EventStore.connect(settings, producer="bench")
        try:
            rate = await single_appends(store, 2_000)
            print(f"append, 1 event per transaction, 1 writer:    {rate:>10,.0f} events/s")
            rate = await concurrent_single_appends(store, 8, 500)
            print(f"append, 1 event per transaction, 8 writers:   {rate:>10,.0f} events/s")
            shapes = ((100, 1), (100, 10), (1_000, 10), (5_000, 50))
            for n, (batch, streams) in enumerate(shapes):
                batches = max(20, 200_000 // batch // 10)
                rate = await batched_appends(store, batch, batches, streams, 1_000 * (n + 1))
                print(
                    f"append, {batch:>5} events per transaction, {streams:>2} streams:"
                    f" {rate:>10,.0f} events/s"
                )
            fill_started = time.perf_counter()
            await fill(store, args.events)
            filled = await store.head()
            print(
                f"fill to {filled:,} events (5,000 per append):"
                f" {filled / (time.perf_counter() - fill_started):>10,.0f} events/s (incl. above)"
            )
            # The first read after a bulk load also sets the rows' hint bits (writes pages);
            # the second is what a replay of a settled log costs.
            for attempt in ("first", "second"):
                read, rate = await full_read(store)
                print(
                    f"full sequential read of {read:,} raw events ({attempt}):"
                    f" {rate:>10,.0f} events/s"
                )
            rate = await full_replay_decoded(store, 200_000)
            print(f"replay decoded to typed envelopes (200,000):  {rate:>10,.0f} events/s")
        finally:
            await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
