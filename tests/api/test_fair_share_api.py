"""One team's flood must not slow another team's submissions: while several teams submit, the
submit path's jobs a second (GANGWAY_SHARED_JOBS_PER_SECOND, each job of a batch counted) are
shared max-min fairly among them. A flooding team past its share waits for room, then gets 429
problem+json `fair-share-exceeded` with Retry-After; a quiet team within its equal share is
never held, however much the flood took. A team alone is held by none of it.

Here the window is an hour and the rate 10 jobs an hour (a budget of 10 jobs), so that what is
refused does not depend on the test's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from services.api.app import create_app
from services.api.settings import ApiSettings
from tests.api.conftest import Api, serving

pytestmark = pytest.mark.integration

HOUR = 3600.0
API_OVERRIDES = {
    "shared_jobs_per_second": 10 / HOUR,
    "shared_window_s": HOUR,
    "shared_max_wait_s": 0.0,
}


def job(team: str) -> dict[str, Any]:
    return {"name": "train", "team": team, "tasks": 1, "gpus_per_task": 1}


def batch(team: str, size: int) -> dict[str, Any]:
    return {"jobs": [job(team) for _ in range(size)]}


@contextlib.asynccontextmanager
async def api_with(api: Api, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    """Another API process on the same database, with other settings."""
    app = create_app(api.settings.model_copy(update={"api_worker": 2, **overrides}), use_bus=False)
    async with serving(app) as client:
        yield client


def test_the_shipped_default_shares_1000_jobs_a_second_and_holds_a_request_a_second() -> None:
    defaults = ApiSettings.model_fields
    assert defaults["shared_jobs_per_second"].default == 1000.0
    assert defaults["shared_max_wait_s"].default == 1.0
    assert defaults["shared_window_s"].default == 1.0
    # Each worker keeps an entry per job in the window: at most an hour of them.
    with pytest.raises(ValidationError):
        ApiSettings(shared_window_s=HOUR + 1)


async def test_a_flooding_team_is_refused_past_its_share_and_the_quiet_team_never_is(
    api: Api,
) -> None:
    nlp = await api.create_team("nlp")
    cv = await api.create_team("cv")
    assert (await api.client.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code == 201
    # The quiet team leaves 9 of the 10: the flood may take them, in batches or one by one.
    for size in (4, 4):
        accepted = await api.client.post("/v1/jobs:batch", json=batch("cv", size), headers=cv)
        assert accepted.status_code == 201, accepted.text
    refused = await api.client.post("/v1/jobs:batch", json=batch("cv", 4), headers=cv)
    assert refused.status_code == 429, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["type"].endswith("/fair-share-exceeded")
    assert 1 <= int(refused.headers["retry-after"]) <= HOUR
    assert (await api.client.post("/v1/jobs", json=job("cv"), headers=cv)).status_code == 201
    again = await api.client.post("/v1/jobs", json=job("cv"), headers=cv)
    assert again.status_code == 429, again.text
    # However much the flood took, the quiet team keeps its equal share (5 of the 10): each of
    # its submissions up to it is accepted.
    answers = [
        (await api.client.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code
        for _ in range(4)
    ]
    assert answers == [201, 201, 201, 201]
    # Refused requests wrote nothing: cv has the 9 jobs it was told of, nlp its 5.
    listed = await api.client.get("/v1/jobs", params={"limit": 100}, headers=api.as_admin())
    teams = [item["spec"]["team"] for item in listed.json()["items"]]
    assert (teams.count("cv"), teams.count("nlp")) == (9, 5)


async def test_the_quiet_teams_batches_count_each_job_against_its_share_too(api: Api) -> None:
    nlp = await api.create_team("nlp")
    cv = await api.create_team("cv")
    nine = await api.client.post("/v1/jobs:batch", json=batch("cv", 9), headers=cv)
    assert nine.status_code == 201, nine.text
    # nlp's equal share is 5 jobs: a batch of 5 fits; its next job does not.
    fits = await api.client.post("/v1/jobs:batch", json=batch("nlp", 5), headers=nlp)
    assert fits.status_code == 201, fits.text
    past = await api.client.post("/v1/jobs", json=job("nlp"), headers=nlp)
    assert past.status_code == 429, past.text
    assert past.json()["type"].endswith("/fair-share-exceeded")


async def test_a_team_alone_is_not_held_by_the_share(api: Api) -> None:
    cv = await api.create_team("cv")
    answers = [
        (await api.client.post("/v1/jobs:batch", json=batch("cv", 5), headers=cv)).status_code
        for _ in range(4)
    ]
    assert answers == [201, 201, 201, 201]  # 20 jobs, twice the shared budget


async def test_a_held_flood_request_does_not_hold_the_quiet_teams_submission(api: Api) -> None:
    """A request past its share waits for room (`shared_max_wait_s`) instead of being refused
    at once; meanwhile the quiet team's submission is answered."""
    nlp = await api.create_team("nlp")
    cv = await api.create_team("cv")
    async with api_with(api, shared_max_wait_s=2 * HOUR) as held:
        assert (await held.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code == 201
        assert (await held.post("/v1/jobs:batch", json=batch("cv", 9), headers=cv)).is_success
        flood = asyncio.create_task(held.post("/v1/jobs", json=job("cv"), headers=cv))
        quiet = [
            (await held.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code
            for _ in range(3)
        ]
        assert quiet == [201, 201, 201]
        # Sent before the quiet team's three, the flood's request still waits for its jobs to
        # leave the hour's window.
        assert not flood.done()
        flood.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flood


async def test_a_held_request_is_accepted_once_its_teams_jobs_leave_the_window(api: Api) -> None:
    nlp = await api.create_team("nlp")
    cv = await api.create_team("cv")
    # A budget of 10 jobs in a window of a tenth of a second, a wait of up to a minute.
    async with api_with(
        api, shared_window_s=0.1, shared_jobs_per_second=100.0, shared_max_wait_s=60.0
    ) as held:
        assert (await held.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code == 201
        assert (await held.post("/v1/jobs:batch", json=batch("cv", 9), headers=cv)).is_success
        later = await held.post("/v1/jobs:batch", json=batch("cv", 5), headers=cv)
        assert later.status_code == 201, later.text


async def test_a_floods_concurrent_requests_together_stay_within_its_share(api: Api) -> None:
    """Requests let through and not yet written count against the team's share: three batches
    sent at once are not each judged against none of the others."""
    nlp = await api.create_team("nlp")
    cv = await api.create_team("cv")
    assert (await api.client.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code == 201
    answers = await asyncio.gather(
        *(api.client.post("/v1/jobs:batch", json=batch("cv", 4), headers=cv) for _ in range(3))
    )
    assert sorted(answer.status_code for answer in answers) == [201, 201, 429]


async def test_a_teams_own_jobs_per_second_counts_each_job_of_a_batch_alone_too(
    api: Api,
) -> None:
    """The admin's per-team budget of jobs (`jobs_per_second`, beside `submissions_per_second`
    which counts a batch as one) holds the team even when it submits alone."""
    cv = await api.create_team("cv")
    policy = {"jobs_per_second": 6 / HOUR}
    put = await api.client.put("/v1/teams/cv/policy", json=policy, headers=api.as_admin())
    assert put.status_code == 200, put.text
    shown = await api.client.get("/v1/teams/cv/policy", headers=cv)
    assert shown.json()["jobs_per_second"] == pytest.approx(6 / HOUR)
    fits = await api.client.post("/v1/jobs:batch", json=batch("cv", 6), headers=cv)
    assert fits.status_code == 201, fits.text
    past = await api.client.post("/v1/jobs", json=job("cv"), headers=cv)
    assert past.status_code == 429, past.text
    assert past.headers["content-type"] == "application/problem+json"
    assert past.json()["type"].endswith("/rate-limited")
    assert 1 <= int(past.headers["retry-after"]) <= HOUR
    # Another team is not held by cv's budget.
    nlp = await api.create_team("nlp")
    assert (await api.client.post("/v1/jobs", json=job("nlp"), headers=nlp)).status_code == 201
