"""Slice and share jobs over REST, with every service a process: a `mig_profile` job and a
`gpu_fraction` job run, and their ranks see the device variables of DESIGN §8 (a MIG device
UUID; MPS's compute percentage and memory limit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

PRINT_ENV = [
    "sh",
    "-c",
    'echo "CVD=$CUDA_VISIBLE_DEVICES PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE '
    'MEM=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"',
]


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("sharing-e2e")
    async with running_system(stack, state_dir, cluster="2x8", scheduler_replicas=1) as running:
        yield running


async def rank_log(system: System, spec: dict[str, object]) -> str:
    token = await system.create_team(str(spec["team"]), guaranteed_gpus=4)
    async with system.client(token) as api:
        submitted = await api.post("/v1/jobs", json=spec)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]

        async def finished() -> str | None:
            state = (await api.get(f"/v1/jobs/{job_id}")).json()["state"]
            return state if state in ("succeeded", "failed") else None

        assert await eventually(finished, what=f"job {job_id} finished") == "succeeded"
    state_dir = system.launcher.logs_dir.parent
    return str((state_dir / "agent" / job_id / "a1" / "rank-0" / "rank.log").read_text())


async def test_a_mig_profile_job_runs_with_its_mig_device(system: System) -> None:
    log = await rank_log(
        system, {"name": "infer", "team": "serve", "mig_profile": "1g.10gb", "command": PRINT_ENV}
    )
    assert "CVD=MIG-" in log, log
    assert "PCT= " in log, log


async def test_a_gpu_fraction_job_runs_under_mps_limits(system: System) -> None:
    log = await rank_log(
        system,
        {
            "name": "notebook",
            "team": "lab",
            "gpu_fraction": 0.25,
            "gpu_memory_mb": 20000,
            "command": PRINT_ENV,
        },
    )
    assert "PCT=25 MEM=0=20000M" in log, log
    assert "CVD=MIG-" not in log, log
