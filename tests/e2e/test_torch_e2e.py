"""A real PyTorch job on the whole system: a 2-node x 2-rank gang on the simulated fleet that
initialises torch.distributed from the variables Gangway gives every rank (gloo), all-reduces
and checks the sum; is suspended (a preemption by request: checkpoint on SIGUSR1 with
torch.save, then eviction), and resumed from its checkpoint with torch.load.

torch is the `torch` extra of pyproject.toml, which `make test` installs; there
(GANGWAY_TEST_TORCH=required) a missing torch fails the run instead of skipping this module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted
from schemas.jobs import GangReserved, JobSucceeded, JobSuspended, TaskStarted
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

if importlib.util.find_spec("torch") is None:
    if os.environ.get("GANGWAY_TEST_TORCH") == "required":
        raise RuntimeError("torch is not importable: `make venv-torch` installs the extra")
    pytest.skip(
        "torch is not installed (the `torch` extra; `make test` installs it)",
        allow_module_level=True,
    )

with warnings.catch_warnings():
    # torch.cuda imports pynvml, whose package (a dependency of ours) warns it is deprecated.
    warnings.filterwarnings("ignore", "The pynvml package is deprecated", FutureWarning)
    import torch

pytestmark = pytest.mark.e2e

CLUSTER = "2x2"  # two nodes of two GPUs: a gang of four single-GPU ranks fills both
SCRIPT = Path(__file__).with_name("torch_job.py").resolve()
FLEET_ENV = {"GANGWAY_STOP_TIMEOUT_S": "5"}
# Importing torch takes seconds per rank on a busy machine; the test's patience allows for it.
PATIENCE_S = 240.0


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("torch-e2e")
    async with running_system(
        stack, state_dir, cluster=CLUSTER, scheduler_replicas=1, env=FLEET_ENV
    ) as running:
        await running.create_team("ml", guaranteed_gpus=4)
        yield running


async def history(system: System, stream: str) -> list[Event]:
    return [envelope.payload for envelope in await system.store.read_stream(stream)]


async def attempt_reports(system: System, job_id: str, attempt: int) -> list[dict[str, Any]]:
    """Every rank's report.json of the attempt once all four wrote theirs, by rank."""
    root = system.launcher.state_dir / "agent" / job_id / f"a{attempt}"
    reports = [root / f"rank-{rank}" / "report.json" for rank in range(4)]
    if not all(path.exists() for path in reports):
        return []
    return [json.loads(path.read_text()) for path in reports]


async def gang(system: System, job_id: str, attempt: int) -> GangReserved | None:
    for event in await history(system, f"job-{job_id}"):
        if isinstance(event, GangReserved) and event.attempt == attempt:
            return event
    return None


async def test_a_torch_gang_all_reduces_is_suspended_and_resumes_from_its_checkpoint(
    system: System,
) -> None:
    spec = {
        "name": "ddp",
        "team": "ml",
        "tasks": 4,
        "gpus_per_task": 1,
        "command": [sys.executable, str(SCRIPT)],
        # The script handles SIGUSR1 by writing its shard itself.
        "env": {"GANGWAY_CHECKPOINT_SIGNAL": "1"},
    }
    async with system.client() as api:
        response = await api.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        job_id = str(response.json()["id"])

        first = await eventually(
            lambda: attempt_reports(system, job_id, 1),
            what="every rank of the first attempt all-reduced",
            patience_s=PATIENCE_S,
        )
        reserved = await gang(system, job_id, 1)
        assert reserved is not None
        nodes = {placement.rank: placement.node_id for placement in reserved.ranks}
        assert len(set(nodes.values())) == 2  # two nodes, two ranks each
        assert {r["all_reduce_sum"] for r in first} == {1.0 + 2.0 + 3.0 + 4.0}
        envs = [r["env"] for r in first]
        assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert {e["WORLD_SIZE"] for e in envs} == {"4"}
        assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {
            (envs[0]["MASTER_ADDR"], envs[0]["MASTER_PORT"])
        }
        for rank, env in enumerate(envs):
            same_node = sorted(r for r, node in nodes.items() if node == nodes[rank])
            assert int(env["LOCAL_RANK"]) == same_node.index(rank)
            assert env["NODE_RANK"] == ("0" if nodes[rank] == nodes[0] else "1")

        response = await api.post(f"/v1/jobs/{job_id}/suspend")
        assert response.status_code == 202, response.text

        async def suspended() -> bool:
            return any(isinstance(e, JobSuspended) for e in await history(system, f"job-{job_id}"))

        await eventually(suspended, what="the gang checkpointed and suspended", patience_s=120)
        committed = [
            e
            for e in await history(system, f"checkpoint-{job_id}")
            if isinstance(e, CheckpointCommitted)
        ]
        assert committed, "suspended without a committed checkpoint"
        checkpoint = committed[-1]
        assert sorted(shard.rank for shard in checkpoint.shards) == [0, 1, 2, 3]
        # The shards are what the ranks' torch.save wrote: a step and its weights.
        directory = system.launcher.state_dir / "checkpoints" / job_id / checkpoint.checkpoint_id
        saved = [torch.load(directory / f"rank-{rank}.bin", weights_only=True) for rank in range(4)]
        assert all(state["step"] >= 1 for state in saved)
        assert all(torch.equal(s["weights"], torch.full((4,), s["step"] * 10.0)) for s in saved)

        response = await api.post(f"/v1/jobs/{job_id}/resume")
        assert response.status_code == 202, response.text

    async def resumed_attempt() -> int:
        attempts = [
            e.attempt
            for e in await history(system, f"job-{job_id}")
            if isinstance(e, TaskStarted) and e.attempt > 1
        ]
        return max(attempts, default=0)

    attempt = await eventually(resumed_attempt, what="the job resumed", patience_s=60)
    second = await eventually(
        lambda: attempt_reports(system, job_id, attempt),
        what="every rank of the resumed attempt all-reduced",
        patience_s=PATIENCE_S,
    )
    assert [r["resumed_from_step"] for r in second] == [s["step"] for s in saved]
    assert all(r["resumed_weights_ok"] for r in second)
    assert {r["all_reduce_sum"] for r in second} == {10.0}
    # A new attempt rendezvouses on a port of its own.
    assert {r["env"]["MASTER_PORT"] for r in second} != {envs[0]["MASTER_PORT"]}

    async def succeeded() -> bool:
        return any(isinstance(e, JobSucceeded) for e in await history(system, f"job-{job_id}"))

    await eventually(succeeded, what="the resumed job finished its steps", patience_s=60)
    violations, _ = await system.audit()
    assert violations == []
