"""A team's reads are weighed, not only counted: an answer that carries many kilobytes of job
specs (an array's view, a listing page, an array command's answer, a page of events with
submissions) costs one read per
`READ_ANSWER_BYTES` of them. An array of 1,000 elements of a 16 KiB spec answered its GET (and
each hold, release or cancel of it) with 17 MB, built in the event loop every team shares: four
clients of one team reading it in a loop took another team's p50 latency from 5 ms to 400 ms,
and 4 MiB listing pages did the same, all well within the team's 1,000 reads a second; a page
of its events (GET /v1/events) was 17 MB too."""

from __future__ import annotations

import pytest

from services.api.ratelimit import READ_ANSWER_BYTES, ReadLimiter
from tests.api.conftest import Api

pytestmark = pytest.mark.integration

# A second's worth of burst: five small reads, then one more each fifth of a second.
API_OVERRIDES = {"team_reads_per_second": 5.0}

# Forty elements of about 8 KB of spec each: about 80 reads' worth of answer.
HEAVY_ENV = {f"V{index}": "x" * 100 for index in range(40)}


async def _heavy_array(api: Api, team: str) -> str:
    created = await api.client.post(
        "/v1/jobs",
        json={
            "name": "sweep",
            "team": team,
            "tasks": 1,
            "gpus_per_task": 1,
            "env": HEAVY_ENV,
            "hold": True,
            "array": {"count": 40},
        },
        headers=api.as_admin(),
    )
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


async def _refused_then(api: Api, headers: dict[str, str]) -> None:
    """The team's next read waits for what the heavy answer cost; another team reads on."""
    refused = await api.client.get("/v1/queues", headers=headers)
    assert refused.status_code == 429, refused.text
    assert refused.json()["type"].endswith("/rate-limited")
    assert int(refused.headers["Retry-After"]) >= 5
    assert (await api.client.get("/v1/queues", headers=api.teams["vision"])).status_code == 200


@pytest.mark.parametrize(
    "answer", ["array-view", "listing", "array-command", "events-page", "job-events"]
)
async def test_a_heavy_answer_costs_the_team_reads_by_its_weight(api: Api, answer: str) -> None:
    nlp = await api.create_team("nlp")
    await api.create_team("vision")
    array_id = await _heavy_array(api, "nlp")
    if answer == "array-view":
        heavy = await api.client.get(f"/v1/jobs/{array_id}", headers=nlp)
    elif answer == "listing":
        heavy = await api.client.get("/v1/jobs", params={"limit": 1000}, headers=nlp)
    elif answer == "array-command":
        heavy = await api.client.post(f"/v1/jobs/{array_id}/release", headers=nlp)
    elif answer == "events-page":
        heavy = await api.client.get("/v1/events", params={"limit": 1000}, headers=nlp)
    else:
        # One job's events: its submission carries its spec, up to most of a 1 MiB body.
        job_id = await api.submit(
            api.as_admin(), env={f"V{index}": "x" * 1000 for index in range(200)}, hold=True
        )
        heavy = await api.client.get(f"/v1/jobs/{job_id}/events", headers=nlp)
    # The heavy answer itself is served (never refused for ever), then paid for.
    assert heavy.status_code == 200, heavy.text
    assert len(heavy.content) > 40 * READ_ANSWER_BYTES
    await _refused_then(api, nlp)


async def test_ordinary_answers_cost_one_read_each(api: Api) -> None:
    nlp = await api.create_team("nlp")
    job_id = await api.submit(api.as_admin())
    for path in ("/v1/jobs", f"/v1/jobs/{job_id}", "/v1/queues", "/v1/jobs", f"/v1/jobs/{job_id}"):
        answered = await api.client.get(path, headers=nlp)
        assert answered.status_code == 200, (path, answered.text)


def test_a_charge_goes_into_debt_once_and_refuses_while_in_debt() -> None:
    now = [0.0]
    reads = ReadLimiter(clock=lambda: now[0])
    assert reads.take("nlp", 2.0) is None  # one of the burst of two
    # The heavy answer is paid for in full, past the bucket: the debt is 10 - 1 = 9 reads.
    assert reads.charge("nlp", 2.0, 10) is None
    assert reads.take("nlp", 2.0) == pytest.approx(5.0)  # (1 - (-9)) / 2
    # A charge while in debt is refused (what it would pay for is not built).
    assert reads.charge("nlp", 2.0, 3) == pytest.approx(5.0)
    # The answer to a change already made is paid for all the same.
    assert reads.charge("nlp", 2.0, 1, refusable=False) is None
    assert reads.take("nlp", 2.0) == pytest.approx(5.5)
    now[0] = 5.5
    assert reads.take("nlp", 2.0) is None
    assert reads.charge("nlp", None, 1_000) is None
    assert reads.take("vision", 2.0) is None
