"""The checkpoint service: gathers every rank's shard of a requested checkpoint, verifies it,
and records CheckpointCommitted or CheckpointCorrupted.

A checkpoint is requested by CheckpointRequested or implied by PreemptionRequested; its id is
derived from that event (store.checkpoint_id_for), so the agents write their shards where the
service looks without a word between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointRequested,
)
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    JobCancelled,
    JobFailed,
    JobRequeued,
    JobSubmitted,
    JobSucceeded,
    PreemptionRequested,
)
from schemas.reasons import RequeueCode
from services.checkpoint.metrics import CheckpointMetrics
from services.checkpoint.periodic import PeriodicCheckpoints
from services.checkpoint.retention import checkpoints_to_prune
from services.checkpoint.settings import CheckpointSettings
from services.runtime.checkpoint_store import (
    Verification,
    checkpoint_dir,
    checkpoint_id_for,
    failed_ranks,
    reported_ranks,
    verify,
    write_manifest,
)
from services.runtime.consumer import EventHandler
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.metrics import new_registry
from services.runtime.records import Metadata
from services.runtime.retry import Outage
from services.runtime.store import EventStore

log = logging.getLogger(__name__)

Verdict = CheckpointCommitted | CheckpointCorrupted | CheckpointFailed
VERDICTS = (CheckpointCommitted, CheckpointCorrupted, CheckpointFailed)
# Requeue codes of the eviction a checkpoint is taken for: its shards were written by live
# ranks before they stopped. Any other release (a lost node, a failed rank) means the shards
# may come from ranks of a gang that was already gone.
_EVICTION_CODES: frozenset[RequeueCode] = frozenset({"preempted", "node_drained"})


def outcome(
    job_id: str, attempt: int, checkpoint_id: str, verification: Verification
) -> CheckpointCommitted | CheckpointCorrupted:
    if verification.ok:
        return CheckpointCommitted(
            job_id=job_id,
            attempt=attempt,
            checkpoint_id=checkpoint_id,
            step=verification.step,
            shards=verification.shards,
        )
    return CheckpointCorrupted(
        job_id=job_id, checkpoint_id=checkpoint_id, reason="; ".join(verification.problems)
    )


class CheckpointService:
    def __init__(self, settings: CheckpointSettings, store: EventStore) -> None:
        self.settings = settings
        self.store = store
        self.root = settings.checkpoint_root.resolve()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.periodic = PeriodicCheckpoints(settings.checkpoint_min_interval_s)
        self.log_outage = Outage(log, "checkpoint: the event log")
        self._collecting: set[str] = set()
        self.registry = new_registry()
        self.metrics = CheckpointMetrics.create(self.registry)
        self.outcomes = self.metrics.outcomes
        self.team_bytes = self.metrics.team_bytes

    def handlers(self) -> dict[str, EventHandler]:
        handlers: dict[str, EventHandler] = {
            CheckpointRequested.type: self.on_request,
            PreemptionRequested.type: self.on_request,
            GangReserved.type: self.on_gang_reserved,
        }
        for event_type in GANG_RELEASING_EVENTS:
            handlers[event_type.type] = self.on_gang_released
        return handlers

    # ------------------------------------------------------------------ periodic requests

    async def interval_of(self, job_id: str) -> float | None:
        """The spec's fixed interval (None for `auto`: the scheduler chooses it per gang)."""
        for envelope in await self.store.read_stream(f"job-{job_id}"):
            if isinstance(envelope.payload, JobSubmitted):
                interval = envelope.payload.spec.checkpoint.interval_s
                return None if interval == "auto" else interval
        return None

    async def on_gang_reserved(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        event = envelope.payload
        assert isinstance(event, GangReserved)
        # The interval the scheduler recorded for this gang (the spec's, or Young-Daly's for
        # `auto`); a gang reserved before intervals were recorded goes by the spec.
        interval = event.checkpoint_interval_s
        if interval is None:
            interval = await self.interval_of(event.job_id)
        self.periodic.started(event.job_id, event.attempt, interval, time.monotonic())

    async def on_gang_released(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        event = envelope.payload
        self.periodic.stopped(str(getattr(event, "job_id", "")), getattr(event, "attempt", None))

    async def resume_pending(self) -> int:
        """After a restart: collect again every request still without an outcome whose wait
        had not run out (the consumer will not redeliver it). Returns how many."""
        types = [
            "CheckpointRequested",
            "PreemptionRequested",
            "CheckpointCommitted",
            "CheckpointCorrupted",
            "CheckpointFailed",
        ]
        pending: dict[str, tuple[EventEnvelope, float]] = {}
        judged: set[str] = set()
        position = 0
        while batch := await self.store.read_all(position, 5000, types=types):
            for envelope in batch:
                event = envelope.payload
                if isinstance(event, VERDICTS):
                    judged.add(event.checkpoint_id)
                elif isinstance(event, CheckpointRequested | PreemptionRequested):
                    wait_s = self.wait_for(event)
                    pending[checkpoint_id_for(event.attempt, envelope.event_id)] = (
                        envelope,
                        wait_s,
                    )
                position = envelope.position or position
        now = datetime.now(UTC)
        resumed = 0
        for checkpoint_id, (envelope, wait_s) in pending.items():
            left = wait_s - (now - envelope.recorded_at).total_seconds()
            if checkpoint_id in judged or left <= 0:
                continue
            event = envelope.payload
            assert isinstance(event, CheckpointRequested | PreemptionRequested)
            self._spawn(self.collect(event.job_id, event.attempt, envelope, left))
            resumed += 1
        return resumed

    def wait_for(self, event: CheckpointRequested | PreemptionRequested) -> float:
        if isinstance(event, PreemptionRequested):
            return event.grace_s + self.settings.collect_slack_s
        return self.settings.checkpoint_timeout_s

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def rebuild_periodic(self) -> None:
        """The gangs holding GPUs now, from the log: the consumer resumes after their
        GangReserved, so a restarted service would otherwise never checkpoint them again."""
        holding: dict[str, int] = {}
        types = ["GangReserved", *(t.type for t in GANG_RELEASING_EVENTS)]
        position = 0
        while batch := await self.store.read_all(position, 5000, types=types):
            for envelope in batch:
                event = envelope.payload
                job_id = str(getattr(event, "job_id", ""))
                if isinstance(event, GangReserved):
                    holding[job_id] = event.attempt
                elif getattr(event, "attempt", None) in (None, holding.get(job_id)):
                    holding.pop(job_id, None)
                position = envelope.position or position
        now = time.monotonic()
        for job_id, attempt in holding.items():
            self.periodic.started(job_id, attempt, await self.interval_of(job_id), now)

    async def request_due(self) -> list[CheckpointRequested]:
        """Record the periodic requests due now. One the log did not take (it is away) stays
        due, with every one after it, for the next round: before, `due` had already moved it
        one interval on, so an outage of a second cost the gang a whole interval of
        checkpoints."""
        requests = [
            CheckpointRequested(job_id=job_id, attempt=attempt, reason="periodic")
            for job_id, attempt in self.periodic.due(time.monotonic())
        ]
        for done, request in enumerate(requests):
            try:
                await self.store.append(request.stream, None, [request])
            except BaseException:
                for missed in requests[done:]:
                    self.periodic.missed(missed.job_id, missed.attempt)
                raise
        return requests

    async def request_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.request_due()
            except DATABASE_UNAVAILABLE as error:
                # One line when the log goes, one when it is back (not a traceback a second).
                self.log_outage.failed(error)
            except Exception:
                log.exception("periodic checkpoint requests failed; retrying")
            else:
                self.log_outage.recovered()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    # ------------------------------------------------------------------ collection

    async def on_request(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        event = envelope.payload
        assert isinstance(event, CheckpointRequested | PreemptionRequested)
        # Gathering takes up to the grace period: it runs beside the consumer, not in it.
        self._spawn(self.collect(event.job_id, event.attempt, envelope, self.wait_for(event)))

    async def world_size(self, job_id: str, attempt: int) -> int | None:
        for envelope in reversed(await self.store.read_stream(f"job-{job_id}")):
            event = envelope.payload
            if isinstance(event, GangReserved) and event.attempt == attempt:
                return len(event.ranks)
        return None

    async def collect(
        self, job_id: str, attempt: int, cause: EventEnvelope, wait_s: float
    ) -> Verdict | None:
        checkpoint_id = checkpoint_id_for(attempt, cause.event_id)
        if checkpoint_id in self._collecting:
            return None  # a redelivery while the first collection still waits
        self._collecting.add(checkpoint_id)
        try:
            return await self._collect(job_id, attempt, cause, wait_s, checkpoint_id)
        finally:
            self._collecting.discard(checkpoint_id)

    async def _collect(
        self, job_id: str, attempt: int, cause: EventEnvelope, wait_s: float, checkpoint_id: str
    ) -> Verdict | None:
        """Every request ends in a verdict within `wait_s`: committed, corrupted, or failed
        (a rank gave up, the shards did not all come in time, the attempt was released)."""
        world = await self.world_size(job_id, attempt)
        if world is None:
            log.warning(
                "checkpoint %s of %s: attempt %d never had a gang", checkpoint_id, job_id, attempt
            )
            return None
        directory = checkpoint_dir(self.root, job_id, checkpoint_id)
        deadline = time.monotonic() + wait_s
        ended: str | None = None
        looked = time.monotonic()
        while True:
            reported = await asyncio.to_thread(reported_ranks, directory, world)
            failed = await asyncio.to_thread(failed_ranks, directory, world)
            if len(reported | set(failed)) >= world or time.monotonic() > deadline or ended:
                break
            await asyncio.sleep(self.settings.poll_interval_s)
            # A job that ended has no rank left to write a shard: judge what is there now
            # (looked up once a second, not at every poll).
            if time.monotonic() - looked >= 1.0:
                looked = time.monotonic()
                ended = await self.ended(job_id, attempt)
        result = await self._judge(job_id, attempt, checkpoint_id, directory, world, wait_s, ended)
        if await self._already_recorded(result.stream, checkpoint_id):
            return result
        await self.store.append(result.stream, None, [result], Metadata.caused_by(cause))
        self.outcomes.labels(result.type).inc()
        if isinstance(result, CheckpointCommitted):
            request = cause.payload
            assert isinstance(request, CheckpointRequested | PreemptionRequested)
            took = (datetime.now(UTC) - cause.recorded_at).total_seconds()
            self.metrics.committed(request, took, sum(shard.bytes for shard in result.shards))
        log.info("%s %s of job %s", result.type, checkpoint_id, job_id)
        await self.prune(job_id)
        return result

    # ------------------------------------------------------------------ retention

    async def prune(self, job_id: str) -> list[str]:
        """Delete the job's checkpoints beyond the newest K good ones; returns their ids."""
        events = [e.payload for e in await self.store.read_stream(f"checkpoint-{job_id}")]
        doomed = checkpoints_to_prune(events, self.settings.checkpoint_keep)
        for checkpoint_id in doomed:
            directory = checkpoint_dir(self.root, job_id, checkpoint_id)
            await asyncio.to_thread(shutil.rmtree, directory, True)
        return doomed

    async def sweep(self, now: datetime) -> list[str]:
        """Delete every checkpoint of jobs ended longer ago than the retention, and publish
        the storage each team holds. Returns the jobs whose checkpoints went."""
        ended = (JobSucceeded, JobFailed, JobCancelled)
        retention = timedelta(seconds=self.settings.checkpoint_retention_s)
        usage: dict[str, int] = {}
        removed: list[str] = []
        job_dirs = await asyncio.to_thread(
            lambda: (
                sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
            )
        )
        for job_dir in job_dirs:
            team = None
            finished_at = None
            for envelope in await self.store.read_stream(f"job-{job_dir.name}"):
                event = envelope.payload
                if isinstance(event, JobSubmitted):
                    team = event.spec.team
                elif isinstance(event, ended):
                    finished_at = envelope.recorded_at
            if finished_at is not None and now - finished_at >= retention:
                await asyncio.to_thread(shutil.rmtree, job_dir, True)
                removed.append(job_dir.name)
                continue
            size = await asyncio.to_thread(_bytes_under, job_dir)
            usage[team or "unknown"] = usage.get(team or "unknown", 0) + size
        self.team_bytes.clear()
        for team, size in sorted(usage.items()):
            self.team_bytes.labels(team).set(size)
        return removed

    async def sweep_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                removed = await self.sweep(datetime.now(UTC))
                if removed:
                    log.info("deleted the checkpoints of %d ended jobs", len(removed))
            except Exception:
                log.exception("checkpoint sweep failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.sweep_interval_s)

    async def _judge(
        self,
        job_id: str,
        attempt: int,
        checkpoint_id: str,
        directory: Path,
        world: int,
        wait_s: float,
        ended: str | None = None,
    ) -> Verdict:
        reported = await asyncio.to_thread(reported_ranks, directory, world)
        failed = await asyncio.to_thread(failed_ranks, directory, world)

        def failure(reason: str) -> CheckpointFailed:
            return CheckpointFailed(
                job_id=job_id, attempt=attempt, checkpoint_id=checkpoint_id, reason=reason
            )

        if failed or len(reported) < world:
            reasons = [f"rank {rank}: {why}" for rank, why in sorted(failed.items())]
            missing = [r for r in range(world) if r not in reported and r not in failed]
            if missing:
                ranks = ", ".join(map(str, missing))
                if ended:
                    reasons.append(f"the job {ended} before rank {ranks} wrote a shard")
                else:
                    reasons.append(f"timed out: no shard from rank {ranks} within {wait_s:g} s")
            return failure("; ".join(reasons))
        released = await self.released_before_commit(job_id, attempt)
        if released is not None:
            return failure(
                f"attempt {attempt} was released ({released}) before its shards were verified"
            )
        verification = await asyncio.to_thread(verify, directory, world)
        result = outcome(job_id, attempt, checkpoint_id, verification)
        if isinstance(result, CheckpointCommitted):
            await asyncio.to_thread(
                write_manifest,
                directory,
                job_id=job_id,
                attempt=attempt,
                checkpoint_id=checkpoint_id,
                verification=verification,
            )
        return result

    async def ended(self, job_id: str, attempt: int) -> str | None:
        """How the job ended ('succeeded', 'failed', 'was cancelled') while at `attempt` or
        after it; None while it has not ended."""
        for envelope in reversed(await self.store.read_stream(f"job-{job_id}")):
            event = envelope.payload
            if isinstance(event, JobSucceeded | JobFailed | JobCancelled):
                if event.attempt is None or event.attempt >= attempt:
                    if isinstance(event, JobCancelled):
                        return "was cancelled"
                    return event.type.removeprefix("Job").lower()
                return None
        return None

    async def released_before_commit(self, job_id: str, attempt: int) -> str | None:
        """How the attempt was released other than by the eviction its checkpoint serves (a
        lost node, a failed rank, a cancel); None while it holds its gang or was evicted."""
        for envelope in await self.store.read_stream(f"job-{job_id}"):
            event = envelope.payload
            if isinstance(event, JobRequeued) and event.attempt == attempt:
                if event.code not in _EVICTION_CODES:
                    return f"requeued: {event.code}"
            elif isinstance(event, JobFailed | JobCancelled) and event.attempt == attempt:
                return event.type.removeprefix("Job").lower()
        return None

    async def _already_recorded(self, stream: str, checkpoint_id: str) -> bool:
        """A redelivered request finds its outcome already in the log."""
        for envelope in await self.store.read_stream(stream):
            event = envelope.payload
            if isinstance(event, VERDICTS) and event.checkpoint_id == checkpoint_id:
                return True
        return False

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)


def _bytes_under(directory: Path) -> int:
    """The bytes of the regular files below `directory`: a symlink a rank left there (to
    /proc/kcore, 128 TiB; to another team's shards) is not counted as its team's storage."""
    total = 0
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):  # a file pruned or renamed while we look
            found = path.lstat()
            if stat.S_ISREG(found.st_mode):
                total += found.st_size
    return total
