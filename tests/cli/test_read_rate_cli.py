"""`gangway jobs` with a team's token whose reads are bounded (GANGWAY_TEAM_READS_PER_SECOND):
listing takes more reads than the burst (one per state, one per page), and the CLI waits out
each 429's Retry-After rather than failing half-way."""

from __future__ import annotations

import os

import httpx
import pytest

from gangway.cli import main

pytestmark = pytest.mark.integration

# A burst of two reads; `gangway jobs` asks once per active state (six of them).
API_OVERRIDES = {"team_reads_per_second": 2.0}


def test_jobs_waits_out_the_read_rate_and_lists_every_job(
    api_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = {"Authorization": f"Bearer {os.environ['GANGWAY_TOKEN']}"}
    created = httpx.post(f"{api_url}/v1/teams", json={"name": "nlp"}, headers=admin)
    assert created.status_code == 201, created.text
    team = {"Authorization": f"Bearer {created.json()['token']}"}
    job = {"name": "train", "team": "nlp", "tasks": 1, "gpus_per_task": 1}
    submitted = httpx.post(f"{api_url}/v1/jobs", json=job, headers=team)
    assert submitted.status_code == 201, submitted.text

    monkeypatch.setenv("GANGWAY_TOKEN", created.json()["token"])
    assert main(["jobs"]) == 0
    assert submitted.json()["id"] in capsys.readouterr().out
