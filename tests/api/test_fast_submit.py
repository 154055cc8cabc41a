"""`POST /v1/jobs` and `POST /v1/jobs:batch` are served outside FastAPI's machinery for an
ordinary submission (services/api/fast_submit.py): every answer must be the one the route
itself gives.

Each request goes to the API as it runs and to the same app with the fast path switched off,
both on one log, and the two answers are compared: status, media type, the headers a client
acts upon, and the body (a new job's id aside, which is drawn per job).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.app import create_app
from services.api.auth import Principal, authenticate
from services.api.strict import parse_strict_json
from tests.api.conftest import ADMIN_TOKEN, Api, serving

SPEC = {"name": "train", "team": "nlp", "tasks": 2, "gpus_per_task": 4}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@contextlib.asynccontextmanager
async def framework_only(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    """The same app on the same log (rebuilt from it as it is now), every request through
    FastAPI's route."""
    app = create_app(api.settings, use_bus=False)
    app.fast_submit = None
    async with serving(app) as client:
        yield client


def _drawn(created: dict[str, Any]) -> dict[str, Any]:
    """A created job's answer with the ids drawn for it left out."""
    return {key: value for key, value in created.items() if key not in ("id", "array")} | {
        "elements": len(created.get("array", ()))
    }


def _answer(response: httpx.Response) -> tuple[int, str, dict[str, str], Any]:
    body = response.json()
    if response.status_code == 201:
        body = [_drawn(job) for job in body["jobs"]] if "jobs" in body else _drawn(body)
    kept = {
        name: response.headers[name]
        for name in ("retry-after", "www-authenticate", "connection")
        if name in response.headers
    }
    if "retry-after" in kept:
        kept["retry-after"] = "<seconds>"  # the bucket refills between the two answers
    return response.status_code, response.headers["content-type"], kept, body


async def _both(
    api: Api,
    framework: httpx.AsyncClient,
    *,
    headers: dict[str, str],
    path: str = "/v1/jobs",
    **request: Any,
) -> tuple[httpx.Response, httpx.Response]:
    fast = await api.client.post(path, headers=headers, **request)
    slow = await framework.post(path, headers=headers, **request)
    assert _answer(fast) == _answer(slow)
    return fast, slow


async def test_every_kind_of_submission_is_answered_as_the_route_answers_it(api: Api) -> None:
    team = await api.create_team("nlp")
    other = await api.create_team("cv")
    raw = {"Content-Type": "application/json"}
    cases: list[tuple[dict[str, str], dict[str, Any]]] = [
        (team, {"json": SPEC}),
        (ADMIN, {"json": SPEC}),
        ({}, {"json": SPEC}),
        ({"Authorization": "Bearer not-a-token"}, {"json": SPEC}),
        ({"Authorization": "Basic abc"}, {"json": SPEC}),
        (other, {"json": SPEC}),
        (team, {"json": {**SPEC, "tasks": 0}}),
        (team, {"json": {**SPEC, "tasks": "2"}}),
        (team, {"json": {**SPEC, "team": "ghost"}}),
        (ADMIN, {"json": {**SPEC, "team": "ghost"}}),
        (team, {"json": [SPEC]}),
        ({**team, **raw}, {"content": b'{"name": "a", "name": "b", "team": "nlp"}'}),
        ({**team, **raw}, {"content": b'{"name": '}),
        ({**team, **raw}, {"content": b'{"name": "a\\u0000", "team": "nlp"}'}),
        ({**team, "Content-Type": "text/plain"}, {"content": json.dumps(SPEC).encode()}),
        ({**team, "Idempotency-Key": "has space"}, {"json": SPEC}),
        (team, {"json": {**SPEC, "array": {"count": 3, "max_parallel": 1}}}),
    ]
    async with framework_only(api) as framework:
        for headers, request in cases:
            await _both(api, framework, headers=headers, **request)


async def test_every_kind_of_batch_is_answered_as_the_route_answers_it(api: Api) -> None:
    team = await api.create_team("nlp")
    other = await api.create_team("cv")
    stages = [
        {**SPEC, "name": "prep"},
        {**SPEC, "name": "train", "depends_on": [{"job": "prep", "condition": "succeeded"}]},
    ]
    cases: list[tuple[dict[str, str], dict[str, Any]]] = [
        (team, {"json": {"jobs": [SPEC, {**SPEC, "name": "eval"}]}}),
        (ADMIN, {"json": {"jobs": [SPEC]}}),
        (team, {"json": {"jobs": stages}}),
        (team, {"json": {"jobs": [SPEC, {**SPEC, "array": {"count": 2, "max_parallel": 1}}]}}),
        ({}, {"json": {"jobs": [SPEC]}}),
        (other, {"json": {"jobs": [SPEC]}}),
        (team, {"json": {"jobs": []}}),
        (team, {"json": {"jobs": [SPEC, {**SPEC, "tasks": 0}, {**SPEC, "gpus_per_task": "1"}]}}),
        (team, {"json": [SPEC]}),
        ({**team, "Idempotency-Key": ""}, {"json": {"jobs": [SPEC]}}),
    ]
    async with framework_only(api) as framework:
        for headers, request in cases:
            await _both(api, framework, headers=headers, path="/v1/jobs:batch", **request)


async def test_an_idempotency_key_names_one_job_whichever_path_served_it(api: Api) -> None:
    team = await api.create_team("nlp")
    keyed = {**team, "Idempotency-Key": "run-42"}
    async with framework_only(api) as framework:
        fast = await api.client.post("/v1/jobs", json=SPEC, headers=keyed)
        slow = await framework.post("/v1/jobs", json=SPEC, headers=keyed)
        assert fast.status_code == slow.status_code == 201
        assert fast.json() == slow.json()
        reused, _ = await _both(api, framework, headers=keyed, json={**SPEC, "name": "another"})
        assert reused.status_code == 422


async def test_a_submission_past_the_rate_is_refused_alike_with_its_retry_after(api: Api) -> None:
    team = await api.create_team("nlp")
    policy = await api.client.put(
        "/v1/teams/nlp/policy", json={"submissions_per_second": 1 / 3600}, headers=ADMIN
    )
    assert policy.status_code == 200, policy.text
    assert (await api.client.post("/v1/jobs", json=SPEC, headers=team)).status_code == 201
    async with framework_only(api) as framework:
        refused, again = await _both(api, framework, headers=team, json=SPEC)
    assert refused.status_code == 429
    waits = sorted(int(answer.headers["retry-after"]) for answer in (refused, again))
    assert waits[1] - waits[0] <= 2 and waits[0] > 3500
    assert refused.headers["content-type"] == "application/problem+json"


async def test_fast_submissions_are_counted_in_the_request_metrics(api: Api) -> None:
    team = await api.create_team("nlp")
    assert (await api.client.post("/v1/jobs", json=SPEC, headers=team)).status_code == 201
    assert (await api.client.post("/v1/jobs", json=SPEC, headers={})).status_code == 401
    text = (await api.client.get("/metrics")).text
    assert 'gangway_api_requests_total{method="POST",route="/v1/jobs",status="201"} 1.0' in text
    assert 'gangway_api_requests_total{method="POST",route="/v1/jobs",status="401"} 1.0' in text


async def test_a_body_is_read_only_for_a_caller_with_a_good_token_and_looked_up_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The routes know who calls before they read a body (routing.py); the fast path parsed
    and validated a whole batch for a missing or refused token before its 401 (attack16),
    and looked a good token up twice for a body it handed over."""
    team = await api.create_team("nlp")
    parsed: list[bytes] = []
    lookups: list[str | None] = []

    def counting_parse(body: bytes) -> Any:
        parsed.append(body)
        return parse_strict_json(body)

    async def counting_authenticate(header: str | None, *args: Any) -> Principal:
        lookups.append(header)
        return await authenticate(header, *args)

    monkeypatch.setattr("services.api.fast_submit.parse_strict_json", counting_parse)
    monkeypatch.setattr("services.api.fast_submit.authenticate", counting_authenticate)
    monkeypatch.setattr("services.api.deps.authenticate", counting_authenticate)
    batch = {"jobs": [{**SPEC, "name": f"j{index}"} for index in range(200)]}
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        refused = await api.client.post("/v1/jobs:batch", json=batch, headers=headers)
        assert refused.status_code == 401, refused.text
    assert parsed == []
    lookups.clear()
    invalid = await api.client.post(
        "/v1/jobs:batch", json={"jobs": [{**SPEC, "tasks": 0}]}, headers=team
    )
    assert invalid.status_code == 422, invalid.text
    assert lookups == [team["Authorization"]]
