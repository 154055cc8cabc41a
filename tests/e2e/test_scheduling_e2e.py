"""Scheduling end to end: REST → API → log → relay → admission → scheduler, as processes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.jobs import GangReserved
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

# 100 GPUs: twelve 8-GPU nodes and one 4-GPU node, racks of four nodes, two racks a block.
CLUSTER_YAML = """\
rack_size: 4
racks_per_block: 2
groups:
  - {count: 12, gpus: 8}
  - {count: 1, gpus: 4}
"""
HOLDING = ("reserved", "running")


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("scheduling-e2e")
    cluster = state_dir / "cluster.yaml"
    cluster.write_text(CLUSTER_YAML)
    async with running_system(stack, state_dir, cluster=str(cluster)) as running:
        async with running.client() as api:
            response = await api.post(
                "/v1/teams", json={"name": "llm", "guaranteed_gpus": 100, "max_gpus": None}
            )
            assert response.status_code == 201, response.text
        yield running


def spec(name: str, *, tasks: int, gpus_per_task: int, tp: int, seconds: int) -> dict[str, Any]:
    return {
        "name": name,
        "team": "llm",
        "priority": "production",
        "tasks": tasks,
        "gpus_per_task": gpus_per_task,
        "topology": {"tp_size": tp},
        "command": ["sleep", str(seconds)],
    }


async def submit(system: System, body: dict[str, Any]) -> str:
    async with system.client() as api:
        response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def job(system: System, job_id: str) -> dict[str, Any]:
    async with system.client() as api:
        response = await api.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def gang_of(system: System, job_id: str) -> GangReserved | None:
    for envelope in await system.store.read_stream(f"job-{job_id}"):
        if isinstance(envelope.payload, GangReserved):
            return envelope.payload
    return None


async def test_a_job_submitted_over_rest_is_reserved_with_each_tp_group_inside_one_node(
    system: System,
) -> None:
    # Ranks of 2 GPUs in tensor-parallel groups of 4: ranks 0-1, 2-3, … share a node.
    job_id = await submit(system, spec("tp4", tasks=8, gpus_per_task=2, tp=4, seconds=1))

    async def reserved() -> dict[str, Any] | None:
        view = await job(system, job_id)
        return view if view["state"] in (*HOLDING, "succeeded") else None

    await eventually(reserved, what=f"{job_id} reserved", patience_s=30)
    gang = await gang_of(system, job_id)
    assert gang is not None
    assert sorted(rank.rank for rank in gang.ranks) == list(range(8))
    node_of = {rank.rank: rank.node_id for rank in gang.ranks}
    for group in range(4):
        assert node_of[2 * group] == node_of[2 * group + 1]
    assert sum(len(rank.gpus) for rank in gang.ranks) == 16
    # It runs for a second and frees its GPUs for the next test.
    await eventually(
        lambda: _in_state(system, job_id, "succeeded"), what=f"{job_id} finished", patience_s=60
    )


async def test_two_64_gpu_gangs_on_100_free_gpus_one_is_reserved_the_other_holds_nothing(
    system: System,
) -> None:
    first = await submit(system, spec("gang-a", tasks=8, gpus_per_task=8, tp=8, seconds=600))
    second = await submit(system, spec("gang-b", tasks=8, gpus_per_task=8, tp=8, seconds=600))

    async def settled() -> tuple[dict[str, Any], dict[str, Any]] | None:
        views = (await job(system, first), await job(system, second))
        holding = [v for v in views if v["state"] in HOLDING]
        waiting = [v for v in views if v["state"] in ("pending", "queued") and v["reason"]]
        return views if len(holding) == 1 and len(waiting) == 1 else None

    views = await eventually(settled, what="one gang reserved, the other waiting with a reason")
    holder, waiter = sorted(views, key=lambda v: v["state"] not in HOLDING)
    assert sum(len(gpus) for gpus in holder["placement"].values()) == 64
    assert waiter["placement"] == {}
    assert await gang_of(system, waiter["id"]) is None
    violations, _ = await system.audit()
    assert violations == []


async def test_the_leader_reports_its_epoch_allocations_cycles_and_lag_on_metrics(
    system: System,
) -> None:
    elected = await system.leader()
    assert elected is not None
    port = re.findall(
        r"metrics at http://[^:]+:(\d+)/metrics", system.launcher.read_log(elected.leader_id)
    )[-1]
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    samples = {
        line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["gangway_scheduler_is_leader"] == 1
    assert samples["gangway_scheduler_leader_epoch"] == elected.epoch
    assert samples["gangway_scheduler_events_handled_total"] > 0
    assert samples["gangway_scheduler_cycle_seconds_count"] > 0
    assert "gangway_scheduler_lag_events" in samples
    assert "gangway_scheduler_gpus_allocated" in samples
    assert 'gangway_scheduler_pending_jobs{priority="production"}' in samples


async def _in_state(system: System, job_id: str, state: str) -> bool:
    return bool((await job(system, job_id))["state"] == state)
