"""The API's write side: each user command checks the read model, appends, and applies.

Commands decide on the latest state of their stream: it is synced from the log first, and the
append expects exactly that version, so a concurrent writer makes us re-read and decide again.
The appended events are applied to the read models at once, which gives read-your-writes.
"""

from __future__ import annotations

from typing import Final
from uuid import uuid4

from schemas.base import Event
from schemas.jobs import (
    JobCancelRequested,
    JobResumeRequested,
    JobSpec,
    JobSubmitted,
    JobSuspendRequested,
)
from schemas.nodes import NodeDrainRequested, NodeUndrained
from schemas.teams import QueueConfigured, TeamCreated
from services.api.auth import Principal, new_token, token_sha256
from services.api.feed import ReadModelFeed
from services.api.models import DrainBody, QueueConfig, QueuePatch, TeamCreate
from services.api.problems import ProblemError, conflict, not_found
from services.api.projections.jobs import JobReadModel, Request, request_allowed
from services.api.projections.nodes import NodeRecord
from services.api.projections.queues import QueueRecord
from services.api.queue_rules import Quota, quota_problem
from services.runtime.errors import ConcurrencyConflict
from services.runtime.records import Metadata, StreamAppend
from services.runtime.store import EventStore

ATTEMPTS: Final = 5
JOB_ID_HEX: Final = 12

RequestEvent = type[JobCancelRequested | JobSuspendRequested | JobResumeRequested]
_REQUEST_EVENTS: Final[dict[Request, RequestEvent]] = {
    "cancel": JobCancelRequested,
    "suspend": JobSuspendRequested,
    "resume": JobResumeRequested,
}


def new_job_id() -> str:
    return uuid4().hex[:JOB_ID_HEX]


class Commands:
    def __init__(self, store: EventStore, feed: ReadModelFeed) -> None:
        self.store = store
        self.feed = feed

    async def submit(self, principal: Principal, spec: JobSpec) -> JobReadModel:
        principal.require_team(spec.team)
        _require_storable(spec)
        _require_launchable_env(spec)
        for _ in range(ATTEMPTS):
            job_id = new_job_id()
            event = JobSubmitted(job_id=job_id, spec=spec, submitted_by=principal.name)
            try:
                await self._append(event.stream, 0, [event])
            except ConcurrencyConflict:
                continue  # an id collision: draw another
            return self.feed.models.jobs[job_id]
        raise RuntimeError("could not draw an unused job id")

    async def request(self, principal: Principal, job_id: str, kind: Request) -> JobReadModel:
        """Record the user's request to cancel, suspend or resume; 409 when the state forbids it."""
        stream = f"job-{job_id}"
        for _ in range(ATTEMPTS):
            await self.feed.sync_stream(stream)
            job = principal.visible(self.feed.models.jobs.get(job_id), job_id)
            if not request_allowed(job, kind):
                raise conflict(f"job {job_id} is {job.state}; it cannot be {_past(kind)}")
            if kind in job.requests:
                return job  # already requested: asking twice records nothing new
            event = _REQUEST_EVENTS[kind](job_id=job_id, by=principal.name)
            try:
                await self._append(stream, self.feed.models.version_of(stream), [event])
            except ConcurrencyConflict:
                continue
            return self.feed.models.jobs[job_id]
        raise conflict(f"job {job_id} is changing too fast; try again")

    async def create_team(self, body: TeamCreate) -> str:
        """Record the team and its queue; return the token, which only its creator ever sees."""
        if body.name in self.feed.models.teams:
            raise conflict(f"team {body.name} already exists")
        self._require_valid_quota(
            body.name, Quota(body.parent, body.guaranteed_gpus, body.max_gpus)
        )
        token = new_token()
        team = TeamCreated(
            name=body.name,
            parent=body.parent,
            guaranteed_gpus=body.guaranteed_gpus,
            max_gpus=body.max_gpus,
            token_sha256=token_sha256(token),
        )
        queue = QueueConfigured(
            name=body.name,
            parent=body.parent,
            guaranteed_gpus=body.guaranteed_gpus,
            max_gpus=body.max_gpus,
        )
        try:
            envelopes = await self.store.append_many(
                [StreamAppend(team.stream, 0, [team]), StreamAppend(queue.stream, None, [queue])],
                _metadata(),
            )
        except ConcurrencyConflict:
            raise conflict(f"team {body.name} already exists") from None
        await self.feed.deliver_all(envelopes)
        return token

    async def configure_queue(self, name: str, body: QueueConfig) -> QueueRecord:
        self._require_valid_quota(name, Quota(body.parent, body.guaranteed_gpus, body.max_gpus))
        event = QueueConfigured(
            name=name,
            parent=body.parent,
            guaranteed_gpus=body.guaranteed_gpus,
            max_gpus=body.max_gpus,
            weight=body.weight,
        )
        # Last writer wins: a queue's configuration is a whole value, not a delta.
        await self._append(event.stream, None, [event])
        return self.feed.models.queues[name]

    async def patch_queue(self, name: str, body: QueuePatch) -> QueueRecord:
        """Change only the fields given; the rest keep their configured values."""
        await self.feed.sync_stream(f"queue-{name}")
        current = self.feed.models.queues.get(name)
        if current is None:
            raise not_found(f"queue {name}")
        given = body.model_fields_set
        merged = QueueConfig.model_construct(
            parent=body.parent if "parent" in given else current.parent,
            guaranteed_gpus=(
                body.guaranteed_gpus
                if "guaranteed_gpus" in given and body.guaranteed_gpus is not None
                else current.guaranteed_gpus
            ),
            max_gpus=body.max_gpus if "max_gpus" in given else current.max_gpus,
            weight=body.weight if body.weight is not None else current.weight,
        )
        return await self.configure_queue(name, merged)

    def _require_valid_quota(self, name: str, proposed: Quota) -> None:
        models = self.feed.models
        queues = {
            queue.name: Quota(queue.parent, queue.guaranteed_gpus, queue.max_gpus)
            for queue in models.queues.values()
            if queue.name != name
        }
        cluster_gpus = sum(len(node.gpu_indices) for node in models.nodes.values())
        problem = quota_problem(name, proposed, queues, cluster_gpus)
        if problem is not None:
            raise ProblemError(422, "validation-error", problem)

    async def drain_node(self, principal: Principal, node_id: str, body: DrainBody) -> NodeRecord:
        """An operator's drain: no new gang lands on the node, and it stays drained (health
        never returns it) until an operator undrains it."""
        principal.require_admin()
        await self.feed.sync_stream(f"node-{node_id}")
        self._node(node_id)
        event = NodeDrainRequested(
            node_id=node_id, reason=body.reason, by=principal.name, deadline=body.deadline
        )
        await self._append(event.stream, None, [event])
        return self._node(node_id)

    async def undrain_node(self, principal: Principal, node_id: str) -> NodeRecord:
        principal.require_admin()
        await self.feed.sync_stream(f"node-{node_id}")
        node = self._node(node_id)
        if not (node.draining or node.drained):
            raise conflict(f"node {node_id} is not drained")
        event = NodeUndrained(node_id=node_id, by=principal.name)
        await self._append(event.stream, None, [event])
        return self._node(node_id)

    def _node(self, node_id: str) -> NodeRecord:
        node = self.feed.models.nodes.get(node_id)
        if node is None:
            raise not_found(f"node {node_id}")
        return node

    async def _append(self, stream: str, expected: int | None, events: list[Event]) -> None:
        envelopes = await self.store.append(stream, expected, events, _metadata())
        await self.feed.deliver_all(envelopes)


def _require_storable(spec: JobSpec) -> None:
    """PostgreSQL's jsonb holds no NUL character, and JSON no lone surrogate: such a spec is
    invalid input, not a server error."""
    try:
        encoded = spec.model_dump_json()
    except ValueError:
        encoded = "\\u0000"
    if "\\u0000" in encoded:
        raise ProblemError(
            422, "validation-error", "the job spec must not contain NUL or unpaired surrogates"
        )


def _require_launchable_env(spec: JobSpec) -> None:
    """A variable name with `=` (or NUL, or none at all) can never reach a process's
    environment: the job would only fail at launch, so it is refused at submit."""
    for name in spec.env:
        if not name or "=" in name or "\0" in name:
            raise ProblemError(
                422,
                "validation-error",
                f"env: illegal environment variable name {name!r} "
                "(names must be non-empty, without '=' or NUL)",
            )


def _metadata() -> Metadata:
    # Each command starts a causal chain; the services' reactions carry its correlation id.
    return Metadata(correlation_id=uuid4())


def _past(kind: Request) -> str:
    return {"cancel": "cancelled", "suspend": "suspended", "resume": "resumed"}[kind]
