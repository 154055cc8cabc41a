"""The API's write side: each user command checks the read model, appends, and applies.

Commands decide on the latest state of their stream: it is synced from the log first, and the
append expects exactly that version, so a concurrent writer makes us re-read and decide again.
The appended events are applied to the read models at once, which gives read-your-writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final, Literal, TypeVar
from uuid import UUID, uuid4, uuid5

from pydantic import ValidationError
from pydantic_core import to_json

from core.queue_rules import Quota, quota_problem
from core.submit_share import budget_wait, share_wait
from schemas.base import Event
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    MAX_DEPENDENCIES,
    JobCancelRequested,
    JobChanges,
    JobHeld,
    JobHoldReleased,
    JobResumeRequested,
    JobSpec,
    JobState,
    JobSubmitted,
    JobSuspendRequested,
    JobUpdated,
    array_element_id,
)
from schemas.nodes import NodeDrainRequested, NodeUndrained
from schemas.teams import (
    QueueConfigured,
    TeamCreated,
    TeamKeyDeleted,
    TeamPolicyConfigured,
    TeamSecretDeleted,
    TeamSecretSet,
    TeamTokenIssued,
    TeamTokenRevoked,
    token_id_of,
)
from services.api.auth import Principal, new_token, token_sha256
from services.api.feed import ReadModelFeed
from services.api.models import DrainBody, QueueConfig, QueuePatch, TeamCreate, TeamPolicyBody
from services.api.pipelines import (
    DRAWN_JOB_ID,
    MAX_SUBMIT_JOBS,
    PlannedJob,
    owned,
    plan_submissions,
    planned_ids,
)
from services.api.problems import ProblemError, conflict, not_found
from services.api.projections.jobs import JobReadModel, Request, request_allowed
from services.api.projections.nodes import NodeRecord
from services.api.projections.queues import QueueRecord
from services.api.projections.tenancy import TokenRecord
from services.api.ratelimit import SubmissionLimiter, rate_limited, retry_after
from services.api.validation import PRIORITY_CLASSES, check_submission, invalid
from services.runtime import vault
from services.runtime.errors import ConcurrencyConflict
from services.runtime.records import Metadata, StreamAppend
from services.runtime.store import EventStore

ATTEMPTS: Final = 5
# What one team may hold (each API process keeps all of it in memory): tokens not revoked,
# tokens ever issued (a revoked token's name stays taken), secrets.
MAX_LIVE_TOKENS_PER_TEAM = 100
MAX_TOKENS_PER_TEAM = 10_000
MAX_SECRETS_PER_TEAM = 1_000

# What a decision taken by `_at_head_if_refused` returns.
_Decided = TypeVar("_Decided")
JOB_ID_HEX: Final = 12
# Held by the transaction that checks and writes a change of the quota tree (a team or a
# queue configured): one such change at a time, in every API process.
_QUOTA_TREE_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtextextended('gangway.quota_tree', 0))"
# A team's queue is created with it; an existing queue (an organisation's) is never taken over.
_QUEUE_TAKEN: Final = (
    "a queue named {name} already exists (an organisation's queue?); a team brings a new queue "
    "of its name: choose another name, or make the team a child of it (parent)"
)
# What a team over its pending cap is told to wait: pending jobs leave as capacity frees.
PENDING_RETRY_AFTER_S: Final = 10.0

RequestEvent = type[JobCancelRequested | JobSuspendRequested | JobResumeRequested]
_REQUEST_EVENTS: Final[dict[Request, RequestEvent]] = {
    "cancel": JobCancelRequested,
    "suspend": JobSuspendRequested,
    "resume": JobResumeRequested,
}


# A hold keeps a job from being placed: it makes sense only while the job waits.
HOLDABLE_STATES: Final[frozenset[JobState]] = frozenset({"pending", "queued", "suspended"})
# A PATCH changes a job that holds no GPUs and has not ended.
UPDATABLE_STATES: Final[frozenset[JobState]] = frozenset({"pending", "queued", "suspended"})


def new_job_id() -> str:
    """12 random hex digits: the first 6 bytes of a uuid4, whose random bits they all are,
    without building the UUID (uuid4().hex cost three times as much, on every submission)."""
    return os.urandom(JOB_ID_HEX // 2).hex()


def idempotent_job_id(principal: str, key: str) -> str:
    """The same caller's same Idempotency-Key names the same job (another caller's does not)."""
    digest = hashlib.sha256(f"{principal}\0{key}".encode()).hexdigest()
    return digest[:JOB_ID_HEX]


# The route a keyed request came by: the same specs sent to `POST /v1/jobs` and to
# `POST /v1/jobs:batch` are two requests (their answers differ), never one retried.
SubmitRoute = Literal["job", "batch"]
# Request fingerprints are name-based UUIDs (version 5) in this namespace; fixed for ever, since
# the log keeps them.
_FINGERPRINTS: Final = UUID("0b7e43a2-5f1c-4d8e-9a26-c3f1e0d4b857")


def request_fingerprint(
    principal: str, key: str, route: SubmitRoute, specs: Sequence[JobSpec]
) -> UUID:
    """What one Idempotency-Key was used for: the caller, the key, the route and every spec as
    submitted (dict keys sorted, so that a retry serialising its env in another order is still
    the same request). Recorded as the correlation id of the events the request writes."""
    body = json.dumps([spec.model_dump(mode="json") for spec in specs], sort_keys=True)
    return uuid5(_FINGERPRINTS, "\0".join((principal, key, route, body)))


def keyed_job_ids(principal: str, key: str, count: int) -> list[str]:
    """The ids of a keyed request's `count` jobs (an array's is its own, its elements' follow
    from it): the first is the key's own id, each other one the key's with its index."""
    return [
        idempotent_job_id(principal, f"{key}\0{index}")
        if index
        else idempotent_job_id(principal, key)
        for index in range(count)
    ]


def key_claims(principal: str, key: str) -> tuple[str, str]:
    """The two job ids any request with this key may write first: the job `K`, or the first
    element `K_0` of an array `K`. Every keyed request writes one and guards the other (expects
    both new), so that any two requests with one key conflict, whatever they hold."""
    first = idempotent_job_id(principal, key)
    return first, array_element_id(first, 0)


class Commands:
    def __init__(
        self,
        store: EventStore,
        feed: ReadModelFeed,
        limiter: SubmissionLimiter | None = None,
        *,
        shared_jobs_per_second: float | None = None,
        shared_max_wait_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.feed = feed
        self.limiter = limiter or SubmissionLimiter(store.pool)
        # The submit path's jobs a second shared among teams while several submit
        # (core/submit_share.py); the clock is the log's, whose recorded times it compares.
        self.shared_jobs_per_second = shared_jobs_per_second
        self.shared_max_wait_s = shared_max_wait_s
        self.clock = clock
        # Jobs per team let through the share here and not yet in the read models: a flood's
        # requests held at once and let through together must not all count as none.
        self._in_flight: Counter[str] = Counter()
        # Per team, the jobs let past the pending cap and not yet in the read models (or
        # refused after it): the cap's check counts them as pending.
        self._claimed: Counter[str] = Counter()
        # This process's one change of the quota tree at a time (`_write_quota`).
        self._quota_tree = asyncio.Lock()
        # Per team, this process's one set of a secret at a time (`set_secret`).
        self._secret_sets: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def submit(
        self, principal: Principal, spec: JobSpec, *, idempotency_key: str | None = None
    ) -> JobReadModel:
        principal.require_team(spec.team)
        if spec.array is not None or spec.depends_on or idempotency_key is not None:
            [planned] = await self.submit_many(
                principal, [spec], batch=False, idempotency_key=idempotency_key
            )
            return self.feed.models.jobs[planned.events[0].job_id]
        # The event is dumped once, here, before the checks: its JSON is what the log stores,
        # and what `_require_storable` refuses is refused first, as always.
        event = JobSubmitted(job_id=new_job_id(), spec=spec, submitted_by=principal.name)
        payload = _submitted_payload(event)
        await self._check([spec])
        await self._within_limits(spec.team)
        try:
            for attempt in range(ATTEMPTS):
                if attempt:  # an id collision: draw another
                    event = JobSubmitted(
                        job_id=new_job_id(), spec=spec, submitted_by=principal.name
                    )
                    payload = event.model_dump_json()
                try:
                    envelopes = await self.store.append_many(
                        [StreamAppend(event.stream, 0, [event], (payload,))], _metadata()
                    )
                except ConcurrencyConflict:
                    continue
                await self.feed.deliver_all(envelopes)
                return self.feed.models.jobs[event.job_id]
        finally:
            self._landed({spec.team: 1})
        raise RuntimeError("could not draw an unused job id")

    async def submit_many(
        self,
        principal: Principal,
        specs: Sequence[JobSpec],
        *,
        batch: bool = True,
        idempotency_key: str | None = None,
    ) -> list[PlannedJob]:
        """Several jobs (a batch, an array, a pipeline) in one append: all of them, or none.

        With an Idempotency-Key, the ids derive from the caller and the key, the events carry
        the request's fingerprint as their correlation id, and the append claims the key
        (`key_claims`): the same request again gets what it created the first time, any other
        request with the key a 422.
        """
        models = self.feed.models
        names = {spec.name for spec in specs} if batch else set()
        claims = key_claims(principal.name, idempotency_key) if idempotency_key else ()
        # A retry of a request that created jobs finds them even when the team is now at its
        # limits (those jobs count towards the cap): it creates nothing, whatever it is.
        retry = any(job_id in models.jobs for job_id in claims)
        # Limits first: looking up ids this process has not seen costs database reads, which a
        # team past its rate or cap must not get for free.
        passed: dict[str, int] = {}
        try:
            for team in sorted({spec.team for spec in specs}):
                principal.require_team(team)
                count = sum(s.array.count if s.array else 1 for s in specs if s.team == team)
                if not retry:
                    await self._within_limits(team, count)
                    passed[team] = count
            return await self._submit_planned(
                principal, specs, names, claims, batch=batch, idempotency_key=idempotency_key
            )
        finally:
            self._landed(passed)

    async def _submit_planned(
        self,
        principal: Principal,
        specs: Sequence[JobSpec],
        names: set[str],
        claims: Sequence[str],
        *,
        batch: bool,
        idempotency_key: str | None,
    ) -> list[PlannedJob]:
        """`submit_many` past the limits: dependencies learnt, the jobs planned and appended."""
        models = self.feed.models
        metadata = _metadata()
        if idempotency_key is not None:
            route: SubmitRoute = "batch" if batch else "job"
            fingerprint = request_fingerprint(principal.name, idempotency_key, route, specs)
            metadata = Metadata(correlation_id=fingerprint)
            if any(job_id in models.jobs for job_id in claims):
                # The key was used (so `submit_many` asked no limits): its request is known
                # by its fingerprint before anything is learnt, planned or appended. Another
                # request under it cost a team past its rate, for free, a plan, a failed
                # append and a read per job it named (a 1,000-job batch: ~0.2 s of the API's
                # worker, each time).
                retried = await self._retried(
                    principal, specs, claims, idempotency_key, fingerprint
                )
                if retried is not None:
                    return retried
        # Not known here as the team's own: another team's job this API has seen counts as
        # one it has not, or the limit below would tell a team which of other teams' ids exist.
        unseen = {
            dependency.job
            for spec in specs
            for dependency in spec.depends_on
            # A batch's name shaped like a drawn id may also be an existing job: learn it too,
            # or another process's job of that id would be missed, not found ambiguous.
            if (dependency.job not in names or DRAWN_JOB_ID.fullmatch(dependency.job))
            and owned(dependency.job, spec.team, models) is None
        }
        if len(unseen) > MAX_DEPENDENCIES:
            raise ProblemError(
                422,
                "too-many-dependencies",
                f"this request depends on {len(unseen)} jobs this API does not know as the "
                f"team's; at most {MAX_DEPENDENCIES} per request",
            )
        for job_id in sorted(unseen):
            await self._learn(job_id)
        for _ in range(ATTEMPTS):
            if idempotency_key is not None:
                ids = keyed_job_ids(principal.name, idempotency_key, len(specs))
            else:
                ids = [new_job_id() for _ in specs]
            dumps = _SpecDumps()
            try:
                planned = await self._at_head_if_refused(
                    partial(
                        plan_submissions,
                        principal,
                        specs,
                        models,
                        ids,
                        batch=batch,
                        storable=dumps.storable,
                    )
                )
            except ProblemError:
                # Refused at the log's head, where a keyed request's jobs are known once
                # written. A retry is answered by what the request created, not judged again
                # by rules changed since (a queue's max_gpus lowered, a class restricted): it
                # was told "nothing was submitted" of jobs that exist, and a client that then
                # corrected and resent its request created them twice. A key used for another
                # request is told so (`_require_retry`); one too large ever to have been
                # written is refused as it is, without a read of each job it names.
                width = sum(spec.array.count if spec.array else 1 for spec in specs)
                if width > MAX_SUBMIT_JOBS or not any(job_id in models.jobs for job_id in claims):
                    raise
                planned = planned_ids(principal, specs, ids)
                await self._require_retry(planned, claims, metadata.correlation_id)
                return planned
            appends = [
                StreamAppend(event.stream, 0, [event], (dumps.payload(event),))
                for job in planned
                for event in job.events
            ]
            written = {append.stream for append in appends}
            appends += [
                StreamAppend(f"job-{job_id}", 0, [])  # a guard: expects it new, writes nothing
                for job_id in claims
                if f"job-{job_id}" not in written
            ]
            try:
                envelopes = await self.store.append_many(appends, metadata)
            except ConcurrencyConflict:
                if idempotency_key is None:
                    continue  # an id collision: draw others
                await self._require_retry(planned, claims, metadata.correlation_id)
                return planned  # the same request, retried: what it created the first time
            await self.feed.deliver_all(envelopes)
            return planned
        raise RuntimeError("could not draw unused job ids")

    async def _check(self, specs: Sequence[JobSpec]) -> None:
        """Raise the 4xx problem for the first spec refused (`check_submission`)."""
        models = self.feed.models

        def check() -> None:
            for spec in specs:
                check_submission(spec, models)

        await self._at_head_if_refused(check)

    async def _at_head_if_refused(self, decide: Callable[[], _Decided]) -> _Decided:
        """`decide` by what this worker knows; a refusal (a 4xx problem) is asked again once
        its fold reaches the log's head: the team, its queue or its policy may have been
        written through another worker a moment ago (read-your-writes across workers). What
        is accepted costs no look-up."""
        try:
            return decide()
        except ProblemError:
            await self.feed.reach_head()
            return decide()

    async def _require_retry(
        self, planned: Sequence[PlannedJob], claims: Sequence[str], fingerprint: UUID | None
    ) -> None:
        """Bring the jobs of a keyed request the log already holds into the read models, or
        422 when the key was used for another request (`_fingerprinted`)."""
        if await self._fingerprinted(claims, fingerprint):
            await self._sync_missing(planned)
            return
        # Written before requests carried a fingerprint: the specs are all it can compare.
        models = self.feed.models
        for job in planned:
            for event in job.events:
                await self.feed.sync_stream(event.stream)
        if not all(
            event.job_id in models.jobs and models.jobs[event.job_id].spec == event.spec
            for job in planned
            for event in job.events
        ):
            raise _key_reused()

    async def _retried(
        self,
        principal: Principal,
        specs: Sequence[JobSpec],
        claims: Sequence[str],
        key: str,
        fingerprint: UUID,
    ) -> list[PlannedJob] | None:
        """What the request of a used key created, when this is that request (read from the
        log where this process has not seen it); 422 when the key was used for another. None
        when its first event carries no fingerprint (written before they did): then only its
        specs, as planned, can tell (`_require_retry`)."""
        if not await self._fingerprinted(claims, fingerprint):
            return None
        # The very request that was written: its jobs are as many as were planned then.
        planned = planned_ids(principal, specs, keyed_job_ids(principal.name, key, len(specs)))
        await self._sync_missing(planned)
        return planned

    async def _fingerprinted(self, claims: Sequence[str], fingerprint: UUID | None) -> bool:
        """Whether the request first written under a key's claims carries a fingerprint and it
        is this request's; 422 when it carries another request's (the key was used for it).
        False: no fingerprint to go by (none written, or written before requests had one)."""
        recorded = await self._key_fingerprint(claims)
        if recorded is None or recorded.version != 5:
            return False
        if recorded != fingerprint:
            raise _key_reused()
        return True

    async def _key_fingerprint(self, claims: Sequence[str]) -> UUID | None:
        """The correlation id of the first event written under a key's claims (a keyed
        request's fingerprint), or None when there is none."""
        for job_id in claims:
            events = await self.store.read_stream(f"job-{job_id}")
            if events:
                return events[0].correlation_id
        return None

    async def _sync_missing(self, planned: Sequence[PlannedJob]) -> None:
        """Read the planned jobs this process has not seen from the log (another API process
        wrote them): one read per job it lacks, none for those it holds."""
        models = self.feed.models
        for job in planned:
            for event in job.events:
                if event.job_id not in models.jobs:
                    await self.feed.sync_stream(event.stream)

    async def targets(self, principal: Principal, job_id: str) -> list[str]:
        """The job, or every element of the array of that id; 404 for what the caller may
        not see."""
        models = self.feed.models
        await self._learn(job_id)
        if job_id in models.jobs:
            principal.visible(models.jobs[job_id], job_id)
            return [job_id]
        elements = models.arrays.get(job_id)
        if not elements:
            raise not_found(f"job {job_id}")
        principal.visible(models.jobs[elements[0]], job_id)
        return list(elements)

    async def _learn(self, job_id: str) -> None:
        """Read a job or an array this process has not seen yet from the log (another API
        process may have written it a moment ago)."""
        models = self.feed.models
        if job_id in models.jobs or job_id in models.arrays:
            return
        await self.feed.sync_stream(f"job-{job_id}")
        if job_id in models.jobs:
            return
        first = array_element_id(job_id, 0)
        await self.feed.sync_stream(f"job-{first}")
        element = models.jobs.get(first)
        if element is None or element.array_id != job_id or element.spec.array is None:
            return
        for index in range(1, element.spec.array.count):
            await self.feed.sync_stream(f"job-{array_element_id(job_id, index)}")

    async def change(
        self,
        principal: Principal,
        job_id: str,
        decide: Callable[[JobReadModel], list[Event]],
        *,
        none_can: str | None = None,
    ) -> list[JobReadModel]:
        """Record what `decide` makes of the job's latest state (409 when it refuses), for
        one job or each element of an array (elements it refuses are left as they are,
        unless it refuses them all: then `none_can`, if given, is the 409's detail)."""
        ids = await self.targets(principal, job_id)
        if len(ids) == 1:
            await self._change_one(principal, ids[0], decide)
            return [self.feed.models.jobs[ids[0]]]
        if not await self._change_all_at_head(ids, decide, none_can):
            # An element moved between the look and the write: each is decided again.
            await self._change_each(principal, ids, decide, none_can)
        return [self.feed.models.jobs[target] for target in ids]

    async def _change_all_at_head(
        self,
        ids: Sequence[str],
        decide: Callable[[JobReadModel], list[Event]],
        none_can: str | None,
    ) -> bool:
        """Every element decided as of the log's head (one look, not a read per element) and
        written in one append, each stream at the version judged; False, with nothing
        written, when one moved meanwhile. An element refused for anything but its state (a
        PATCH invalid for its spec) refuses the whole request: a 4xx writes nothing."""
        await self.feed.reach_head()
        models = self.feed.models
        appends: list[StreamAppend] = []
        refusals: list[ProblemError] = []
        for target in ids:
            try:
                events = decide(models.jobs[target])
            except ProblemError as problem:
                if problem.status != 409:
                    raise
                refusals.append(problem)  # this element cannot (an ended one): others do
                continue
            if events:
                stream = f"job-{target}"
                appends.append(StreamAppend(stream, models.version_of(stream), events))
        if len(refusals) == len(ids):
            raise conflict(none_can) if none_can is not None else refusals[-1]
        try:
            envelopes = await self.store.append_many(appends, _metadata())
        except ConcurrencyConflict:
            return False
        await self.feed.deliver_all(envelopes)
        return True

    async def _change_each(
        self,
        principal: Principal,
        ids: Sequence[str],
        decide: Callable[[JobReadModel], list[Event]],
        none_can: str | None,
    ) -> None:
        applied = 0
        refused: ProblemError | None = None
        for target in ids:
            try:
                await self._change_one(principal, target, decide)
            except ProblemError as problem:
                if problem.status != 409:
                    raise
                refused = problem
                continue
            applied += 1
        if applied == 0 and refused is not None:
            raise conflict(none_can) if none_can is not None else refused

    async def _change_one(
        self, principal: Principal, job_id: str, decide: Callable[[JobReadModel], list[Event]]
    ) -> JobReadModel:
        stream = f"job-{job_id}"
        for _ in range(ATTEMPTS):
            await self.feed.sync_stream(stream)
            job = principal.visible(self.feed.models.jobs.get(job_id), job_id)
            events = decide(job)
            if not events:
                return job  # nothing to change: asking twice records nothing new
            try:
                await self._append(stream, self.feed.models.version_of(stream), events)
            except ConcurrencyConflict:
                continue
            return self.feed.models.jobs[job_id]
        raise conflict(f"job {job_id} is changing too fast; try again")

    def hold_decision(self, principal: Principal) -> Callable[[JobReadModel], list[Event]]:
        def decide(job: JobReadModel) -> list[Event]:
            if job.state not in HOLDABLE_STATES:
                raise conflict(f"job {job.id} is {job.state}; only a waiting job can be held")
            return [] if job.held else [JobHeld(job_id=job.id, by=principal.name)]

        return decide

    def release_decision(self, principal: Principal) -> Callable[[JobReadModel], list[Event]]:
        def decide(job: JobReadModel) -> list[Event]:
            if job.terminal:
                raise conflict(f"job {job.id} is {job.state}; there is no hold to release")
            return [JobHoldReleased(job_id=job.id, by=principal.name)] if job.held else []

        return decide

    def update_decision(
        self, principal: Principal, changes: JobChanges, hold: bool | None
    ) -> Callable[[JobReadModel], list[Event]]:
        """A PATCH: the changed spec is validated as a submission would be; a job that holds
        GPUs or has ended cannot change (409)."""

        def decide(job: JobReadModel) -> list[Event]:
            if job.state not in UPDATABLE_STATES:
                raise conflict(
                    f"job {job.id} is {job.state}; only a pending, queued or suspended job "
                    "can be changed"
                )
            try:
                spec = changes.applied_to(job.spec)
            except ValidationError as error:
                raise invalid("validation-error", _first_error(error)) from None
            check_submission(spec, self.feed.models)
            events: list[Event] = []
            if spec != job.spec:
                events.append(JobUpdated(job_id=job.id, by=principal.name, changes=changes))
            if hold is not None and hold != job.held:
                if hold and job.state not in HOLDABLE_STATES:
                    raise conflict(f"job {job.id} is {job.state}; only a waiting job can be held")
                kind = JobHeld if hold else JobHoldReleased
                events.append(kind(job_id=job.id, by=principal.name))
            return events

        return decide

    def request_decision(
        self, principal: Principal, kind: Request
    ) -> Callable[[JobReadModel], list[Event]]:
        """The user's request to cancel, suspend or resume; 409 when the state forbids it."""

        def decide(job: JobReadModel) -> list[Event]:
            if not request_allowed(job, kind):
                raise conflict(f"job {job.id} is {job.state}; it cannot be {_past(kind)}")
            if kind in job.requests:
                return []  # already requested: asking twice records nothing new
            return [_REQUEST_EVENTS[kind](job_id=job.id, by=principal.name)]

        return decide

    async def request_each(
        self, principal: Principal, job_id: str, kind: Request
    ) -> list[JobReadModel]:
        """A request for a job, or for each element of an array (an element whose state
        forbids it is left alone, unless every one does)."""
        none_can = f"no element of array {job_id} can be {_past(kind)}"
        return await self.change(
            principal, job_id, self.request_decision(principal, kind), none_can=none_can
        )

    async def create_team(self, body: TeamCreate) -> str:
        """Record the team and its queue; return the token, which only its creator ever sees."""
        if body.name in self.feed.models.teams:
            raise conflict(f"team {body.name} already exists")
        await self.feed.sync_stream(f"queue-{body.name}")
        if body.name in self.feed.models.queues:
            raise conflict(_QUEUE_TAKEN.format(name=body.name))
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
            # The queue must be new too: a team never takes over an existing queue.
            envelopes = await self._write_quota(
                body.name,
                lambda: (
                    Quota(body.parent, body.guaranteed_gpus, body.max_gpus),
                    [StreamAppend(team.stream, 0, [team]), StreamAppend(queue.stream, 0, [queue])],
                ),
            )
        except ConcurrencyConflict as clash:
            if clash.stream == queue.stream:
                raise conflict(_QUEUE_TAKEN.format(name=body.name)) from None
            raise conflict(f"team {body.name} already exists") from None
        await self.feed.deliver_all(envelopes)
        return token

    async def configure_queue(self, name: str, body: QueueConfig) -> QueueRecord:
        # Refused at once if it does not fit now; checked again at the head by the write.
        self._require_valid_quota(name, Quota(body.parent, body.guaranteed_gpus, body.max_gpus))
        return await self._configure_queue(name, lambda: body)

    async def _configure_queue(self, name: str, config: Callable[[], QueueConfig]) -> QueueRecord:
        """Write `config()`, taken at the log's head under the quota tree's lock, as the
        queue's whole configuration (last writer wins: a value, not a delta)."""

        def plan() -> tuple[Quota, list[StreamAppend]]:
            body = config()
            quota = Quota(body.parent, body.guaranteed_gpus, body.max_gpus)
            self._require_valid_quota(name, quota)  # a 422 before the event's own check
            event = QueueConfigured(
                name=name,
                parent=body.parent,
                guaranteed_gpus=body.guaranteed_gpus,
                max_gpus=body.max_gpus,
                weight=body.weight,
                max_cpus=body.max_cpus,
                max_memory_mb=body.max_memory_mb,
            )
            return quota, [StreamAppend(event.stream, None, [event])]

        envelopes = await self._write_quota(name, plan)
        await self.feed.deliver_all(envelopes)
        return self.feed.models.queues[name]

    async def _within_limits(self, team: str, count: int = 1) -> None:
        """429 when the team is at its pending cap (or `count` more jobs would pass it), past
        its share of the submit path while other teams submit too (every job counts), or past
        its submission rate (a request of several jobs takes one submission's turn)."""
        models = self.feed.models
        policy = models.tenancy.policy_of(team)
        # Jobs this process let past the cap that its fold does not hold yet count too:
        # requests checked at once each saw the same count, and all of them passed (60 of a
        # team's submissions at once against a cap of 5 all landed).
        pending = models.waiting_by_team[team] + self._claimed[team]
        if policy.max_pending_jobs is not None and pending + count > policy.max_pending_jobs:
            # Jobs that left the queue may be in the log and not yet in this worker's fold (a
            # cancel through another worker, the scheduler's placements): refuse only by the
            # log's head, never by a stale count.
            await self.feed.reach_head()
            policy = models.tenancy.policy_of(team)
            pending = models.waiting_by_team[team] + self._claimed[team]
        if policy.max_pending_jobs is not None and pending + count > policy.max_pending_jobs:
            more = f" and this request adds {count}" if count > 1 else ""
            raise ProblemError(
                429,
                "too-many-pending",
                f"team {team!r} has {pending} pending jobs{more}; its limit is "
                f"{policy.max_pending_jobs}",
                headers={"Retry-After": retry_after(PENDING_RETRY_AFTER_S)},
            )
        self._claimed[team] += count
        try:
            await self._within_share(team, count, policy.jobs_per_second)
            wait = await self.limiter.take(team, policy.submissions_per_second)
            if wait is not None:
                raise rate_limited(
                    f"team {team!r} may make {policy.submissions_per_second:g} submissions per "
                    "second (a batch or an array is one; max_pending_jobs bounds the jobs)",
                    wait,
                )
        except BaseException:
            _release(self._claimed, team, count)
            raise
        self._in_flight[team] += count

    def _landed(self, passed: dict[str, int]) -> None:
        """The jobs `_within_limits` let through are recorded in the read models, or never
        will be: they no longer count as in flight."""
        for team, count in passed.items():
            _release(self._in_flight, team, count)
            _release(self._claimed, team, count)

    async def _within_share(self, team: str, count: int, jobs_per_second: float | None) -> None:
        """Wait (at most `shared_max_wait_s`) until the team's budget of jobs a second, and its
        share of the submit path while other teams submit too, have room for `count` more
        jobs; past the wait, 429. Held, a request costs no CPU, and a flood of a few clients is
        so spread over the second instead of arriving at once; a team within both never
        waits."""
        shared = self.shared_jobs_per_second
        recent = self.feed.models.recent_submissions
        in_flight = self._in_flight

        def waits(now: float) -> tuple[float | None, float | None]:
            held = in_flight[team]
            return (
                budget_wait(recent, team, count, jobs_per_second, now, held),
                share_wait(recent, team, count, shared, now, held),
            )

        now = self.clock()
        own, fair = waits(now)
        deadline = now + self.shared_max_wait_s
        while own is not None or fair is not None:
            wait = max(w for w in (own, fair) if w is not None)
            if now + wait > deadline:
                break
            await asyncio.sleep(wait)
            now = self.clock()
            own, fair = waits(now)
        else:
            return
        if own is not None:
            raise rate_limited(
                f"team {team!r} may submit {jobs_per_second:g} jobs a second (each job of a "
                "batch or an array counts)",
                own,
            )
        assert fair is not None
        raise ProblemError(
            429,
            "fair-share-exceeded",
            f"other teams are submitting too: the {shared:g} jobs a second the submit path "
            f"takes are shared among them, and team {team!r} has used its share of this "
            "second (each job of a batch or an array counts)",
            headers={"Retry-After": retry_after(fair)},
        )

    # ------------------------------------------------------------------ teams

    async def _known_team(self, team: str) -> None:
        """404 unless the team exists; a team this worker has not seen yet may have been
        created through another worker a moment ago: its fold reaches the log's head first."""
        if team not in self.feed.models.teams:
            await self.feed.reach_head()
        self._require_team(team)

    def _require_team(self, team: str) -> None:
        """404 unless this worker knows the team (a read: its barrier has caught up already)."""
        if team not in self.feed.models.teams:
            raise not_found(f"team {team}")

    async def configure_policy(self, team: str, body: TeamPolicyBody) -> None:
        await self._known_team(team)
        unknown = sorted(set(body.allowed_priority_classes or ()) - PRIORITY_CLASSES)
        if unknown:
            raise invalid("unknown-priority", f"unknown priority classes: {', '.join(unknown)}")
        # The admin's policy is the whole value (DESIGN §8): the installation's default limits
        # hold only teams that have none.
        event = TeamPolicyConfigured(
            team=team,
            allowed_priority_classes=body.allowed_priority_classes,
            non_preemptible_allowed=body.non_preemptible_allowed,
            max_pending_jobs=body.max_pending_jobs,
            submissions_per_second=body.submissions_per_second,
            jobs_per_second=body.jobs_per_second,
        )
        await self._append(event.stream, None, [event])

    async def issue_token(self, principal: Principal, team: str, name: str) -> tuple[str, str]:
        """A further named token of the team: (its id, the token, shown only now)."""
        principal.require_team(team)
        await self._known_team(team)
        token = new_token()
        digest = token_sha256(token)
        event = TeamTokenIssued(
            team=team, token_id=token_id_of(digest), name=name, token_sha256=digest
        )
        tenancy = self.feed.models.tenancy
        models = self.feed.models
        for _ in range(ATTEMPTS):
            await self.feed.sync_stream(event.stream)
            held = tenancy.team_tokens.get(team, {})
            # The name is who acted in every event the token causes (`team:<team>/<name>`):
            # two tokens of one name, ever, and the log could not tell which one did it.
            if name in held:
                raise conflict(
                    f"team {team!r} already has a token named {name!r} (names are never reused: "
                    "events name the token that acted)"
                )
            # Every token is kept by every API process (and every name, revoked or not, since
            # names are never reused): a team minting them at its command rate would grow
            # each process's memory without end.
            if tenancy.live_tokens(team) >= MAX_LIVE_TOKENS_PER_TEAM:
                raise ProblemError(
                    409,
                    "too-many-tokens",
                    f"team {team!r} holds {MAX_LIVE_TOKENS_PER_TEAM} tokens that are not "
                    "revoked, its most: revoke one first",
                )
            if len(held) >= MAX_TOKENS_PER_TEAM:
                raise ProblemError(
                    409,
                    "too-many-tokens",
                    f"team {team!r} was issued {MAX_TOKENS_PER_TEAM} tokens, its most "
                    "(revoked ones count: their names stay taken); ask the administrator",
                )
            try:
                await self._append(event.stream, models.version_of(event.stream), [event])
            except ConcurrencyConflict:
                continue  # the team's stream moved (another token issued): look again
            return event.token_id, token
        raise conflict(f"team {team}'s tokens are changing too fast; try again")

    def tokens(self, principal: Principal, team: str) -> list[TokenRecord]:
        principal.require_team(team)
        self._require_team(team)
        return list(self.feed.models.tenancy.team_tokens.get(team, {}).values())

    async def revoke_token(self, principal: Principal, team: str, token_id: str) -> None:
        principal.require_team(team)
        await self.feed.sync_stream(f"team-{team}")
        token = self.feed.models.tenancy.tokens.get(token_id)
        if token is None or token.team != team:
            raise not_found(f"token {token_id} of team {team}")
        if token.revoked:
            return  # revoking twice records nothing new
        event = TeamTokenRevoked(team=team, token_id=token_id)
        await self._append(event.stream, None, [event])

    async def set_secret(self, principal: Principal, team: str, name: str, value: str) -> None:
        """Seal the value with the team's key and record only the ciphertext."""
        principal.require_team(team)
        await self._known_team(team)
        # One set of the team's secrets at a time in this process: those sent at once would
        # otherwise all but one conflict, and a few such rounds refuse a plain burst.
        async with self._secret_sets[team]:
            await self._set_secret(team, name, value)

    async def _set_secret(self, team: str, name: str, value: str) -> None:
        stream = f"secrets-{team}"
        models = self.feed.models
        for _ in range(ATTEMPTS):
            await self.feed.sync_stream(stream)
            held = models.tenancy.secrets.get(team, set())
            if name not in held and len(held) >= MAX_SECRETS_PER_TEAM:
                # Each API process keeps every team's secret names; each agent may resolve them.
                raise ProblemError(
                    409,
                    "too-many-secrets",
                    f"team {team!r} holds {MAX_SECRETS_PER_TEAM} secrets, its most: "
                    "delete one first",
                )
            # A new name at the version counted: secrets set at once were each counted before
            # any was written, and all of them passed the bound. A value replaced adds none.
            version = None if name in held else models.version_of(stream)
            try:
                async with self.store.pool.acquire() as conn, conn.transaction():
                    # The key stays locked until the sealed value is recorded: a deletion of the
                    # key comes wholly before (a new key seals it) or after (it is forgotten
                    # with the rest).
                    key_id, key = await vault.team_key(conn, team)
                    event = TeamSecretSet(
                        team=team,
                        name=name,
                        key_id=key_id,
                        ciphertext=vault.seal(key, team, name, value),
                    )
                    envelopes = await self.store.append(
                        stream, version, [event], _metadata(), conn=conn
                    )
            except ConcurrencyConflict:
                continue  # the team's secrets changed meanwhile: count again
            await self.feed.deliver_all(envelopes)
            return
        raise conflict(f"team {team}'s secrets are changing too fast; try again")

    def secrets(self, principal: Principal, team: str) -> list[str]:
        principal.require_team(team)
        self._require_team(team)
        return sorted(self.feed.models.tenancy.secrets.get(team, ()))

    async def delete_secret(self, principal: Principal, team: str, name: str) -> None:
        principal.require_team(team)
        await self.feed.sync_stream(f"secrets-{team}")
        if name not in self.feed.models.tenancy.secrets.get(team, ()):
            raise not_found(f"secret {name} of team {team}")
        event = TeamSecretDeleted(team=team, name=name)
        await self._append(event.stream, None, [event])

    async def delete_team_key(self, team: str) -> None:
        """Destroy the team's key, forgetting every secret it ever set, in old events too."""
        await self._known_team(team)
        async with self.store.pool.acquire() as conn, conn.transaction():
            key_id = await vault.delete_team_key(conn, team)
            event = TeamKeyDeleted(team=team, key_id=key_id)
            envelopes = await self.store.append(event.stream, None, [event], _metadata(), conn=conn)
        await self.feed.deliver_all(envelopes)

    async def patch_queue(self, name: str, body: QueuePatch) -> QueueRecord:
        """Change only the fields given; the rest keep their configured values."""
        await self.feed.sync_stream(f"queue-{name}")
        if name not in self.feed.models.queues:
            raise not_found(f"queue {name}")

        def merged() -> QueueConfig:
            # Merged at the head, under the lock: two PATCHes at once each merged what they
            # read before the other was written, and the later put the other's fields back.
            current = self.feed.models.queues.get(name)
            if current is None:
                raise not_found(f"queue {name}")
            given = body.model_fields_set
            return QueueConfig.model_construct(
                parent=body.parent if "parent" in given else current.parent,
                guaranteed_gpus=(
                    body.guaranteed_gpus
                    if "guaranteed_gpus" in given and body.guaranteed_gpus is not None
                    else current.guaranteed_gpus
                ),
                max_gpus=body.max_gpus if "max_gpus" in given else current.max_gpus,
                weight=body.weight if body.weight is not None else current.weight,
                max_cpus=body.max_cpus if "max_cpus" in given else current.max_cpus,
                max_memory_mb=(
                    body.max_memory_mb if "max_memory_mb" in given else current.max_memory_mb
                ),
            )

        return await self._configure_queue(name, merged)

    async def _write_quota(
        self, name: str, plan: Callable[[], tuple[Quota, list[StreamAppend]]]
    ) -> list[EventEnvelope]:
        """Append a change of the quota tree, `plan()` (queue `name`'s proposed quota and the
        appends), taken at the log's head, if the proposal fits the tree there.

        The check reads every queue while the append writes one stream: two changes that fit
        alone (a parent each way, two guarantees that together pass the cluster) checked at
        once were both written, a cycle or an oversubscribed tree kept by the log for good.
        Every such change, in any API process, is checked and written under one transaction
        lock, after reaching the log's head (which holds every change committed before it).
        One change at a time per process waits for that lock: each waiting on a connection of
        its own, as many changes as the pool's size took every connection, and the holder
        could not reach the head (it reads on another): the API answered no one."""
        async with (
            self._quota_tree,
            self.store.pool.acquire() as conn,
            conn.transaction(),
        ):
            await conn.execute(_QUOTA_TREE_LOCK)
            await self.feed.reach_head()
            proposed, appends = plan()
            self._require_valid_quota(name, proposed)
            return await self.store.append_many(appends, _metadata(), conn=conn)

    def _require_valid_quota(self, name: str, proposed: Quota) -> None:
        models = self.feed.models
        queues = {
            queue.name: Quota(queue.parent, queue.guaranteed_gpus, queue.max_gpus)
            for queue in models.queues.values()
            if queue.name != name
        }
        cluster_gpus = sum(len(node.gpu_indices) for node in models.nodes.values())
        record = models.queues.get(name)
        current = (
            None
            if record is None
            else Quota(record.parent, record.guaranteed_gpus, record.max_gpus)
        )
        problem = quota_problem(name, proposed, queues, cluster_gpus, current)
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


def _release(counter: Counter[str], team: str, count: int) -> None:
    counter[team] -= count
    if counter[team] <= 0:
        del counter[team]


def _require_storable(spec: JobSpec) -> int:
    """PostgreSQL's jsonb holds no NUL character, and JSON no lone surrogate: such a spec is
    invalid input, not a server error. Returns the size of the spec's JSON in bytes."""
    return len(_storable_json(spec).encode())


def _storable_json(spec: JobSpec) -> str:
    """The spec's JSON, or the 422 of `_require_storable`."""
    try:
        encoded = spec.model_dump_json()
    except ValueError:
        encoded = "\\u0000"
    if "\\u0000" in encoded:
        raise ProblemError(
            422, "validation-error", "the job spec must not contain NUL or unpaired surrogates"
        )
    return encoded


# JobSubmitted's fields in the order its JSON writes them: `_submitted_json` writes that JSON
# around a spec's own; for any other field list the event is dumped whole.
_SUBMITTED_FIELDS: Final = ("job_id", "spec", "submitted_by", "array_id", "array_index")
_SUBMITTED_LAID_OUT: Final = tuple(JobSubmitted.model_fields) == _SUBMITTED_FIELDS


def _submitted_json(event: JobSubmitted, spec_json: str) -> str:
    """`event.model_dump_json()`, given its spec's JSON: the same bytes (the other values by
    the same serializer, pydantic-core's), at a fifth of the cost (tests/api)."""
    if not _SUBMITTED_LAID_OUT:
        return event.model_dump_json()
    return (
        '{"job_id":'
        + to_json(event.job_id).decode()
        + ',"spec":'
        + spec_json
        + ',"submitted_by":'
        + to_json(event.submitted_by).decode()
        + ',"array_id":'
        + to_json(event.array_id).decode()
        + ',"array_index":'
        + to_json(event.array_index).decode()
        + "}"
    )


class _SpecDumps:
    """A request's specs as `_require_storable` dumped them, by identity: each JobSubmitted of
    a batch is written around its spec's JSON instead of being dumped whole, which dumped
    every spec a second time (measured: a bench spec's event dumped whole 5.5 us, written
    around its spec's JSON 1.1 us)."""

    def __init__(self) -> None:
        # id -> (the spec, kept alive so that its id is not reused, its JSON).
        self._dumped: dict[int, tuple[JobSpec, str]] = {}

    def storable(self, spec: JobSpec) -> int:
        encoded = _storable_json(spec)
        self._dumped[id(spec)] = (spec, encoded)
        return len(encoded.encode())

    def payload(self, event: JobSubmitted) -> str:
        """The event's JSON as the log stores it; a spec not dumped here (one whose
        dependencies were resolved into a copy) is dumped with its event."""
        found = self._dumped.get(id(event.spec))
        if found is None or found[0] is not event.spec:
            return event.model_dump_json()
        return _submitted_json(event, found[1])


def _submitted_payload(event: JobSubmitted) -> str:
    """The event's JSON as the log stores it; refuses what `_require_storable` refuses for
    its spec, in the same words. The spec's JSON is part of the event's, written by the same
    serializer, so a NUL or a lone surrogate there is found in the event's dump; only then is
    the spec dumped alone, so that a `\\u0000` elsewhere in the event refuses nothing."""
    try:
        payload = event.model_dump_json()
    except ValueError:
        _require_storable(event.spec)
        raise
    if "\\u0000" in payload:
        _require_storable(event.spec)
    return payload


def _key_reused() -> ProblemError:
    return ProblemError(
        422, "idempotency-key-reused", "this Idempotency-Key was used for a different request"
    )


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _metadata() -> Metadata:
    # Each command starts a causal chain; the services' reactions carry its correlation id.
    return Metadata(correlation_id=uuid4())


def _past(kind: Request) -> str:
    return {"cancel": "cancelled", "suspend": "suspended", "resume": "resumed"}[kind]
