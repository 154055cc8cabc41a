"""A `depends_on[].job` of a batch names either a job of the batch (by its `name`) or an
existing job or array of the team (by its id). When it could be both, the batch is refused
(422 ambiguous-dependency): a batch-local name must never silently redirect a dependency the
caller may have meant on a job that already exists, nor the other way round.
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas.jobs import JobSpec, JobSubmitted
from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

# This API process re-reads the log only for what it is asked about: a job another API worker
# writes stays unseen here until a request names it.
API_OVERRIDES = {"catch_up_interval_s": 3600.0}


def spec(name: str, team: str = "nlp", **fields: Any) -> dict[str, Any]:
    return {"name": name, "team": team, "tasks": 1, "gpus_per_task": 1, **fields}


async def assert_the_second_depends_on_the_first(
    api: Api, store: EventStore, batch: dict[str, Any], headers: dict[str, str]
) -> None:
    """The batch is accepted and its second job's dependency names the first job's id."""
    response = await api.client.post("/v1/jobs:batch", json=batch, headers=headers)
    assert response.status_code == 201, response.text
    first, second = (job["id"] for job in response.json()["jobs"])
    [envelope] = await store.read_stream(f"job-{second}")
    assert isinstance(envelope.payload, JobSubmitted)
    assert [d.job for d in envelope.payload.spec.depends_on] == [first]


@pytest.mark.parametrize("existing", ["job", "array"])
async def test_a_batch_name_equal_to_an_existing_id_of_the_team_is_ambiguous(
    api: Api, store: EventStore, existing: str
) -> None:
    nlp = await api.create_team("nlp")
    fields: dict[str, Any] = {"array": {"count": 2}} if existing == "array" else {}
    created = await api.client.post("/v1/jobs", json=spec("prep", **fields), headers=nlp)
    assert created.status_code == 201, created.text
    old = created.json()["id"]
    head = await store.head()
    batch = {"jobs": [spec(old), spec("train", depends_on=[{"job": old}])]}
    response = await api.client.post("/v1/jobs:batch", json=batch, headers=nlp)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("/ambiguous-dependency")
    assert problem["errors"][0]["loc"] == ["body", "jobs", 1]
    assert old in problem["detail"]
    assert await store.head() == head


async def test_another_teams_job_of_that_id_leaves_the_name_unambiguous(
    api: Api, store: EventStore
) -> None:
    """Another team's job is as unknown to this team as a missing one: the batch's own job of
    that name is the only one it can mean, and nothing tells it the other exists."""
    await api.create_team("nlp")
    vision = await api.create_team("vision")
    theirs = await api.client.post("/v1/jobs", json=spec("prep", "vision"), headers=vision)
    assert theirs.status_code == 201, theirs.text
    their_id = theirs.json()["id"]
    batch = {"jobs": [spec(their_id), spec("train", depends_on=[{"job": their_id}])]}
    await assert_the_second_depends_on_the_first(api, store, batch, api.teams["nlp"])


async def test_a_batch_name_no_job_has_as_id_still_names_the_batchs_job(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    await api.submit(nlp, name="prep")  # a job named prep exists, but its id is not "prep"
    batch = {"jobs": [spec("prep"), spec("train", depends_on=[{"job": "prep"}])]}
    await assert_the_second_depends_on_the_first(api, store, batch, nlp)


async def test_a_job_another_api_process_wrote_is_found_ambiguous_too(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    other_worker = JobSubmitted(
        job_id="0123456789ab",
        spec=JobSpec.model_validate(spec("prep")),
        submitted_by="nlp",
    )
    await store.append(other_worker.stream, 0, [other_worker])
    head = await store.head()
    batch = {"jobs": [spec("0123456789ab"), spec("train", depends_on=[{"job": "0123456789ab"}])]}
    response = await api.client.post("/v1/jobs:batch", json=batch, headers=nlp)
    assert response.status_code == 422, response.text
    assert response.json()["type"].endswith("/ambiguous-dependency")
    assert await store.head() == head


async def test_a_batch_name_of_another_teams_job_of_the_batch_is_unknown(
    api: Api, store: EventStore
) -> None:
    """An admin's batch may hold jobs of several teams; a job may still depend only on jobs of
    its own team, so a name of the batch that only another team's job bears is unknown."""
    await api.create_team("nlp")
    await api.create_team("vision")
    head = await store.head()
    batch = {"jobs": [spec("prep", "vision"), spec("train", depends_on=[{"job": "prep"}])]}
    response = await api.client.post("/v1/jobs:batch", json=batch, headers=api.as_admin())
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"].endswith("/unknown-dependency")
    assert problem["errors"][0]["loc"] == ["body", "jobs", 1]
    assert await store.head() == head


async def test_two_teams_of_one_batch_may_each_name_a_job_alike(
    api: Api, store: EventStore
) -> None:
    await api.create_team("nlp")
    await api.create_team("vision")
    batch = {
        "jobs": [
            spec("prep", "vision"),
            spec("prep"),
            spec("train", depends_on=[{"job": "prep"}]),
        ]
    }
    response = await api.client.post("/v1/jobs:batch", json=batch, headers=api.as_admin())
    assert response.status_code == 201, response.text
    _, ours, train = (job["id"] for job in response.json()["jobs"])
    [envelope] = await store.read_stream(f"job-{train}")
    assert isinstance(envelope.payload, JobSubmitted)
    assert [d.job for d in envelope.payload.spec.depends_on] == [ours]
