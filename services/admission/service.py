"""The admission service: each JobSubmitted gets one JobAdmitted or JobRejected in its stream.

The decision is taken by the pure rules (`rules.admit`) against a catalogue of teams, queues
and nodes folded from the log, the only truth, never from the bus: before deciding on a job the
catalogue is caught up to the submission's position, so a team created just before the job is
always known, whatever order the bus delivered them in.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import asyncpg

from schemas import EventEnvelope
from schemas.jobs import JobAdmitted, JobRejected, JobSubmitted
from schemas.nodes import NodeRegistered
from schemas.teams import QueueConfigured, TeamCreated
from services.admission.rules import AdmissionCatalog, admit
from services.runtime.errors import DomainError
from services.runtime.records import Metadata
from services.runtime.store import EventStore

log = logging.getLogger(__name__)

CATALOG_TYPES: tuple[str, ...] = (TeamCreated.type, QueueConfigured.type, NodeRegistered.type)
DECISION_TYPES: frozenset[str] = frozenset({JobAdmitted.type, JobRejected.type})


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
        self.catalog = AdmissionCatalog()
        # Every catalogue event at or before this position has been folded.
        self.position = 0
        self.decided = 0

    async def catch_up(self, until: int | None = None) -> None:
        """Fold the catalogue's events up to `until` (default: the log's head now)."""
        end = await self.store.head() if until is None else until
        while self.position < end:
            batch = await self.store.read_all_raw(
                self.position, self.batch_size, types=CATALOG_TYPES
            )
            for raw in batch:
                if raw.position > end:
                    break
                self.catalog.apply(
                    self.store.registry.decode(raw.type, raw.schema_version, raw.payload)
                )
                self.position = raw.position
            if len(batch) < self.batch_size or batch[-1].position >= end:
                # Nothing of the catalogue's types lies between here and `end`.
                self.position = max(self.position, end)

    async def on_submitted(self, envelope: EventEnvelope, conn: asyncpg.Connection) -> None:
        submitted = envelope.payload
        if not isinstance(submitted, JobSubmitted):
            raise DomainError(f"admission handles JobSubmitted, not {envelope.type}")
        await self.catch_up(envelope.position)
        history = await self.store.read_stream(submitted.stream, conn=conn)
        if any(e.type in DECISION_TYPES for e in history):
            return  # decided already (a redelivery, or another admission replica)
        decision = admit(
            submitted.job_id,
            submitted.spec,
            self.catalog,
            self.priority_classes,
            self.always_preemptible,
        )
        # Expecting the version just read: a concurrent decision makes this a conflict, which
        # the consumer retries, and the retry finds the decision and does nothing.
        version = history[-1].version if history else 0
        await self.store.append(
            submitted.stream, version, [decision], Metadata.caused_by(envelope), conn=conn
        )
        self.decided += 1
        if isinstance(decision, JobRejected):
            log.info("job %s rejected: %s", submitted.job_id, decision.reason)
