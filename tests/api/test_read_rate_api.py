"""Reads are bounded per team in each API process (GANGWAY_TEAM_READS_PER_SECOND): past its
burst a team's GET is 429 problem+json with Retry-After, while other teams and the admin read
on; listing or polling floods of one tenant cannot take the event loop from the others."""

from __future__ import annotations

import pytest

from services.api.ratelimit import ReadLimiter
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

# One read, then one more only a hundred seconds later: no test outlasts that.
API_OVERRIDES = {"team_reads_per_second": 0.01}


async def test_a_team_past_its_read_rate_is_answered_429_and_the_others_read_on(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    job_id = await api.submit(api.as_admin())

    assert (await api.client.get("/v1/jobs", headers=nlp)).status_code == 200
    for path in ("/v1/jobs", f"/v1/jobs/{job_id}", "/v1/queues", "/v1/events"):
        refused = await api.client.get(path, headers=nlp)
        assert refused.status_code == 429, (path, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["type"].endswith("/rate-limited")
        assert int(refused.headers["Retry-After"]) >= 1

    assert (await api.client.get("/v1/jobs", headers=vision)).status_code == 200
    for _ in range(3):
        assert (await api.client.get("/v1/jobs", headers=api.as_admin())).status_code == 200


async def test_a_second_token_of_the_team_shares_its_reads(api: Api) -> None:
    nlp = await api.create_team("nlp")
    minted = await api.client.post("/v1/teams/nlp/tokens", json={"name": "ci"}, headers=nlp)
    assert minted.status_code == 201, minted.text
    assert (await api.client.get("/v1/jobs", headers=nlp)).status_code == 200
    ci = {"Authorization": f"Bearer {minted.json()['token']}"}
    assert (await api.client.get("/v1/jobs", headers=ci)).status_code == 429


def test_the_bucket_refills_at_its_rate_up_to_a_seconds_worth() -> None:
    now = [0.0]
    reads = ReadLimiter(clock=lambda: now[0])
    assert [reads.take("nlp", 2.0) for _ in range(3)] == [None, None, 0.5]
    now[0] = 0.5
    assert reads.take("nlp", 2.0) is None
    assert reads.take("nlp", 2.0) == 0.5
    now[0] = 100.0
    assert [reads.take("nlp", 2.0) for _ in range(3)] == [None, None, 0.5]
    assert reads.take("vision", 2.0) is None
    assert reads.take("nlp", None) is None
