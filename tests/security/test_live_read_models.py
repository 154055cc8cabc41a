"""`gangway replay --verify` compares the running API's read models with a rebuild from the
log: a job the API shows without an event in the log (what a forged record on the bus would
have left behind) is a mismatch."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gangway.cli import main
from gangway.commands.replay import fold_read_models
from services.api.projections.verify import compare_live
from services.runtime import EventStore, Settings
from tests.api.builders import node, submitted
from tests.api.conftest import ADMIN_TOKEN, api_url
from tests.cli.test_log_commands import record, running_job, waiting_job

pytestmark = pytest.mark.integration
__all__ = ["api_url"]


def _live_jobs(url: str, states: dict[str, str]) -> list[dict[str, object]]:
    """The API's jobs once it shows each of `states` (job id: state), i.e. has caught up."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    deadline = time.monotonic() + 30
    while True:
        items = httpx.get(f"{url}/v1/jobs", headers=headers).json()["items"]
        if {str(j["id"]): j["state"] for j in items} == states:
            return list(items)
        assert time.monotonic() < deadline, "the API never showed the jobs"
        time.sleep(0.05)


def _rebuilt_differences(settings: Settings, live: list[dict[str, object]]) -> list[str]:
    async def rebuild() -> list[str]:
        store = await EventStore.connect(settings, producer="tests")
        try:
            models, _ = await fold_read_models(store, await store.head())
        finally:
            await store.close()
        return compare_live(models, live)

    return asyncio.run(rebuild())


def test_replay_verify_finds_the_live_api_in_agreement_with_the_log(
    api_url: str,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    record(settings, node("n1"), *running_job("a", [0, 1, 2, 3]), *waiting_job("b"))
    live = _live_jobs(api_url, {"a": "running", "b": "queued"})
    assert main(["replay", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "OK live read models vs the log" in out, out
    assert _rebuilt_differences(settings, live) == []


def test_a_job_shown_live_but_absent_from_the_log_is_a_mismatch(
    api_url: str,
    settings: Settings,
) -> None:
    record(settings, node("n1"), *running_job("a", [0, 1, 2, 3]))
    live = _live_jobs(api_url, {"a": "running"})
    forged = {**live[0], "id": "forged", "state": "succeeded"}
    changed = {**live[0], "state": "succeeded"}
    assert _rebuilt_differences(settings, [*live, forged]) == [
        "job forged: shown by the API, absent from the log"
    ]
    [difference] = _rebuilt_differences(settings, [changed])
    assert difference.startswith("job a: state 'succeeded' live, 'running' in the log")


def test_replay_verify_with_a_team_token_compares_that_teams_jobs(
    api_url: str,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With GANGWAY_TOKEN set to a team's token, as the README's quick start leaves it, every
    other team's job was 'in the log, not shown by the API': a MISMATCH and exit 1 on a sound
    installation."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for team in ("vision", "nlp"):
        created = httpx.post(f"{api_url}/v1/teams", json={"name": team}, headers=admin)
        assert created.status_code == 201, created.text
    record(settings, node("n1"), *running_job("a", [0, 1, 2, 3]))
    other = [submitted("v", team="vision", tasks=1, gpus_per_task=1)]
    record(settings, *other)
    _live_jobs(api_url, {"a": "running", "v": "pending"})
    monkeypatch.setenv("GANGWAY_TOKEN", created.json()["token"])
    assert main(["replay", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "OK live read models vs the log" in out, out
    # The admin still compares every team's jobs.
    monkeypatch.setenv("GANGWAY_TOKEN", ADMIN_TOKEN)
    assert main(["replay", "--verify"]) == 0
    assert "OK live read models vs the log" in capsys.readouterr().out
