"""The admission service: each JobSubmitted gets one JobAdmitted or JobRejected in its stream.

The decision is taken by the pure rules (`rules.admit`) against a catalogue of teams, queues
and nodes folded from the log, the only truth, never from the bus: before deciding on a job the
catalogue is caught up to the submission's position, so a team created just before the job is
always known, whatever order the bus delivered them in.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Collection
from uuid import UUID

import asyncpg

from core.admission import DEFAULT_TEAM_POLICY, AdmissionCatalog, admit
from schemas import EventEnvelope
from schemas.jobs import JOB_ENDING_EVENTS, JobAdmitted, JobRejected, JobSubmitted
from schemas.nodes import NodeRegistered
from schemas.teams import QueueConfigured, TeamCreated, TeamPolicyConfigured
from services.runtime.consumer import record_in_inbox
from services.runtime.errors import ConcurrencyConflict, DomainError
from services.runtime.records import Metadata, RawEvent, StreamAppend
from services.runtime.store import EventStore, Inbox

log = logging.getLogger(__name__)

CATALOG_TYPES: tuple[str, ...] = (
    TeamCreated.type,
    QueueConfigured.type,
    TeamPolicyConfigured.type,
    NodeRegistered.type,
)
DECISION_TYPES: frozenset[str] = frozenset({JobAdmitted.type, JobRejected.type})
ENDING_TYPES: frozenset[str] = frozenset(kind.type for kind in JOB_ENDING_EVENTS)


class Admission:
    """Decides on submitted jobs; `on_submitted` is the consumer's handler for JobSubmitted."""

    def __init__(
        self,
        store: EventStore,
        priority_classes: Collection[str],
        always_preemptible: Collection[str] = ("best-effort",),
        *,
        batch_size: int = 5000,
    ) -> None:
        self.store = store
        self.priority_classes = tuple(priority_classes)
        self.always_preemptible = tuple(always_preemptible)
        self.batch_size = batch_size
        self.catalog = AdmissionCatalog(default_policy=DEFAULT_TEAM_POLICY)
        # Every catalogue event at or before this position has been folded.
        self.position = 0
        # Catalogue events fetched but past the submissions decided so far, in log order.
        self._ahead: deque[RawEvent] = deque()
        self._fetched_until = 0
        self.decided = 0
        # Decisions taken inside `batch`, appended at its end, each with the id of the
        # submission it answers; None outside a batch.
        self._staged: list[tuple[StreamAppend, Metadata, UUID]] | None = None

    async def catch_up(self, until: int | None = None) -> None:
        """Fold the catalogue's events up to `until` (default: the log's head now).

        Events are fetched up to the head, and those past `until` are kept aside until a later
        submission passes them: a stream of submissions costs one catalogue query per refresh,
        not one per job, and each decision still sees the catalogue as of its submission.
        """
        end = await self.store.head() if until is None else until
        if end > self._fetched_until:
            await self._fetch()
        while self._ahead and self._ahead[0].position <= end:
            raw = self._ahead.popleft()
            self.catalog.apply(
                self.store.registry.decode(raw.type, raw.schema_version, raw.payload)
            )
        self.position = max(self.position, end)

    async def _fetch(self) -> None:
        head = await self.store.head()
        after = self._fetched_until
        while True:
            batch = await self.store.read_all_raw(after, self.batch_size, types=CATALOG_TYPES)
            self._ahead.extend(raw for raw in batch if raw.position <= head)
            if len(batch) < self.batch_size or batch[-1].position >= head:
                break
            after = batch[-1].position
        # Every catalogue event at or before `head` is now folded or waiting in `_ahead`.
        self._fetched_until = head

    async def on_submitted(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        submitted = envelope.payload
        if not isinstance(submitted, JobSubmitted):
            raise DomainError(f"admission handles JobSubmitted, not {envelope.type}")
        await self.catch_up(envelope.position)
        decision = admit(
            submitted.job_id,
            submitted.spec,
            self.catalog,
            self.priority_classes,
            self.always_preemptible,
        )
        metadata = Metadata.caused_by(envelope)
        # Usually nothing follows the submission yet: one append after it, no read.
        append = StreamAppend(submitted.stream, envelope.version, [decision])
        if self._staged is not None:
            # Written with the batch's others.
            self._staged.append((append, metadata, envelope.event_id))
        else:
            try:
                await self.store.append_many([append], metadata, conn=conn)
            except ConcurrencyConflict:
                await self._decide_after(append, metadata, conn)
        self.decided += 1
        if isinstance(decision, JobRejected):
            log.info("job %s rejected: %s", submitted.job_id, decision.reason)

    @contextlib.asynccontextmanager
    async def batch(
        self, conn: asyncpg.Connection, inbox: str | None = None
    ) -> AsyncIterator[None]:
        """The consumer's scope around one fetched batch (its BatchScope): the decisions
        taken inside are appended together at its end in one statement, whatever their
        number. With `inbox`, the consumer's inbox name, the batch is outside a transaction:
        that statement is its own, and records each decided submission in the inbox; a
        decision whose stream moved on is written after it, with its inbox row, in a
        transaction of its own. Without, the statement is in the caller's transaction. A
        batch that fails appends nothing."""
        self._staged = []
        try:
            yield
            staged = self._staged
            results = (
                await self.store.append_each(
                    [(append, metadata) for append, metadata, _ in staged],
                    conn=conn,
                    inbox=None if inbox is None else Inbox(inbox, [e for _, _, e in staged]),
                )
                if staged
                else []
            )
            for (append, metadata, answered), result in zip(staged, results, strict=True):
                if not isinstance(result, ConcurrencyConflict):
                    continue
                if inbox is None:
                    await self._decide_after(append, metadata, conn)
                else:
                    # Its inbox row beside the decision written after the stream's news (the
                    # batch's statement recorded the others).
                    async with conn.transaction():
                        await record_in_inbox(conn, inbox, answered)
                        await self._decide_after(append, metadata, conn)
        finally:
            self._staged = None

    async def _decide_after(
        self, append: StreamAppend, metadata: Metadata, conn: asyncpg.Connection
    ) -> None:
        """The submission's stream moved on before its decision was written."""
        history = await self.store.read_stream(append.stream, conn=conn)
        if any(e.type in DECISION_TYPES for e in history):
            return  # decided already (a redelivery, or another admission replica)
        if any(e.type in ENDING_TYPES for e in history):
            # Cancelled while it waited for admission (admission caught up late, after an
            # outage): a decision after its end would be a fact about a finished job.
            return
        # Something else came first (a cancel request): decide after it. A conflict here too
        # is retried by the consumer, which then finds the decision.
        await self.store.append(
            append.stream, history[-1].version, append.events, metadata, conn=conn
        )
