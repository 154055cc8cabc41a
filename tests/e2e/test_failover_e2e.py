"""Scheduler failover end to end: two replicas as processes, the leader killed or paused."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.policy import SchedulingPolicy
from schemas.jobs import GangReserved, JobAdmitted, JobRejected
from schemas.leadership import LeaderElected
from services.scheduler.replay import verify_replay
from services.scheduler.snapshots import SnapshotStore, code_version
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

CLUSTER = "16x8:4:2"


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("failover-e2e")
    async with running_system(stack, state_dir, cluster=CLUSTER) as running:
        async with running.client() as api:
            response = await api.post(
                "/v1/teams", json={"name": "ml", "guaranteed_gpus": 64, "max_gpus": None}
            )
            assert response.status_code == 201, response.text
        yield running


def spec(index: int) -> dict[str, Any]:
    """Gangs of 1 to 16 GPUs that run for a few seconds: enough churn to bind and release."""
    gpus_per_task = (1, 2, 4, 8)[index % 4]
    return {
        "name": f"stream-{index}",
        "team": "ml",
        "tasks": 1 + index % 2,
        "gpus_per_task": gpus_per_task,
        "command": ["sleep", str(1 + index % 3)],
    }


async def submit_all(system: System, count: int, pause_s: float) -> list[str]:
    ids = []
    async with system.client() as api:
        for index in range(count):
            response = await api.post("/v1/jobs", json=spec(index))
            assert response.status_code == 201, response.text
            ids.append(str(response.json()["id"]))
            await asyncio.sleep(pause_s)
    return ids


async def leader_name(system: System) -> tuple[str, int]:
    elected = await eventually(system.leader, what="a scheduler elected")
    assert isinstance(elected, LeaderElected)
    return elected.leader_id, elected.epoch


async def elected_after(system: System, epoch: int) -> LeaderElected | None:
    elected = await system.leader()
    return elected if elected is not None and elected.epoch > epoch else None


async def scheduled(system: System, job_id: str) -> bool:
    """Decided by admission, and, if admitted, placed or finished or explained."""
    history = [e.payload for e in await system.store.read_stream(f"job-{job_id}")]
    if any(isinstance(e, JobRejected) for e in history):
        return True
    if not any(isinstance(e, JobAdmitted) for e in history):
        return False
    return any(e.type in ("GangReserved", "JobDeferred", "JobCancelled") for e in history)


async def test_killing_the_leader_while_jobs_stream_in_loses_no_job_and_binds_no_gpu_twice(
    system: System,
) -> None:
    name, epoch = await leader_name(system)
    submitting = asyncio.create_task(submit_all(system, 60, pause_s=0.05))
    await eventually(
        lambda: _has_reservations(system, 5), what="the first gangs reserved", patience_s=30
    )
    system.launcher.kill(name, signal.SIGKILL)
    job_ids = await submitting

    successor = await eventually(lambda: elected_after(system, epoch), what="a standby takes over")
    assert successor.leader_id != name

    async def all_scheduled() -> bool:
        done = await asyncio.gather(*(scheduled(system, job_id) for job_id in job_ids))
        return all(done)

    await eventually(all_scheduled, what="every submitted job decided and scheduled")

    async def audited_quiet() -> tuple[list[Any], list[str]] | None:
        violations, unexplained = await system.audit()
        return (violations, unexplained) if not unexplained else None

    violations, _ = await eventually(audited_quiet, what="no job waiting without a reason")
    assert violations == []
    policy = SchedulingPolicy()
    replayed = await verify_replay(
        system.store, policy, SnapshotStore(system.store.pool, code_version(policy))
    )
    assert replayed.ok, replayed.differences
    # The dead leader is not restarted by anyone: restart it as a standby for the next test.
    system.launcher.start(system.specs[name])


async def test_a_paused_leader_is_replaced_and_once_woken_cannot_write(system: System) -> None:
    name, epoch = await leader_name(system)
    since = len(system.launcher.read_log(name))
    system.launcher.kill(name, signal.SIGSTOP)
    try:
        successor = await eventually(
            lambda: elected_after(system, epoch), what="a standby takes over from the paused one"
        )
        handover = (await system.store.read_stream("scheduler"))[-1].position
        assert handover is not None
        [job_id] = await submit_all(system, 1, pause_s=0)
        await eventually(lambda: _reserved(system, job_id), what="the new leader schedules")
    finally:
        system.launcher.kill(name, signal.SIGCONT)

    async def stepped_down() -> bool:
        return "standing by again" in system.launcher.read_log(name)[since:]

    # It stands by again instead of exiting: the same process competes for the next term.
    await eventually(stepped_down, what="the woken leader steps down", patience_s=30)
    assert "deposed" in system.launcher.read_log(name)[since:]
    assert not await _exited(system, name)
    after = await system.store.read_all(handover, 100_000)
    assert {e.epoch for e in after if e.epoch is not None} <= {successor.epoch}
    violations, _ = await system.audit()
    assert violations == []


async def _has_reservations(system: System, count: int) -> bool:
    found = await system.store.read_all(0, 100_000, types=[GangReserved.type])
    return len(found) >= count


async def _reserved(system: System, job_id: str) -> bool:
    history = await system.store.read_stream(f"job-{job_id}")
    return any(isinstance(e.payload, GangReserved) for e in history)


async def _exited(system: System, name: str) -> bool:
    return system.launcher.pid(name) is None


async def test_a_leader_stopped_with_sigterm_leaves_a_snapshot_and_hands_over(
    system: System,
) -> None:
    name, epoch = await leader_name(system)
    assert system.launcher.stop(name)
    assert f"{name} stopped at position" in system.launcher.read_log(name)
    await eventually(lambda: elected_after(system, epoch), what="the standby takes over")
    async with system.store.pool.acquire() as conn:
        snapshots = await conn.fetchval("SELECT count(*) FROM scheduler_snapshots")
    assert snapshots >= 1
