"""The scheduler service: one active leader folding the log and appending the core's decisions.

Life of a replica:
1. rebuild its state (snapshot + tail) and stand by, following the log, while it waits for the
   leader lock (a PostgreSQL advisory lock on a dedicated connection);
2. on winning, the epoch is raised (LeaderElected) and every append carries it, so a deposed
   leader's writes are refused (StaleLeader) even if it never noticed it was deposed;
3. as leader: follow the log strictly by position (NOTIFY only wakes it up), and after each
   catch-up, and at least every cycle interval, run the core's cycle and append its decisions in
   one multi-stream append with the expected version of every stream as last folded. A conflict
   means the log moved under the cycle: catch up and decide again. The decisions are folded in
   the log's order, like any other event, so the live state is the state a replay gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from core.cycle import Planner
from core.policy import SchedulingPolicy
from schemas import Event, EventEnvelope
from schemas.jobs import GangReserved, PreemptionRequested, job_stream
from schemas.leadership import SCHEDULER_STREAM
from services.runtime.collector import gc_paused
from services.runtime.errors import DATABASE_UNAVAILABLE, ConcurrencyConflict, StaleLeader
from services.runtime.leadership import Leadership, acquire_leadership
from services.runtime.records import Metadata, StreamAppend
from services.runtime.retry import Outage, until_available
from services.runtime.store import NOTIFY_CHANNEL, EventStore
from services.scheduler.folding import Folded, LogGap
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.replay import rebuild
from services.scheduler.settings import SchedulerSettings
from services.scheduler.snapshots import SnapshotStore

log = logging.getLogger(__name__)

# Re-running a cycle after this many conflicts in a row waits for the next wake-up instead.
_MAX_CYCLE_ATTEMPTS = 5
# Pending jobs by class walks every job (0.5 s at 150,000 jobs, measured): not too often.
_STATE_GAUGES_EVERY_S = 30.0


# A database restart or a broken connection: retried, never a reason to crash.
TRANSIENT_DB_ERRORS = DATABASE_UNAVAILABLE


class Deposed(Exception):
    """This replica is no longer the leader: another holds the lock, or its epoch is fenced."""


def with_server_settings(dsn: str, **settings: str) -> str:
    """`dsn` with PostgreSQL session settings added (asyncpg passes unknown query parameters
    to the server as settings)."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query.update(settings)
    return urlunsplit(parts._replace(query=urlencode(query)))


def segments(decisions: Sequence[Event], folded: Folded) -> list[list[StreamAppend]]:
    """The decisions as appends that keep their exact order, with expected versions.

    The core's order matters (a gang's release comes before the binding that reuses its GPUs),
    and one append takes each stream once, so the decisions are cut into segments: runs of
    one stream's consecutive events, a new segment whenever a stream comes back after another.
    Usually a cycle is one segment. Each stream expects its version as last folded, plus what
    earlier segments of the same cycle add to it.

    A gang bound to GPUs where a released gang had a rank not yet started (its agent may
    start it late: `SchedulerState.unstarted_jobs`) also expects that job's stream as folded,
    with no event: a late TaskStarted appended after the fold makes the cycle conflict and
    decide again, seeing the rank on those GPUs, instead of binding them twice in the log.
    Likewise a preemption expects the streams of released gangs whose ranks still run: it
    counted their GPUs as held, and an exit appended after the fold would leave it evicting
    a gang while idle GPUs could host the preemptor (DESIGN §3).
    """
    out: list[list[StreamAppend]] = []
    expected: dict[str, int] = {}
    runs: list[tuple[str, list[Event]]] = []
    in_segment: set[str] = set()
    state = folded.state

    def close() -> None:
        appends = []
        guarded: set[str] = set()
        preempts = False
        for stream, events in runs:
            version = expected.get(stream, folded.stream_version(stream))
            appends.append(StreamAppend(stream, version, events))
            expected[stream] = version + len(events)
            for event in events:
                if isinstance(event, PreemptionRequested):
                    preempts = True
                elif isinstance(event, GangReserved):
                    for rank in event.ranks:
                        if rank.mig is None and rank.share is None:
                            guarded |= state.unstarted_jobs(rank.node_id, rank.gpus)
        if preempts:  # the same jobs for every preemption of the segment: walked once
            guarded |= state.lingering_jobs()
        for job_id in sorted(guarded):
            stream = job_stream(job_id)
            if stream not in in_segment:
                version = expected.get(stream, folded.stream_version(stream))
                appends.append(StreamAppend(stream, version, ()))
        out.append(appends)
        runs.clear()
        in_segment.clear()

    for event in decisions:
        stream = event.stream
        if runs and runs[-1][0] == stream:
            runs[-1][1].append(event)
            continue
        if stream in in_segment:
            close()
        runs.append((stream, [event]))
        in_segment.add(stream)
    if runs:
        close()
    return out


class SchedulerService:
    def __init__(
        self,
        settings: SchedulerSettings,
        store: EventStore,
        policy: SchedulingPolicy,
        snapshots: SnapshotStore,
        metrics: SchedulerMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.policy = policy
        self.snapshots = snapshots
        self.metrics = metrics
        self.clock = clock
        self.folded = Folded.empty(policy)
        # What one cycle leaves for the next (placement index, quiet memo) of the folded state.
        self.planner = Planner()
        self.leadership: Leadership | None = None
        self._wake = asyncio.Event()
        self._since_snapshot = 0
        self._gauges_at = 0.0
        self._lag_at = 0.0
        self._next_wakeup: float | None = None
        self._listener: asyncpg.Connection | None = None
        # One log line per change of the database's state, however many retries in between.
        self._database = Outage(log, f"{settings.instance_id}: the event log")
        self._listen_outage = Outage(log, f"{settings.instance_id}: the LISTEN connection")
        self._listen_retry_at = 0.0

    # ------------------------------------------------------------------ life

    async def run(self, stop: asyncio.Event) -> int:
        """Stand by, lead, and stand by again whenever deposed, until `stop` is set (0)."""
        rebuilt = await until_available(
            lambda: rebuild(
                self.store,
                self.policy,
                snapshots=self.snapshots,
                batch_size=self.settings.scheduler_read_batch,
            ),
            self._database,
            stop,
            transient=TRANSIENT_DB_ERRORS,
        )
        if rebuilt is None:
            return 0
        self.folded = rebuilt.folded
        # A long replay is worth a snapshot soon: the next start then replays only the tail.
        self._since_snapshot = rebuilt.events_replayed
        # The rebuilt state lives as long as the process: keep its objects out of every
        # future collection's scan (the cycles allocate a lot; the state need not be rescanned).
        gc.freeze()
        log.info(
            "%s rebuilt state at position %d in %.2f s (snapshot at %s, %d events replayed)",
            self.settings.instance_id,
            self.folded.position,
            rebuilt.seconds,
            rebuilt.snapshot_position,
            rebuilt.events_replayed,
        )
        with contextlib.suppress(*TRANSIENT_DB_ERRORS):
            await self._observe(force=True)
        await self._listen()
        try:
            while not stop.is_set():
                leadership = await self._stand_by(stop)
                if leadership is None:
                    break
                await self._term(leadership, stop)
            await self._snapshot()
            log.info("%s stopped at position %d", self.settings.instance_id, self.folded.position)
            return 0
        finally:
            if self._listener is not None:
                with contextlib.suppress(Exception):
                    await self._listener.close()

    async def _term(self, leadership: Leadership, stop: asyncio.Event) -> None:
        """Lead until `stop` is set or this replica is deposed. A deposed leader stops
        deciding at once (its appends would be fenced anyway) and competes again: its folded
        state holds only committed events, so it stands by without rebuilding."""
        self.leadership = leadership
        self.metrics.leader_epoch.set(leadership.epoch)
        self.metrics.is_leader.set(1)
        log.info("%s leads at epoch %d", self.settings.instance_id, leadership.epoch)
        try:
            await self._lead(stop)
        except Deposed as why:
            log.warning(
                "%s deposed at epoch %d: %s; standing by again",
                self.settings.instance_id,
                leadership.epoch,
                why,
            )
        finally:
            self.leadership = None
            self.metrics.is_leader.set(0)
            await leadership.release()

    async def _listen(self) -> None:
        """(Re)open the connection that LISTENs for appends. Only a wake-up: without it the
        timer still catches up, a cycle interval later."""
        if self._listener is not None and not self._listener.is_closed():
            return
        if self._listen_outage.down and time.monotonic() < self._listen_retry_at:
            return  # backing off; the timer follows the log meanwhile
        try:
            listener: asyncpg.Connection = await asyncpg.connect(self.settings.pg_dsn)
            await listener.add_listener(NOTIFY_CHANNEL, self._on_notify)
        except TRANSIENT_DB_ERRORS as error:
            self._listen_retry_at = time.monotonic() + self._listen_outage.failed(error)
            return
        self._listen_outage.recovered()
        self._listener = listener
        # Appends made while it was closed notified nobody: catch up at once.
        self._wake.set()

    async def _stand_by(self, stop: asyncio.Event) -> Leadership | None:
        """Follow the log until this replica holds the lock (None: stopped first)."""
        while not stop.is_set():
            election = asyncio.create_task(
                acquire_leadership(
                    self.store,
                    self.lock_dsn,
                    self.settings.instance_id,
                    poll_interval_s=self.settings.scheduler_standby_poll_s,
                    stop=stop,
                )
            )
            if not self._database.down:
                log.info("%s stands by for the leader lock", self.settings.instance_id)
            while not election.done():
                await self._wait(stop, election, seconds=self.settings.scheduler_cycle_interval_s)
                try:
                    await self.follow()
                    await self._observe()
                    self._database.recovered()
                except TRANSIENT_DB_ERRORS:
                    pass  # the election's own retries say when the database is away
            try:
                leadership = election.result()
            except TRANSIENT_DB_ERRORS as error:
                # The lock connection broke (database restart, or this standby was paused past
                # the session timeout): try again on a fresh one.
                await self._database.sleep(error, stop)
                continue
            self._database.recovered()
            return leadership
        return None

    async def _lead(self, stop: asyncio.Event) -> None:
        assert self.leadership is not None
        keep_alive = asyncio.create_task(self._keep_alive(self.leadership))
        try:
            with contextlib.suppress(*TRANSIENT_DB_ERRORS):
                await self.follow()
            # Our own LeaderElected is folded by now; any later one means a newer leader.
            elections = self.folded.stream_version(SCHEDULER_STREAM)
            while not stop.is_set():
                try:
                    await self.cycle()
                    await self._observe()
                    self._database.recovered()
                except TRANSIENT_DB_ERRORS as error:
                    # The database is unreachable for a moment: nothing was appended, so the
                    # next cycle decides again from the same folded state.
                    await self._database.sleep(error, stop)
                await self._wait(stop, keep_alive, seconds=self._until_next_cycle())
                if keep_alive.done():
                    raise Deposed("the leader lock's session is gone")
                with contextlib.suppress(*TRANSIENT_DB_ERRORS):
                    await self.follow()
                if self.folded.stream_version(SCHEDULER_STREAM) > elections:
                    raise Deposed("a newer leader was elected")
        finally:
            keep_alive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keep_alive

    @property
    def lock_dsn(self) -> str:
        # The server ends the lock's session when the leader stops pinging it (paused, hung),
        # which releases the lock for a standby; see SchedulerSettings.scheduler_lock_timeout_s.
        timeout_ms = int(self.settings.scheduler_lock_timeout_s * 1000)
        return with_server_settings(self.settings.pg_dsn, idle_session_timeout=str(timeout_ms))

    async def _keep_alive(self, leadership: Leadership) -> None:
        """Ping the lock's session well within its idle timeout; return when it is gone."""
        interval = self.settings.scheduler_lock_timeout_s / 4
        while True:
            await asyncio.sleep(interval)
            if not await leadership.still_held():
                return

    # ------------------------------------------------------------------ following

    async def follow(self, own: Sequence[EventEnvelope] = ()) -> int:
        """Fold every committed event after our position, in position order; `own`, events
        this scheduler has just appended, are folded as they are, not decoded again."""
        # Cleared before reading: an append notified from now on wakes the next wait at once.
        self._wake.clear()
        folded_now = 0
        limit = self.settings.scheduler_read_batch
        decoded = {envelope.position or 0: envelope for envelope in own} if own else None
        try:
            while True:
                # One query per wake-up: the next events by position (no head lookup first).
                batch = await self.store.read_all_raw(self.folded.position, limit)
                folded_now += self.folded.fold_raw(batch, self.store.registry, decoded)
                if len(batch) < limit:
                    break
        except LogGap as gap:
            # Cannot happen with a gap-free log; re-reading from our position is always safe.
            log.warning("%s; re-reading", gap)
        self._after_fold(folded_now)
        return folded_now

    def _after_fold(self, count: int) -> None:
        if count:
            self.metrics.follower.events_handled.inc(count)
            self.metrics.follower.position.set(self.folded.position)
            self._since_snapshot += count

    def _fold_own(self, envelopes: list[EventEnvelope]) -> bool:
        """Fold our just-appended decisions directly when nothing was committed between our
        position and them; False when the log must be read instead (to keep its order)."""
        if not envelopes or envelopes[0].position != self.folded.position + 1:
            return False
        self._after_fold(self.folded.fold_envelopes(envelopes))
        return True

    # ------------------------------------------------------------------ deciding

    async def cycle(self) -> list[EventEnvelope]:
        """Run the core's cycle and append its decisions; returns what was appended."""
        assert self.leadership is not None
        for _ in range(_MAX_CYCLE_ATTEMPTS):
            started = time.perf_counter()
            # A cycle makes no reference cycles: the collector's scans of the large state
            # mid-cycle would cost more than the cycle.
            with gc_paused():
                result = self.planner.schedule(self.folded.state, self.clock())
            decisions = result.decisions
            self._next_wakeup = result.next_wakeup
            if result.not_considered and decisions:
                # A flood past the cycle's bound on newly queued jobs: the next cycle considers
                # the next of them at once, not after the cycle interval. (Only after a cycle
                # that decided something: one that did not would decide the same again.)
                self._next_wakeup = self.clock()
            self.metrics.cycle_seconds.observe(time.perf_counter() - started)
            if not decisions:
                break
            try:
                envelopes = await self._append(decisions, self.leadership.epoch)
            except ConcurrencyConflict as conflict:
                # The log moved under the cycle (a cancel, a task exit): fold it and decide
                # again. Nothing was appended, so no GPU is bound twice.
                self.metrics.conflicts.inc()
                log.info("cycle conflicted (%s); catching up", conflict)
                await self.follow()
                continue
            except StaleLeader as fenced:
                raise Deposed(str(fenced)) from fenced
            for event in decisions:
                self.metrics.decisions.labels(event.type).inc()
            if not self._fold_own(envelopes) and await self.follow(envelopes) > len(envelopes):
                # Others' events committed before (or after) ours were folded just now, after
                # the cycle decided without them, and `follow` cleared the wake-up their
                # notifications had set: set it again, or the jobs they admitted would wait
                # for the cycle timer (the last batch of a burst waited ~1 s for it).
                self._wake.set()
            await self._maybe_snapshot()
            return envelopes
        await self._maybe_snapshot()
        return []

    async def _append(self, decisions: Sequence[Event], epoch: int) -> list[EventEnvelope]:
        """All the decisions in one transaction, in the core's order, fenced by `epoch`."""
        metadata = Metadata(producer=self.settings.service_name)
        parts = segments(decisions, self.folded)
        if len(parts) == 1:
            return await self.store.append_many(parts[0], metadata, epoch=epoch)
        envelopes: list[EventEnvelope] = []
        async with self.store.pool.acquire() as conn, conn.transaction():
            for appends in parts:
                envelopes += await self.store.append_many(appends, metadata, epoch=epoch, conn=conn)
        return envelopes

    def _until_next_cycle(self) -> float:
        """The timer's wait: the cycle interval, or less when the core named an earlier time
        at which something becomes due (a grace deadline, a max runtime)."""
        interval = self.settings.scheduler_cycle_interval_s
        if self._next_wakeup is None:
            return interval
        return min(interval, max(0.01, self._next_wakeup - self.clock()))

    # ------------------------------------------------------------------ snapshots, metrics

    async def _maybe_snapshot(self) -> None:
        if self._since_snapshot >= self.settings.scheduler_snapshot_every:
            await self._snapshot()

    async def _snapshot(self) -> None:
        if self._since_snapshot == 0:
            return
        try:
            await self.snapshots.save(self.folded, keep=self.settings.scheduler_snapshots_kept)
            self._since_snapshot = 0
        except TRANSIENT_DB_ERRORS as error:
            # A snapshot is only a cache: failing to write one costs replay time, nothing else.
            log.warning("snapshot not saved: %r", error)

    async def _observe(self, *, force: bool = False) -> None:
        self.metrics.gpus_allocated.set(float(self.folded.state.allocated_gpus))
        now = time.monotonic()
        if now - self._lag_at >= 1.0 or force:
            self._lag_at = now
            head = await self.store.head()
            self.metrics.follower.lag_events.set(max(0, head - self.folded.position))
        if force or now - self._gauges_at >= _STATE_GAUGES_EVERY_S:
            self._gauges_at = now
            self.metrics.observe_state(self.folded.state)

    # ------------------------------------------------------------------ waiting

    def _on_notify(self, *_: Any) -> None:
        self._wake.set()

    async def _wait(
        self, stop: asyncio.Event, also: asyncio.Future[Any], *, seconds: float
    ) -> None:
        """Until an append is notified (since the last catch-up), `stop` is set, `also` is
        done or `seconds` pass."""
        await self._listen()
        waiters = {asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(
                {*waiters, also}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
