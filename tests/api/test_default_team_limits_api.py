"""Every team is held to the installation's default limits until the admin sets a policy of
its own (which then holds whole): a cap on pending jobs (GANGWAY_TEAM_MAX_PENDING_JOBS, 10,000
unless set) and, where configured, a submission rate (GANGWAY_TEAM_SUBMISSIONS_PER_SECOND), so
that no tenant can flood the queue and the log for the others by default. Past them: 429
problem+json with Retry-After.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.app import create_app
from services.api.settings import ApiSettings
from tests.api.conftest import Api, serving

pytestmark = pytest.mark.integration

API_OVERRIDES = {"team_max_pending_jobs": 2}

JOB = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}


def job(team: str = "nlp") -> dict[str, Any]:
    return {**JOB, "team": team}


async def put_policy(api: Api, policy: dict[str, Any]) -> dict[str, Any]:
    response = await api.client.put("/v1/teams/nlp/policy", json=policy, headers=api.as_admin())
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_the_shipped_default_caps_pending_jobs_and_leaves_the_rate_to_the_admin() -> None:
    defaults = ApiSettings.model_fields
    assert defaults["team_max_pending_jobs"].default == 10_000
    assert defaults["team_submissions_per_second"].default is None


async def test_a_team_without_a_policy_is_held_to_the_default_pending_cap(api: Api) -> None:
    nlp = await api.create_team("nlp")
    policy = (await api.client.get("/v1/teams/nlp/policy", headers=nlp)).json()
    assert policy["max_pending_jobs"] == 2
    for _ in range(2):
        created = await api.client.post("/v1/jobs", json=job(), headers=nlp)
        assert created.status_code == 201, created.text
    flooded = await api.client.post("/v1/jobs", json=job(), headers=nlp)
    assert flooded.status_code == 429, flooded.text
    assert flooded.headers["content-type"] == "application/problem+json"
    assert flooded.json()["type"].endswith("/too-many-pending")
    assert int(flooded.headers["retry-after"]) >= 1
    batch = await api.client.post("/v1/jobs:batch", json={"jobs": [job()]}, headers=nlp)
    assert batch.status_code == 429, batch.text
    # The others are not held to nlp's pending jobs.
    vision = await api.create_team("vision")
    other = await api.client.post("/v1/jobs", json=job("vision"), headers=vision)
    assert other.status_code == 201, other.text


async def test_a_teams_own_policy_replaces_the_default_limits_whole(api: Api) -> None:
    """The admin's policy is the whole value (DESIGN §8): its limits, none where it gives
    none; the default holds only teams without a policy."""
    nlp = await api.create_team("nlp")
    for _ in range(2):
        assert (await api.client.post("/v1/jobs", json=job(), headers=nlp)).status_code == 201
    assert (await api.client.post("/v1/jobs", json=job(), headers=nlp)).status_code == 429
    capped = await put_policy(api, {"max_pending_jobs": 3})
    assert capped["max_pending_jobs"] == 3
    assert (await api.client.post("/v1/jobs", json=job(), headers=nlp)).status_code == 201
    assert (await api.client.post("/v1/jobs", json=job(), headers=nlp)).status_code == 429
    granted = await put_policy(api, {"non_preemptible_allowed": True})
    assert granted["max_pending_jobs"] is None
    assert (await api.client.post("/v1/jobs", json=job(), headers=nlp)).status_code == 201


@contextlib.asynccontextmanager
async def api_with(api: Api, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    """Another API process on the same database, with other settings."""
    app = create_app(api.settings.model_copy(update={"api_worker": 2, **overrides}), use_bus=False)
    async with serving(app) as client:
        yield client


async def test_a_default_submission_rate_holds_every_team_without_its_own(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    # One submission an hour: the first passes, the second cannot, whatever the test's speed.
    async with api_with(
        api, team_max_pending_jobs=None, team_submissions_per_second=1 / 3600
    ) as limited:
        assert (await limited.post("/v1/jobs", json=job(), headers=nlp)).status_code == 201
        again = await limited.post("/v1/jobs", json=job(), headers=nlp)
        assert again.status_code == 429, again.text
        assert again.json()["type"].endswith("/rate-limited")
        assert 1 <= int(again.headers["retry-after"]) <= 3600
        # Each team has a bucket of its own.
        other = await limited.post("/v1/jobs", json=job("vision"), headers=vision)
        assert other.status_code == 201, other.text
