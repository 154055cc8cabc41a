"""`GET /v1/usage?team=` of a team that does not exist is a 404, like `GET /v1/teams/{team}`:
it answered 200 with a made-up row (guarantee 0, no usage), so `gangway usage --team` with a
typo showed an empty team instead of saying so."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api


@pytest.mark.integration
async def test_usage_of_an_unknown_team_is_not_found(api: Api) -> None:
    await api.create_team("nlp")
    admin = api.as_admin()

    unknown = await api.client.get("/v1/usage", headers=admin, params={"team": "nlq"})
    assert unknown.status_code == 404, unknown.text
    assert unknown.headers["content-type"] == "application/problem+json"
    assert unknown.json()["detail"] == "team nlq not found"

    known = await api.client.get("/v1/usage", headers=admin, params={"team": "nlp"})
    assert known.status_code == 200, known.text
    assert [t["team"] for t in known.json()["teams"]] == ["nlp"]
