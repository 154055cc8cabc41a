"""Who calls is settled before a word is said about the body: a caller without a token, or a
team's token on an admin route, learns nothing of what its body lacks, and the API validates
no body for anyone it would refuse."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

INVALID = {"nope": 1, "cpus_per_task": "x"}
NOT_JSON = b"{not json"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/jobs"),
        ("POST", "/v1/jobs:batch"),
        ("PATCH", "/v1/jobs/j-0123456789ab"),
        ("PUT", "/v1/queues/nlp"),
        ("POST", "/v1/teams"),
    ],
)
async def test_a_caller_without_a_token_is_told_401_whatever_its_body(
    api: Api, method: str, path: str
) -> None:
    for body in (
        {"json": INVALID},
        {"content": NOT_JSON, "headers": {"content-type": "application/json"}},
    ):
        response = await api.client.request(method, path, **body)
        assert response.status_code == 401, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert "nope" not in response.text


async def test_a_team_token_on_an_admin_route_is_told_403_whatever_its_body(api: Api) -> None:
    nlp = await api.create_team("nlp")
    for path, method in (
        ("/v1/queues/nlp", "PUT"),
        ("/v1/queues/nlp", "PATCH"),
        ("/v1/teams", "POST"),
    ):
        invalid = await api.client.request(method, path, json=INVALID, headers=nlp)
        assert invalid.status_code == 403, invalid.text
        malformed = await api.client.request(
            method, path, content=NOT_JSON, headers={**nlp, "content-type": "application/json"}
        )
        assert malformed.status_code == 403, malformed.text


async def test_a_caller_with_a_token_still_hears_about_its_body(api: Api) -> None:
    nlp = await api.create_team("nlp")
    invalid = await api.client.post("/v1/jobs", json=INVALID, headers=nlp)
    assert invalid.status_code == 422, invalid.text
    malformed = await api.client.post(
        "/v1/jobs", content=NOT_JSON, headers={**nlp, "content-type": "application/json"}
    )
    assert malformed.status_code == 400, malformed.text
    admin_invalid = await api.client.put("/v1/queues/nlp", json=INVALID, headers=api.as_admin())
    assert admin_invalid.status_code == 422, admin_invalid.text
