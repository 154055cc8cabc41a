"""Rebuilding the scheduler's state from the log: snapshot + tail, or a full replay, and the
check that both give the same state (`gangway replay --verify` calls `verify_replay`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from core.policy import SchedulingPolicy
from services.runtime.collector import gc_paused
from services.runtime.records import RawEvent
from services.runtime.store import EventStore
from services.scheduler.folding import Folded
from services.scheduler.snapshots import SnapshotStore, dumps, loads


@dataclass(frozen=True, slots=True)
class Rebuilt:
    folded: Folded
    snapshot_position: int | None
    events_replayed: int
    seconds: float


async def rebuild(
    store: EventStore,
    policy: SchedulingPolicy,
    *,
    snapshots: SnapshotStore | None = None,
    until: int | None = None,
    batch_size: int = 20_000,
) -> Rebuilt:
    """The state folded up to `until` (default: the head now): from the latest usable snapshot
    when `snapshots` is given, else from the first event."""
    started = time.perf_counter()
    end = await store.head() if until is None else until
    folded: Folded | None = None
    with gc_paused():
        if snapshots is not None:
            folded = await snapshots.load(max_position=end)
        snapshot_position = None if folded is None else folded.position
        if folded is None:
            folded = Folded.empty(policy)
        replayed = await catch_up(store, folded, until=end, batch_size=batch_size)
    return Rebuilt(folded, snapshot_position, replayed, time.perf_counter() - started)


async def catch_up(
    store: EventStore, folded: Folded, *, until: int, batch_size: int = 20_000
) -> int:
    """Fold the log from `folded.position` up to `until`; returns how many events were folded.

    The next batch is read while this one is folded, so that PostgreSQL's share of the work
    (reading, turning jsonb into text) runs on another core at the same time as ours.
    """
    if until - folded.position <= batch_size:
        count = 0
        async for batch in store.iter_raw(folded.position, until=until, batch_size=batch_size):
            count += folded.fold_raw(batch, store.registry)
        return count
    batches: asyncio.Queue[list[RawEvent] | None] = asyncio.Queue(maxsize=2)

    async def read() -> None:
        try:
            async for batch in store.iter_raw(
                folded.position, until=until, batch_size=_PIPELINED_BATCH
            ):
                await batches.put(batch)
        finally:
            await batches.put(None)

    reader = asyncio.create_task(read())
    count = 0
    try:
        while (received := await batches.get()) is not None:
            for start in range(0, len(received), _FOLD_SLICE):
                count += folded.fold_raw(received[start : start + _FOLD_SLICE], store.registry)
                # Lets the reader take the next rows off the socket, so the server never
                # waits on a full buffer while we fold.
                await asyncio.sleep(0)
        await reader  # re-raises a read error
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    return count


_PIPELINED_BATCH = 5_000
_FOLD_SLICE = 1_000


# ---------------------------------------------------------------------- verification


def digest(folded: Folded) -> dict[str, Any]:
    """What two folds of the same log must agree on: every job and node as the core shows it,
    the totals, the stream versions and the position."""
    state = folded.state
    return {
        "position": folded.position,
        "versions": dict(sorted(folded.versions.items())),
        "jobs": {view.job_id: view for view in sorted(state.jobs(), key=lambda v: v.job_id)},
        "nodes": {view.node_id: view for view in sorted(state.nodes(), key=lambda v: v.node_id)},
        "allocated_gpus": state.allocated_gpus,
        "free_gpus": state.free_gpus,
        "pending": state.pending,
        "clock": state.clock,
    }


def differences(expected: Folded, actual: Folded, *, limit: int = 20) -> list[str]:
    """Human-readable differences of `actual` from `expected` (empty: the same state)."""
    want, got = digest(expected), digest(actual)
    found: list[str] = []
    for key in want:
        if want[key] == got[key]:
            continue
        if isinstance(want[key], dict):
            for item in sorted(set(want[key]) | set(got[key])):
                if want[key].get(item) != got[key].get(item):
                    found.append(
                        f"{key}[{item}]: full replay {want[key].get(item)!r}, "
                        f"snapshot + tail {got[key].get(item)!r}"
                    )
                    if len(found) >= limit:
                        return found
        else:
            found.append(f"{key}: full replay {want[key]!r}, snapshot + tail {got[key]!r}")
    return found[:limit]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    position: int
    # Where snapshot + tail started: a stored snapshot, or (none stored) one taken in memory
    # half-way through the log, so the check always exercises the snapshot path.
    snapshot_position: int
    snapshot_stored: bool
    events_full: int
    events_tail: int
    full_seconds: float
    snapshot_seconds: float
    jobs: int
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


async def verify_replay(
    store: EventStore,
    policy: SchedulingPolicy,
    snapshots: SnapshotStore,
    *,
    until: int | None = None,
) -> VerifyReport:
    """Compare snapshot + tail with a full replay of the log up to `until` (default: head)."""
    end = await store.head() if until is None else until
    full = await rebuild(store, policy, until=end)
    from_snapshot = await rebuild(store, policy, snapshots=snapshots, until=end)
    stored = from_snapshot.snapshot_position is not None
    if not stored:
        half = Folded.empty(policy)
        with gc_paused():
            await catch_up(store, half, until=end // 2)
        started = time.perf_counter()
        resumed = loads(dumps(half))
        with gc_paused():
            tail = await catch_up(store, resumed, until=end)
        from_snapshot = Rebuilt(resumed, half.position, tail, time.perf_counter() - started)
    assert from_snapshot.snapshot_position is not None
    return VerifyReport(
        position=end,
        snapshot_position=from_snapshot.snapshot_position,
        snapshot_stored=stored,
        events_full=full.events_replayed,
        events_tail=from_snapshot.events_replayed,
        full_seconds=full.seconds,
        snapshot_seconds=from_snapshot.seconds,
        jobs=sum(1 for _ in full.folded.state.jobs()),
        differences=differences(full.folded, from_snapshot.folded),
    )
