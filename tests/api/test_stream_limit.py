"""A team holds at most `streams_per_team` long-lived streams open in an API process (followed
logs and dashboard streams together); one more is 429 problem+json with Retry-After, and a
slot comes back when a stream's client hangs up. Reads that do not follow, other teams and the
admin are not limited by it.

Found by the hostile-tenant run: each followed log polls its agent and the log twice a second
in the API's one event loop; one team opening 200 followers of one job of its own took another
team's GET /v1/jobs from 12 ms to 2 s (median) and 43 s (worst); 100 dashboard streams at the
shortest interval, to 2.5 s (worst) on a quiet cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from fastapi import FastAPI

from services.agent import logs
from services.runtime import EventStore, Settings
from tests.api.conftest import ADMIN_TOKEN, Api, api_settings
from tests.api.test_logs_api import started_job

API_OVERRIDES = {"streams_per_team": 2}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def following(
    client: httpx.AsyncClient, job_id: str, headers: dict[str, str]
) -> contextlib.AbstractAsyncContextManager[httpx.Response]:
    return streaming(client, f"/v1/jobs/{job_id}/logs", {"follow": "true"}, headers)


def watching(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> contextlib.AbstractAsyncContextManager[httpx.Response]:
    return streaming(client, "/v1/dashboard/stream", {"interval": "0.05"}, headers)


@contextlib.asynccontextmanager
async def streaming(
    client: httpx.AsyncClient, path: str, params: dict[str, str], headers: dict[str, str]
) -> AsyncIterator[httpx.Response]:
    """A stream whose answer has begun (its status and first output are in)."""
    async with client.stream("GET", path, params=params, headers=headers) as response:
        # The text iterator is kept to the end: dropping it would close the stream.
        text = response.aiter_text()
        if response.status_code == 200:
            await anext(text)
        else:
            await response.aread()
        yield response


async def test_a_team_may_follow_only_so_many_logs_at_once(
    api_url: str, store: EventStore, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=api_url, headers=ADMIN, timeout=30) as client:
        api = Api(client, FastAPI(), api_settings(Settings(), tmp_path))
        nlp_job = await started_job(api, store, "nlp")
        vision_job = await started_job(api, store, "vision")
        for job_id in (nlp_job, vision_job):
            path = logs.rank_log(tmp_path / "agent", job_id, 1, 0).path
            path.parent.mkdir(parents=True)
            path.write_text("step 1\n")
        nlp, vision = api.teams["nlp"], api.teams["vision"]

        async with asyncio.timeout(60):
            async with (
                following(client, nlp_job, nlp) as first,
                following(client, nlp_job, nlp) as second,
            ):
                assert (first.status_code, second.status_code) == (200, 200)
                async with following(client, nlp_job, nlp) as third:
                    assert third.status_code == 429
                    assert third.headers["content-type"].startswith("application/problem+json")
                    assert int(third.headers["Retry-After"]) >= 1
                    assert third.json()["type"].endswith("/too-many-streams")
                # Reading without following, another team, the admin: not limited.
                whole = await client.get(f"/v1/jobs/{nlp_job}/logs", headers=nlp)
                assert (whole.status_code, whole.text) == (200, "step 1\n")
                async with following(client, vision_job, vision) as theirs:
                    assert theirs.status_code == 200
                async with following(client, nlp_job, ADMIN) as admins:
                    assert admins.status_code == 200
                # A dashboard stream takes a slot of the same kind.
                async with watching(client, nlp) as dashboard:
                    assert dashboard.status_code == 429
                async with watching(client, vision) as theirs:
                    assert theirs.status_code == 200
            # Both followers hung up: their slots come back (once the server notices), and
            # serve a dashboard stream as well as a followed log.
            while True:
                async with (
                    following(client, nlp_job, nlp) as again,
                    watching(client, nlp) as and_again,
                ):
                    if (again.status_code, and_again.status_code) == (200, 200):
                        break
                await asyncio.sleep(0.1)
