"""Pipelines and arrays end to end: REST → log → admission → scheduler → agents running ranks.

A three-stage pipeline (preprocess → train → eval) runs stage after stage; when its middle
stage fails the last is cancelled with the reason and never placed; the elements of an array
learn their index from GANGWAY_ARRAY_INDEX.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from schemas.jobs import GangReserved, JobSucceeded
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("pipelines-e2e")
    async with running_system(stack, state_dir, cluster="2x8:2:1", scheduler_replicas=1) as up:
        await up.create_team("ml", guaranteed_gpus=16)
        yield up


def stage(name: str, script: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": "ml",
        "tasks": 1,
        "gpus_per_task": 1,
        "max_retries": 0,
        "command": ["sh", "-c", script],
        **fields,
    }


async def states(system: System, ids: list[str]) -> list[str]:
    async with system.client() as api:
        return [(await api.get(f"/v1/jobs/{job_id}")).json()["state"] for job_id in ids]


async def submit_batch(system: System, specs: list[dict[str, Any]]) -> list[str]:
    async with system.client() as api:
        response = await api.post("/v1/jobs:batch", json={"jobs": specs})
    assert response.status_code == 201, response.text
    return [job["id"] for job in response.json()["jobs"]]


async def positions(system: System, job_id: str) -> dict[str, int]:
    """The log position of the job's first GangReserved and of its JobSucceeded."""
    found: dict[str, int] = {}
    for envelope in await system.store.read_stream(f"job-{job_id}"):
        for kind in (GangReserved, JobSucceeded):
            if isinstance(envelope.payload, kind):
                found.setdefault(kind.type, envelope.position or 0)
    return found


async def test_a_pipeline_runs_each_stage_after_the_one_it_depends_on(system: System) -> None:
    ids = await submit_batch(
        system,
        [
            stage("preprocess", "sleep 1"),
            stage("train", "sleep 1", depends_on=[{"job": "preprocess"}]),
            stage("eval", "true", depends_on=[{"job": "train", "condition": "finished"}]),
        ],
    )

    async def done() -> bool:
        return await states(system, ids) == ["succeeded"] * 3

    await eventually(done, what="the three stages succeeded", patience_s=90)
    prep, train, evaluate = [await positions(system, job_id) for job_id in ids]
    assert prep["JobSucceeded"] < train["GangReserved"]
    assert train["JobSucceeded"] < evaluate["GangReserved"]


async def test_when_the_middle_stage_fails_the_last_is_cancelled_with_the_reason(
    system: System,
) -> None:
    ids = await submit_batch(
        system,
        [
            stage("preprocess", "true"),
            stage("train", "exit 3", depends_on=[{"job": "preprocess"}]),
            stage("eval", "true", depends_on=[{"job": "train"}]),
        ],
    )

    async def settled() -> bool:
        return await states(system, ids) == ["succeeded", "failed", "cancelled"]

    await eventually(settled, what="train failed and eval cancelled", patience_s=90)
    async with system.client() as api:
        evaluate = (await api.get(f"/v1/jobs/{ids[2]}")).json()
    assert f"job {ids[1]} ended failed" in evaluate["reason"]
    assert "GangReserved" not in await positions(system, ids[2])


async def test_each_array_element_knows_its_index(system: System) -> None:
    async with system.client() as api:
        response = await api.post(
            "/v1/jobs",
            json=stage(
                "sweep", 'echo "index=$GANGWAY_ARRAY_INDEX"', array={"count": 3, "max_parallel": 2}
            ),
        )
    assert response.status_code == 201, response.text
    elements = response.json()["array"]

    async def done() -> bool:
        return await states(system, elements) == ["succeeded"] * 3

    await eventually(done, what="every element succeeded", patience_s=90)
    work_dir = system.launcher.state_dir / "agent"
    for index, element in enumerate(elements):
        log = (work_dir / element / "a1" / "rank-0" / "rank.log").read_text()
        assert f"index={index}" in log
