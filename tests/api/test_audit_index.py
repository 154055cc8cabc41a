"""The per-team audit index: a team's events are found by position, whatever other teams wrote
and whatever order the bus delivered them in."""

from __future__ import annotations

import asyncio

import pytest

from schemas.checkpoints import CheckpointRequested
from schemas.jobs import JobAdmitted
from schemas.teams import TeamCreated, TeamSecretDeleted
from services.api.audit import AuditGate
from services.api.projections.model import ReadModels
from services.runtime import EventStore
from services.runtime.records import StreamAppend
from tests.api.builders import Log, submitted
from tests.api.conftest import Api

SHA = "cd" * 32
# A filter after reading would give up after this many events, with a short page.
API_OVERRIDES = {"events_scan_limit": 100}


def test_each_team_indexes_its_jobs_and_its_own_streams() -> None:
    log = Log()
    envelopes = log.record(
        TeamCreated(name="nlp", guaranteed_gpus=0, token_sha256=SHA),  # 1
        submitted("j1", "nlp"),  # 2
        submitted("j2", "vision"),  # 3
        JobAdmitted(job_id="j1", queue="nlp", priority="research"),  # 4
        CheckpointRequested(job_id="j2", attempt=1, reason="test"),  # 5
        TeamSecretDeleted(team="vision", name="hf"),  # 6
    )
    models = ReadModels()
    models.apply_all(envelopes)
    assert models.audit.after("nlp", 0, 100) == [1, 2, 4]
    assert models.audit.after("vision", 0, 100) == [3, 5, 6]
    assert models.audit.after("nlp", 2, 1) == [4]


def test_a_jobs_events_delivered_before_its_submission_join_its_team_later() -> None:
    log = Log()
    [job, checkpoint] = log.record(
        submitted("j1", "nlp"), CheckpointRequested(job_id="j1", attempt=1, reason="test")
    )
    models = ReadModels()
    models.apply(checkpoint)  # another stream: the bus may deliver it first
    assert models.audit.after("nlp", 0, 10) == []
    models.apply(job)
    assert models.audit.after("nlp", 0, 10) == [1, 2]


@pytest.mark.integration
async def test_a_teams_page_is_full_however_much_other_teams_wrote(
    api: Api, store: EventStore
) -> None:
    """Reading the log and filtering after would stop at `events_scan_limit` with short or
    empty pages; the index reads only the team's own events: two full pages, then the end."""
    nlp = await api.create_team("nlp")
    await api.create_team("vision")
    noise = [submitted(f"v{i}", "vision") for i in range(300)]
    for start in range(0, len(noise), 100):
        await store.append_many(
            [StreamAppend(e.stream, 0, [e]) for e in noise[start : start + 100]]
        )
    mine = await api.submit(nlp)

    async def team_pages() -> list[list[str]]:
        after = 0
        pages: list[list[str]] = []
        while True:
            page = (
                await api.client.get("/v1/events", params={"after": after, "limit": 2}, headers=nlp)
            ).json()
            pages.append([e["stream"] for e in page["items"]])
            after = page["next"]
            if not page["has_more"]:
                return pages

    # Pages never run past what the read models applied in order: the other team's events,
    # appended straight to the log, reach them by the log poll a moment after the submission.
    expected = [["team-nlp", "queue-nlp"], [f"job-{mine}"]]
    for _ in range(600):
        pages = await team_pages()
        if pages == expected:
            break
        await asyncio.sleep(0.05)
    assert pages == expected


async def test_a_teams_audit_reads_beyond_its_share_wait_while_another_teams_go_on() -> None:
    gate = AuditGate(per_team=2)
    release = asyncio.Event()
    entered: list[str] = []

    async def read(team: str) -> None:
        async with gate.slot(team):
            entered.append(team)
            await release.wait()

    heavy = [asyncio.create_task(read("nlp")) for _ in range(5)]
    other = asyncio.create_task(read("vision"))
    for _ in range(20):  # every task has run as far as it can
        await asyncio.sleep(0)
    assert sorted(entered) == ["nlp", "nlp", "vision"]
    release.set()
    await asyncio.gather(*heavy, other)
    assert entered.count("nlp") == 5
