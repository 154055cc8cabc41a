"""Commands on jobs (hold, release, PATCH, cancel, suspend, resume) are bounded per team
(GANGWAY_TEAM_COMMANDS_PER_SECOND, a bucket shared by every API process): toggling a hold or a
PATCH back and forth cannot flood the log every team shares. A command that changes nothing
records nothing."""

from __future__ import annotations

import pytest

from services.runtime import EventStore
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

# One command, then one more only a hundred seconds later: no test outlasts that.
API_OVERRIDES = {"team_commands_per_second": 0.01}


async def types(store: EventStore, job_id: str) -> list[str]:
    return [envelope.type for envelope in await store.read_stream(f"job-{job_id}")]


async def test_a_team_past_its_command_rate_is_answered_429_and_nothing_is_recorded(
    api: Api, store: EventStore
) -> None:
    nlp = await api.create_team("nlp")
    vision = await api.create_team("vision")
    ours = await api.submit(nlp)
    theirs = await api.submit(vision, team="vision")

    assert (await api.client.post(f"/v1/jobs/{ours}/hold", headers=nlp)).status_code == 200
    for method, path, body in (
        ("POST", f"/v1/jobs/{ours}/release", None),
        ("PATCH", f"/v1/jobs/{ours}", {"hold": False}),
        ("POST", f"/v1/jobs/{ours}/cancel", None),
        ("POST", f"/v1/jobs/{ours}/suspend", None),
    ):
        refused = await api.client.request(method, path, json=body, headers=nlp)
        assert refused.status_code == 429, (path, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.json()["type"].endswith("/rate-limited")
        assert int(refused.headers["Retry-After"]) >= 1
    assert await types(store, ours) == ["JobSubmitted", "JobHeld"]

    # Another team's commands and the admin's go on.
    assert (await api.client.post(f"/v1/jobs/{theirs}/hold", headers=vision)).status_code == 200
    released = await api.client.post(f"/v1/jobs/{ours}/release", headers=api.as_admin())
    assert released.status_code == 200 and released.json()["held"] is False


async def test_a_team_cannot_flood_the_log_with_tokens_or_secrets_either(
    api: Api, store: EventStore
) -> None:
    """Found by the hostile-tenant run: a team token could issue tokens and set 32 kB secrets
    as fast as it could send them, each an event the log keeps for ever."""
    nlp = await api.create_team("nlp")
    secret = {"value": "s" * 32_768}
    assert (await api.client.put("/v1/teams/nlp/secrets/a", json=secret, headers=nlp)).is_success
    for method, path, body in (
        ("PUT", "/v1/teams/nlp/secrets/b", secret),
        ("DELETE", "/v1/teams/nlp/secrets/a", None),
        ("POST", "/v1/teams/nlp/tokens", {"name": "ci"}),
    ):
        refused = await api.client.request(method, path, json=body, headers=nlp)
        assert refused.status_code == 429, (path, refused.text)
        assert refused.json()["type"].endswith("/rate-limited")
    listed = await api.client.get("/v1/teams/nlp/secrets", headers=nlp)
    assert listed.json()["items"] == ["a"]
    # The admin manages the team's tokens and secrets unbounded.
    issued = await api.client.post(
        "/v1/teams/nlp/tokens", json={"name": "ci"}, headers=api.as_admin()
    )
    assert issued.status_code == 201, issued.text
