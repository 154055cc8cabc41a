"""Bad requests get a 4xx RFC 9457 problem, never a 5xx."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
VALID: dict[str, Any] = {"name": "train", "team": "nlp", "tasks": 2, "gpus_per_task": 4}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({**VALID, "tasks": "two"}, id="wrong-type"),
        pytest.param({**VALID, "gpus_per_task": -8}, id="negative-gpus"),
        pytest.param({**VALID, "min_tasks": 3}, id="min-tasks-over-tasks"),
        pytest.param({**VALID, "gpus": 8}, id="unknown-field"),
        pytest.param({**VALID, "name": "no spaces allowed"}, id="bad-name"),
        pytest.param({"team": "nlp"}, id="missing-name"),
        pytest.param([VALID], id="not-an-object"),
        pytest.param({**VALID, "topology": {"tp_size": 3}}, id="tp-size-not-dividing"),
        pytest.param({**VALID, "env": {"A": "\u0000"}}, id="nul-character"),
    ],
)
async def test_an_invalid_job_spec_is_a_422_problem_naming_the_field(api: Api, body: Any) -> None:
    response = await api.client.post("/v1/jobs", json=body, headers=api.as_admin())
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["status"] == 422
    assert "errors" in problem or "NUL" in problem["detail"]
    assert {"type", "title", "detail", "instance"} <= problem.keys()


async def test_malformed_json_is_a_400_problem(api: Api) -> None:
    response = await api.client.post(
        "/v1/jobs",
        content=b'{"name": "train",',
        headers={**api.as_admin(), "Content-Type": "application/json"},
    )
    assert (response.status_code, response.headers["content-type"]) == (400, PROBLEM)


async def test_an_oversized_body_is_a_413_problem(api: Api) -> None:
    body = b'{"name": "' + b"x" * (api.settings.max_body_bytes + 1) + b'"}'
    response = await api.client.post(
        "/v1/jobs", content=body, headers={**api.as_admin(), "Content-Type": "application/json"}
    )
    assert (response.status_code, response.headers["content-type"]) == (413, PROBLEM)


async def test_an_oversized_streamed_body_is_a_413_problem(api: Api) -> None:
    async def chunks() -> Any:
        for _ in range(3):
            yield b"x" * api.settings.max_body_bytes

    response = await api.client.post(
        "/v1/jobs", content=chunks(), headers={**api.as_admin(), "Content-Type": "application/json"}
    )
    assert response.status_code == 413


async def test_a_request_without_a_token_is_a_401_problem(api: Api) -> None:
    response = await api.client.post("/v1/jobs", json=VALID)
    assert (response.status_code, response.headers["content-type"]) == (401, PROBLEM)
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_an_unknown_token_is_a_401_problem(api: Api) -> None:
    response = await api.client.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert (response.status_code, response.headers["content-type"]) == (401, PROBLEM)


async def test_an_unknown_route_is_a_404_problem(api: Api) -> None:
    response = await api.client.get("/v1/nothing-here")
    assert (response.status_code, response.headers["content-type"]) == (404, PROBLEM)


async def test_a_wrong_method_is_a_405_problem(api: Api) -> None:
    response = await api.client.delete("/v1/jobs", headers=api.as_admin())
    assert (response.status_code, response.headers["content-type"]) == (405, PROBLEM)


async def test_a_405_allows_every_method_of_the_resource(api: Api) -> None:
    # Starlette named the methods of the one route it matched: `Allow: GET` on /v1/jobs/{id},
    # whose PATCH is a route of its own; RFC 9110 wants them all.
    response = await api.client.delete("/v1/jobs/abc", headers=api.as_admin())
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD, PATCH"
    response = await api.client.put("/v1/jobs", headers=api.as_admin())
    assert response.headers["allow"] == "GET, HEAD, POST"
    response = await api.client.get("/v1/jobs/abc/cancel", headers=api.as_admin())
    assert response.headers["allow"] == "POST"


async def test_an_invalid_query_parameter_is_a_422_problem(api: Api) -> None:
    response = await api.client.get("/v1/events?limit=-1", headers=api.as_admin())
    assert (response.status_code, response.headers["content-type"]) == (422, PROBLEM)


async def test_a_team_token_cannot_use_admin_endpoints(api: Api) -> None:
    team = await api.create_team("nlp")
    response = await api.client.post(
        "/v1/teams", json={"name": "rogue", "guaranteed_gpus": 0}, headers=team
    )
    assert (response.status_code, response.headers["content-type"]) == (403, PROBLEM)


async def test_an_env_name_no_process_can_hold_is_refused_at_submit(api: Api) -> None:
    await api.create_team(VALID["team"])
    response = await api.client.post(
        "/v1/jobs", json={**VALID, "env": {"A=B": "c"}}, headers=api.as_admin()
    )
    assert (response.status_code, response.headers["content-type"]) == (422, PROBLEM)
    assert "illegal environment variable name 'A=B'" in response.json()["detail"]
