"""An Idempotency-Key names one request: its route (`POST /v1/jobs` or `POST /v1/jobs:batch`)
and its whole body. Retrying that request gets what it created, and writes nothing; the key used
for any other request (another route, other specs, fewer or more jobs, an array instead of a
job) is refused with 422 idempotency-key-reused, and writes nothing either.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration


def spec(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "team": "nlp", "tasks": 1, "gpus_per_task": 1, **fields}


SINGLE = "/v1/jobs"
BATCH = "/v1/jobs:batch"


async def post(api: Api, route: str, body: dict[str, Any], key: str) -> Any:
    headers = {**api.teams["nlp"], "Idempotency-Key": key}
    return await api.client.post(route, json=body, headers=headers)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param((SINGLE, spec("a")), (BATCH, {"jobs": [spec("a")]}), id="job-then-batch"),
        pytest.param((BATCH, {"jobs": [spec("a")]}), (SINGLE, spec("a")), id="batch-then-job"),
        pytest.param(
            (BATCH, {"jobs": [spec("a"), spec("b")]}),
            (BATCH, {"jobs": [spec("a")]}),
            id="batch-then-its-first-job",
        ),
        pytest.param(
            (SINGLE, spec("sweep", array={"count": 2})),
            (SINGLE, spec("sweep")),
            id="array-then-job",
        ),
        pytest.param(
            (SINGLE, spec("sweep")),
            (SINGLE, spec("sweep", array={"count": 2})),
            id="job-then-array",
        ),
        pytest.param(
            (SINGLE, spec("sweep", array={"count": 2})),
            (BATCH, {"jobs": [spec("sweep", array={"count": 2})]}),
            id="array-then-batch-of-it",
        ),
    ],
)
async def test_a_key_used_for_another_request_is_refused_and_writes_nothing(
    api: Api,
    store: EventStore,
    first: tuple[str, dict[str, Any]],
    second: tuple[str, dict[str, Any]],
) -> None:
    await api.create_team("nlp")
    created = await post(api, *first, key="nightly")
    assert created.status_code == 201, created.text
    head = await store.head()
    reused = await post(api, *second, key="nightly")
    assert reused.status_code == 422, reused.text
    assert reused.headers["content-type"] == "application/problem+json"
    assert reused.json()["type"].endswith("/idempotency-key-reused")
    assert await store.head() == head


@pytest.mark.parametrize(
    ("route", "body"),
    [
        pytest.param(SINGLE, spec("a"), id="job"),
        pytest.param(SINGLE, spec("sweep", array={"count": 3}), id="array"),
        pytest.param(BATCH, {"jobs": [spec("a")]}, id="batch-of-one"),
        pytest.param(
            BATCH, {"jobs": [spec("a"), spec("b", depends_on=[{"job": "a"}])]}, id="pipeline"
        ),
    ],
)
async def test_the_same_request_retried_gets_what_it_created(
    api: Api, store: EventStore, route: str, body: dict[str, Any]
) -> None:
    await api.create_team("nlp")
    created = await post(api, route, body, key="retry-me")
    assert created.status_code == 201, created.text
    head = await store.head()
    again = await post(api, route, body, key="retry-me")
    assert again.status_code == 201, again.text
    assert _ids(again.json()) == _ids(created.json())
    assert await store.head() == head


async def test_a_key_is_the_callers_own(api: Api, store: EventStore) -> None:
    """Another team's same key is another request: it creates its own job."""
    await api.create_team("nlp")
    vision = await api.create_team("vision")
    ours = await post(api, SINGLE, spec("a"), key="shared-word")
    theirs = await api.client.post(
        SINGLE,
        json={**spec("a"), "team": "vision"},
        headers={**vision, "Idempotency-Key": "shared-word"},
    )
    assert ours.status_code == theirs.status_code == 201, theirs.text
    assert ours.json()["id"] != theirs.json()["id"]


async def test_a_retry_at_the_pending_cap_still_gets_its_job(api: Api) -> None:
    """The job a lost answer created counts towards the team's cap: its retry must find it,
    not be told to wait until the team has fewer pending jobs."""
    await api.create_team("nlp")
    policy = await api.client.put(
        "/v1/teams/nlp/policy", json={"max_pending_jobs": 1}, headers=api.as_admin()
    )
    assert policy.status_code == 200, policy.text
    created = await post(api, SINGLE, spec("a"), key="lost-answer")
    assert created.status_code == 201, created.text
    again = await post(api, SINGLE, spec("a"), key="lost-answer")
    assert again.status_code == 201, again.text
    assert again.json()["id"] == created.json()["id"]
    # ... while a new job is refused: the cap still holds.
    other = await post(api, SINGLE, spec("b"), key="another")
    assert other.status_code == 429, other.text


def _ids(body: dict[str, Any]) -> list[str]:
    if "jobs" in body:
        return [job["id"] for job in body["jobs"]]
    return [body["id"]]


@pytest.mark.parametrize(
    ("route", "body"),
    [
        pytest.param(SINGLE, spec("serve", priority="production"), id="job"),
        pytest.param(
            BATCH,
            {"jobs": [spec("small"), spec("serve", priority="production")]},
            id="batch",
        ),
    ],
)
async def test_a_retry_after_the_rules_changed_still_gets_what_it_created(
    api: Api, store: EventStore, route: str, body: dict[str, Any]
) -> None:
    """A lost answer's retry, after the team's policy withdrew the job's priority class: the
    jobs exist, so it must get them, not a refusal saying nothing was submitted (attack16: a
    client that believed it and resent a corrected request created its jobs twice)."""
    await api.create_team("nlp")
    created = await post(api, route, body, key="before-the-change")
    assert created.status_code == 201, created.text
    policy = await api.client.put(
        "/v1/teams/nlp/policy",
        json={"allowed_priority_classes": ["research"]},
        headers=api.as_admin(),
    )
    assert policy.status_code == 200, policy.text
    head = await store.head()
    again = await post(api, route, body, key="before-the-change")
    assert again.status_code == 201, again.text
    assert _ids(again.json()) == _ids(created.json())
    assert await store.head() == head
    # A new request of the same jobs is judged by the rules as they are now ...
    fresh = await post(api, route, body, key="after-the-change")
    assert fresh.status_code == 403, fresh.text
    # ... and the old key used for another request is told so, whatever that request holds.
    other = await post(
        api, BATCH, {"jobs": [spec("serve", priority="production")]}, key="before-the-change"
    )
    assert other.status_code == 422, other.text
    assert other.json()["type"].endswith("/idempotency-key-reused")
    assert await store.head() == head


async def test_a_used_key_is_judged_by_its_fingerprint_before_anything_is_planned_or_written(
    api: Api, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A used key asks no limits (its retry must get its jobs at the team's cap): another
    request under it was planned, tried as an append and answered after a read of each job it
    named, as often as a team past its rate liked (attack16: ~0.2 s of the API's one worker
    per 1,000-job batch). Its fingerprint is read first; a retry reads no job it holds."""
    await api.create_team("nlp")
    created = await post(api, BATCH, {"jobs": [spec("a"), spec("b")]}, key="used")
    assert created.status_code == 201, created.text
    reads: list[str] = []
    appends: list[object] = []
    read_stream, append_many = EventStore.read_stream, EventStore.append_many

    async def counting_read(self: EventStore, stream: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(stream)
        return await read_stream(self, stream, *args, **kwargs)

    async def counting_append(self: EventStore, *args: Any, **kwargs: Any) -> Any:
        appends.append(args)
        return await append_many(self, *args, **kwargs)

    monkeypatch.setattr(EventStore, "read_stream", counting_read)
    monkeypatch.setattr(EventStore, "append_many", counting_append)
    another = {"jobs": [spec(f"other-{index}") for index in range(300)]}
    reused = await post(api, BATCH, another, key="used")
    assert reused.status_code == 422, reused.text
    assert reused.json()["type"].endswith("/idempotency-key-reused")
    again = await post(api, BATCH, {"jobs": [spec("a"), spec("b")]}, key="used")
    assert again.status_code == 201, again.text
    assert _ids(again.json()) == _ids(created.json())
    assert appends == []
    assert len([stream for stream in reads if stream.startswith("job-")]) <= 2 * 2
