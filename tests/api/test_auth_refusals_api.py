"""A token that does not authenticate is cheap to refuse: a hostile client presenting random
bearer tokens must not turn each request into a look-up in the database every team shares.

Found by the adversarial review: every request with an unknown token cost one PostgreSQL
look-up, with no bound per client. Here the API's pool reaches PostgreSQL through a proxy the
test cuts: an answer that needed the log would be a 503, one from memory is not.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from services.api.app import create_app
from services.api.auth import _LOOKUP
from services.api.auth_guard import AuthGuard, client_key
from services.api.projections.tenancy import TokenRecord
from services.runtime import Settings
from tests.api.conftest import Api, api_settings
from tests.integration.proxy import TcpProxy

pytestmark = pytest.mark.integration


@pytest.fixture
async def cut_off(
    settings: Settings, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Api, TcpProxy]]:
    """The API (a look-up of an unknown token now and then: about one in 1,000 s per address),
    its pool reaching PostgreSQL through a proxy the test can cut."""
    proxy, dsn = await TcpProxy.for_dsn(settings.pg_dsn)
    configured = api_settings(settings, tmp_path, pg_dsn=dsn, auth_failures_per_second=0.001)
    app = create_app(configured, use_bus=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=("203.0.113.7", 4242)),
            base_url="http://gangway.test",
        ) as client,
    ):
        yield Api(client, app, configured), proxy
    await proxy.cut()


def random_token() -> dict[str, str]:
    return {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}


def assert_problem(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"


async def test_a_refused_token_is_refused_again_from_memory(
    cut_off: tuple[Api, TcpProxy],
) -> None:
    api, proxy = cut_off
    stranger = random_token()
    assert_problem(await api.client.get("/v1/jobs", headers=stranger), 401)
    await proxy.cut()  # the same token again needs no look-up
    for _ in range(3):
        again = await api.client.get("/v1/jobs", headers=stranger)
        assert_problem(again, 401)
        assert again.json()["detail"] == "unknown token"
        assert again.headers["www-authenticate"].startswith("Bearer")


async def test_an_address_past_its_failed_look_ups_gets_429_without_a_look_up(
    cut_off: tuple[Api, TcpProxy],
) -> None:
    api, proxy = cut_off
    team = await api.create_team("nlp")
    assert_problem(await api.client.get("/v1/jobs", headers=random_token()), 401)
    await proxy.cut()
    for path in ("/v1/jobs", "/v1/usage", "/v1/queues"):
        flooded = await api.client.get(path, headers=random_token())
        assert_problem(flooded, 429)  # not 503: nothing was asked of the log
        assert int(flooded.headers["retry-after"]) >= 1
        assert flooded.json()["type"].endswith("/rate-limited")
    refused = await api.client.post("/v1/jobs/x/cancel", headers=random_token())
    assert_problem(refused, 429)
    await proxy.restore()
    # A token the read models know as issued is still looked up: the team behind the same
    # address as the flood keeps working.
    assert (await api.client.get("/v1/jobs", headers=team)).status_code == 200


async def test_a_good_look_up_costs_the_address_nothing(
    cut_off: tuple[Api, TcpProxy], settings: Settings, tmp_path: Path
) -> None:
    api, _ = cut_off
    await api.create_team("nlp")
    issued = await api.client.post(
        "/v1/teams/nlp/tokens", json={"name": "robot"}, headers=api.as_admin()
    )
    robot = {"Authorization": f"Bearer {issued.json()['token']}"}
    # Another API process whose read models never catch up: the robot's token is unknown to
    # it, looked up each time, and good each time.
    lagging = create_app(
        api_settings(settings, tmp_path, catch_up_interval_s=3600, auth_failures_per_second=0.001),
        use_bus=False,
    )
    async with (
        lagging.router.lifespan_context(lagging),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=lagging, client=("203.0.113.7", 1)),
            base_url="http://b",
        ) as other,
    ):
        for _ in range(3):
            assert (await other.get("/v1/jobs", headers=robot)).status_code == 200
        assert_problem(await other.get("/v1/jobs", headers=random_token()), 401)
        assert_problem(await other.get("/v1/jobs", headers=random_token()), 429)


async def test_a_revoked_token_is_refused_at_once_and_then_from_memory(
    cut_off: tuple[Api, TcpProxy],
) -> None:
    api, proxy = cut_off
    nlp = await api.create_team("nlp")
    issued = await api.client.post("/v1/teams/nlp/tokens", json={"name": "alice"}, headers=nlp)
    alice = {"Authorization": f"Bearer {issued.json()['token']}"}
    assert (await api.client.get("/v1/jobs", headers=alice)).status_code == 200
    revoked = await api.client.delete(f"/v1/teams/nlp/tokens/{issued.json()['id']}", headers=nlp)
    assert revoked.status_code == 204
    await proxy.cut()
    refused = await api.client.get("/v1/jobs", headers=alice)
    assert_problem(refused, 401)
    assert refused.json()["detail"] == "this token was revoked"


# ---------------------------------------------------------------- the guard alone


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_is_remembered_for_its_ttl_only() -> None:
    clock = Clock()
    guard = AuthGuard(dict, rate=1.0, ttl_s=30.0, clock=clock)
    guard.refuse("abc", "unknown token")
    clock.now = 29.9
    assert guard.refused("abc") == "unknown token"
    clock.now = 30.0
    assert guard.refused("abc") is None


def test_the_refusals_remembered_are_bounded_oldest_forgotten_first() -> None:
    guard = AuthGuard(dict, rate=1.0, ttl_s=30.0, capacity=2, clock=Clock())
    for digest in ("a", "b", "c"):
        guard.refuse(digest, "unknown token")
    assert [guard.refused(d) for d in ("a", "b", "c")] == [None, "unknown token", "unknown token"]


def test_an_addresss_look_ups_refill_at_the_rate_and_a_good_one_is_given_back() -> None:
    clock = Clock()
    guard = AuthGuard(dict, rate=2.0, ttl_s=30.0, clock=clock)
    assert guard.spend("x") is None and guard.spend("x") is None
    assert guard.spend("x") == pytest.approx(0.5)
    assert guard.spend("y") is None  # another address has its own bucket
    guard.give_back("x")
    assert guard.spend("x") is None
    clock.now = 0.5
    assert guard.spend("x") is None


def test_the_guard_reads_the_tokens_the_read_models_know() -> None:
    known = {"t1": TokenRecord("t1", "nlp", "default", revoked=True)}
    guard = AuthGuard(lambda: known, rate=1.0, ttl_s=30.0)
    assert guard.known("t1") == known["t1"]
    assert guard.known("t2") is None


def test_an_ipv6_client_is_counted_by_its_64_and_a_mapped_ipv4_as_itself() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff::9")
    assert client_key("2001:db8:1:2::1") != client_key("2001:db8:1:3::1")
    assert client_key("::ffff:203.0.113.7") == client_key("203.0.113.7") == "203.0.113.7"
    assert client_key(None) == "unknown"
    assert client_key("testclient") == "testclient"


async def test_a_submission_with_an_unknown_token_costs_the_guards_look_ups_only(
    cut_off: tuple[Api, TcpProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /v1/jobs` is served before the app's routes (fast_submit.py): its look-up of the
    token must go through the same guard, or each submission with a random token is a query."""
    api, _ = cut_off
    look_ups = 0
    fetchrow = asyncpg.Pool.fetchrow

    async def counted(pool: asyncpg.Pool, query: str, *args: object, **kwargs: object) -> object:
        nonlocal look_ups
        look_ups += query == _LOOKUP
        return await fetchrow(pool, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Pool, "fetchrow", counted)
    spec = {"name": "probe", "team": "nlp", "gpus_per_task": 1, "command": ["true"]}
    answers = [
        (await api.client.post("/v1/jobs", json=spec, headers=random_token())).status_code
        for _ in range(20)
    ]
    assert answers == [401] + [429] * 19
    assert look_ups == 1
