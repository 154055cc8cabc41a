"""A job's output, read over REST with every service a process: the API asks the node's agent
(its log endpoint, requests signed with the services' key) and never reads the agent's disk;
another team's token sees nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("logs-e2e")
    async with running_system(stack, state_dir, cluster="1x8", scheduler_replicas=1) as running:
        yield running


async def test_a_finished_jobs_output_comes_from_its_agent(system: System) -> None:
    tokens = {team: await system.create_team(team, guaranteed_gpus=4) for team in ("nlp", "vision")}
    spec = {"name": "hello", "team": "nlp", "gpus_per_task": 1, "command": ["echo", "hi there"]}
    async with system.client(tokens["nlp"]) as api:
        submitted = await api.post("/v1/jobs", json=spec)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]

        async def finished() -> str | None:
            state = (await api.get(f"/v1/jobs/{job_id}")).json()["state"]
            return state if state in ("succeeded", "failed") else None

        assert await eventually(finished, what=f"job {job_id} finished") == "succeeded"
        output = await api.get(f"/v1/jobs/{job_id}/logs")
        assert output.status_code == 200, output.text
        assert output.text == "hi there\n"
        followed = await api.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"})
        assert followed.text == "hi there\n"  # the attempt is over: the stream ends
    async with system.client(tokens["vision"]) as other:
        assert (await other.get(f"/v1/jobs/{job_id}/logs")).status_code == 404
