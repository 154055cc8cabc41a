"""`HEAD` on a read answers as its `GET` would, without a body (RFC 9110 9.3.2): it answered
405 on every route (FastAPI registers only the methods a route declares)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from services.agent import logs
from services.runtime import EventStore, Settings
from tests.api.conftest import ADMIN_TOKEN, Api, api_settings
from tests.api.test_logs_api import started_job

pytestmark = pytest.mark.integration

# One followed log or dashboard stream per team: a HEAD that kept its stream would use it up.
API_OVERRIDES = {"streams_per_team": 1}


async def test_head_answers_like_get_without_a_body(api: Api) -> None:
    team = await api.create_team("nlp")
    job_id = await api.submit(team)
    for path, headers in (
        (f"/v1/jobs/{job_id}", team),
        ("/v1/jobs", team),
        (f"/v1/jobs/{job_id}/events", team),
        ("/v1/queues", team),
        ("/healthz", {}),
        ("/openapi.json", {}),
    ):
        got = await api.client.get(path, headers=headers)
        head = await api.client.head(path, headers=headers)
        assert got.status_code == 200, (path, got.text)
        assert head.status_code == 200, (path, head.status_code)
        assert head.content == b""
        assert head.headers["content-type"] == got.headers["content-type"]
        assert head.headers["content-length"] == got.headers["content-length"]


async def test_head_keeps_the_refusals_of_get(api: Api) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    job_id = await api.submit(nlp)
    # Another team's job is as absent to HEAD as to GET; no token is 401; a route with no GET
    # is still 405 (with its Allow).
    hidden = await api.client.head(f"/v1/jobs/{job_id}", headers=vision)
    assert (hidden.status_code, hidden.content) == (404, b"")
    assert (await api.client.head("/v1/jobs")).status_code == 401
    no_get = await api.client.head(f"/v1/jobs/{job_id}/cancel", headers=nlp)
    assert no_get.status_code == 405
    assert "POST" in no_get.headers["allow"]


async def test_head_on_a_followed_log_does_not_hold_it_open(
    api_url: str, store: EventStore, tmp_path: Path
) -> None:
    """The followed GET streams until the job ends, which this one never does; a team may hold
    one stream here (`API_OVERRIDES`). Each HEAD gets the stream's head and no body, and gives
    its slot back at once: the HEADs after it, and a GET that follows the log, are not refused
    as too many streams (429)."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=api_url, headers=admin) as client:
        api = Api(client, FastAPI(), api_settings(Settings(), tmp_path))
        job_id = await started_job(api, store)
        team = api.teams["nlp"]
        path = logs.rank_log(tmp_path / "agent", job_id, 1, 0).path
        path.parent.mkdir(parents=True)
        path.write_text("a line\n")
        url = f"/v1/jobs/{job_id}/logs"
        async with asyncio.timeout(30):
            for _ in range(3):
                head = await client.head(url, params={"follow": "true"}, headers=team)
                assert head.status_code == 200, head.status_code
                assert head.content == b""
            async with client.stream(
                "GET", url, params={"follow": "true"}, headers=team
            ) as followed:
                assert followed.status_code == 200
                async for text in followed.aiter_text():
                    assert text == "a line\n"
                    break
