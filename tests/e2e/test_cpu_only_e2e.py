"""CPU-only tasks over REST, with every service a process (DESIGN §8): a preprocessing job of
`gpus_per_task: 0` is admitted, placed on CPUs alone, run by its agent with no GPU visible, and
succeeds; as the first stage of a pipeline, the GPU stage after it starts once it succeeded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from schemas.jobs import GangReserved, JobSucceeded
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

CLUSTER = "groups:\n  - {count: 2, gpus: 8, cpus: 16, memory_mb: 65536}\n"
PRINT_DEVICES = ["sh", "-c", 'echo "CVD=[$CUDA_VISIBLE_DEVICES] RANK=$GANGWAY_RANK"']


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("cpu-only-e2e")
    cluster = state_dir / "cluster.yaml"
    cluster.write_text(CLUSTER)
    async with running_system(stack, state_dir, cluster=str(cluster), scheduler_replicas=1) as up:
        await up.create_team("prep", guaranteed_gpus=8)
        yield up


async def finished(system: System, job_id: str) -> str:
    async with system.client() as api:

        async def ended() -> str | None:
            state = (await api.get(f"/v1/jobs/{job_id}")).json()["state"]
            return state if state in ("succeeded", "failed", "rejected", "cancelled") else None

        result: str = await eventually(ended, what=f"job {job_id} ended", patience_s=90)
        return result


def rank_log(system: System, job_id: str, rank: int) -> str:
    state_dir = system.launcher.logs_dir.parent
    return (state_dir / "agent" / job_id / "a1" / f"rank-{rank}" / "rank.log").read_text()


async def test_a_cpu_only_job_runs_on_cpus_alone_and_succeeds(system: System) -> None:
    spec = {
        "name": "tokenize",
        "team": "prep",
        "tasks": 2,
        "gpus_per_task": 0,
        "cpus_per_task": 4,
        "memory_mb_per_task": 8192,
        "command": PRINT_DEVICES,
    }
    async with system.client() as api:
        submitted = await api.post("/v1/jobs", json=spec)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]

    assert await finished(system, job_id) == "succeeded"

    gangs = [e.payload for e in await system.store.read_stream(f"job-{job_id}")
             if isinstance(e.payload, GangReserved)]  # fmt: skip
    assert [rank.gpus for rank in gangs[0].ranks] == [[], []]
    for rank in (0, 1):
        assert f"CVD=[] RANK={rank}" in rank_log(system, job_id, rank)
    async with system.client() as api:
        view = (await api.get(f"/v1/jobs/{job_id}")).json()
    assert view["state"] == "succeeded"
    violations, unexplained = await system.audit()
    assert violations == [] and unexplained == []


async def test_a_cpu_only_preprocessing_stage_feeds_a_gpu_stage(system: System) -> None:
    def stage(name: str, **fields: Any) -> dict[str, Any]:
        return {"name": name, "team": "prep", "max_retries": 0, "command": PRINT_DEVICES, **fields}

    async with system.client() as api:
        response = await api.post(
            "/v1/jobs:batch",
            json={
                "jobs": [
                    stage("shard", gpus_per_task=0, cpus_per_task=2),
                    stage("train", gpus_per_task=1, cpus_per_task=2, depends_on=[{"job": "shard"}]),
                ]
            },
        )
    assert response.status_code == 201, response.text
    shard, train = [job["id"] for job in response.json()["jobs"]]

    assert await finished(system, train) == "succeeded"
    assert await finished(system, shard) == "succeeded"

    def position(events: list[Any], kind: type) -> int:
        return int(next(e.position for e in events if isinstance(e.payload, kind)))

    shard_events = await system.store.read_stream(f"job-{shard}")
    train_events = await system.store.read_stream(f"job-{train}")
    assert position(shard_events, JobSucceeded) < position(train_events, GangReserved)
    assert "CVD=[] " in rank_log(system, shard, 0)
    assert "CVD=[] " not in rank_log(system, train, 0)
