"""Slice and share jobs over REST, with every service a process: `mig_profile` jobs and
`gpu_fraction` jobs reach `running` sharing one GPU with another job, GET /v1/nodes shows the
GPU's geometry and who runs in each slice or share, and the ranks see the device variables of
DESIGN §8 (a MIG device UUID; MPS's compute percentage and memory limit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

# Print the device variables, then stay a while: two jobs must run at once to share a GPU.
PRINT_ENV_AND_STAY = [
    "sh",
    "-c",
    'echo "CVD=$CUDA_VISIBLE_DEVICES PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE '
    'MEM=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"; sleep 600',
]

# One node whose GPUs the scheduler may cut (a short re-partition), one whole-GPU node.
CLUSTER = """groups:
  - {count: 1, gpus: 2, gpu_type: H100, mig: dynamic, reconfigure_s: 1}
  - {count: 1, gpus: 2, gpu_type: H100}
"""


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("sharing-e2e")
    cluster = state_dir / "cluster.yaml"
    cluster.write_text(CLUSTER)
    async with running_system(
        stack, state_dir, cluster=str(cluster), scheduler_replicas=1
    ) as running:
        yield running


async def run_pair(system: System, team: str, specs: list[dict[str, Any]]) -> list[str]:
    """Submit the jobs, wait until all run; their ids."""
    token = await system.create_team(team, guaranteed_gpus=1)
    ids: list[str] = []
    async with system.client(token) as api:
        for spec in specs:
            submitted = await api.post("/v1/jobs", json={"team": team, **spec})
            assert submitted.status_code == 201, submitted.text
            ids.append(submitted.json()["id"])

        async def all_running() -> bool:
            states = [(await api.get(f"/v1/jobs/{j}")).json()["state"] for j in ids]
            return all(state == "running" for state in states)

        await eventually(all_running, what=f"jobs {ids} running")
    return ids


async def rank_log(system: System, job_id: str) -> str:
    path = system.launcher.logs_dir.parent / "agent" / job_id / "a1" / "rank-0" / "rank.log"

    async def printed() -> str | None:
        text = path.read_text() if path.is_file() else ""
        return text if "CVD=" in text else None

    found: str = await eventually(printed, what=f"the device variables in {path}")
    return found


async def gpu_of(system: System, job_id: str) -> tuple[str, dict[str, Any]]:
    async with system.client() as admin:
        nodes = (await admin.get("/v1/nodes")).json()["items"]
    for node in nodes:
        for gpu in node["gpu_details"]:
            holders = [s.get("job") for s in gpu["geometry"]] + [s["job"] for s in gpu["shares"]]
            if job_id in holders or gpu["job"] == job_id:
                return node["id"], gpu
    raise AssertionError(f"job {job_id} is on no GPU of GET /v1/nodes: {nodes}")


async def cancel(system: System, ids: list[str]) -> None:
    async with system.client() as admin:
        for job_id in ids:
            await admin.post(f"/v1/jobs/{job_id}/cancel")


async def test_two_mig_slices_run_on_one_gpu_with_their_mig_devices(system: System) -> None:
    ids = await run_pair(
        system,
        "serve",
        [
            {"name": "infer-a", "mig_profile": "1g.10gb", "command": PRINT_ENV_AND_STAY},
            {"name": "infer-b", "mig_profile": "1g.10gb", "command": PRINT_ENV_AND_STAY},
        ],
    )
    (node_a, gpu_a), (node_b, gpu_b) = [await gpu_of(system, j) for j in ids]
    assert (node_a, gpu_a["index"]) == (node_b, gpu_b["index"]), "one GPU, two slices"
    assert gpu_a["mode"] == "mig"
    busy = sorted(s["job"] for s in gpu_a["geometry"] if not s["free"])
    assert busy == sorted(ids)
    logs = [await rank_log(system, j) for j in ids]
    devices = {log.split("CVD=", 1)[1].split()[0] for log in logs}
    assert all(device.startswith("MIG-") for device in devices), logs
    assert len(devices) == 2, "each slice is its own MIG device"
    assert all("PCT= " in log for log in logs), logs
    await cancel(system, ids)


async def test_two_mps_shares_of_one_team_run_on_one_gpu_under_mps_limits(
    system: System,
) -> None:
    ids = await run_pair(
        system,
        "lab",
        [
            {
                "name": f"notebook-{n}",
                "gpu_fraction": 0.25,
                "gpu_memory_mb": 20000,
                "command": PRINT_ENV_AND_STAY,
            }
            for n in range(2)
        ],
    )
    (node_a, gpu_a), (node_b, gpu_b) = [await gpu_of(system, j) for j in ids]
    assert (node_a, gpu_a["index"]) == (node_b, gpu_b["index"]), "one GPU, two shares"
    assert gpu_a["mode"] == "shared" and gpu_a["shared_thousandths"] == 500
    for job_id in ids:
        log = await rank_log(system, job_id)
        assert "PCT=25 MEM=0=20000M" in log, log
        assert "CVD=MIG-" not in log, log
    async with system.client() as admin:
        usage = (await admin.get("/v1/nodes")).json()["items"]
    assert sum(node["allocated_gpus"] for node in usage) >= 0.5
    await cancel(system, ids)
