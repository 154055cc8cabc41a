"""A real (NVML-discovered) node's slice ranks: their MIG device is the one NVML lists at
launch, and a slice whose instance NVML does not list fails to start, recorded, instead of
starting on a made-up device. The stored H100's table stands in for the driver."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.jobs import GangReserved, JobSpec, JobSubmitted, MigSlice, RankPlacement, TaskExited
from services.agent.agent import Agent
from services.agent.heartbeats import NvmlSampler
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from services.runtime.discovery import nvml_node
from tests.agent.test_agent_integration import until
from tests.agent.test_agent_launch_integration import deliver, events_of
from tests.integration.conftest import settings, stack, store
from tests.inventory.test_mig_discovery import StoredH100

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]


@pytest.fixture
async def real_agent(settings: Settings, store: EventStore, tmp_path: Path) -> AsyncIterator[Agent]:
    driver = StoredH100(instances=(("3g.40gb", 4), ("4g.40gb", 0)))
    node = nvml_node(node_id="gpu-host", rack="r0", block="b0", nvml=driver)
    assert node is not None and node.discovered_by == "nvml"
    agent_settings = AgentSettings(
        **{
            **settings.model_dump(),
            "work_dir": tmp_path / "work",
            "checkpoint_root": tmp_path / "checkpoints",
            "fault_dir": tmp_path / "faults",
            "stop_timeout_s": 2.0,
            # No sandbox: this host has no /proc/driver/nvidia to find the GPU's node in.
            "rank_isolation": "off",
        },
        _env_file=None,
    )
    agent = Agent(agent_settings, store, [node], sampler=NvmlSampler(driver))
    yield agent
    await agent.shutdown()


async def submit_slice(store: EventStore, job_id: str, start: int, seen: Path) -> GangReserved:
    spec = JobSpec(
        name="t",
        team="ml",
        tasks=1,
        mig_profile="3g.40gb",
        command=["sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {seen}; exec sleep 600'],
    )
    await store.append(
        f"job-{job_id}", None, [JobSubmitted(job_id=job_id, spec=spec, submitted_by="t")]
    )
    return GangReserved(
        job_id=job_id,
        attempt=1,
        ranks=[
            RankPlacement(
                rank=0, node_id="gpu-host", gpus=[0], mig=MigSlice(profile="3g.40gb", start=start)
            )
        ],
    )


async def test_a_slice_runs_on_the_mig_device_nvml_lists_now(
    real_agent: Agent, store: EventStore, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    await deliver(real_agent, store, "listed", await submit_slice(store, "listed", 4, seen))

    async def written() -> bool:
        return seen.exists() and bool(seen.read_text().strip())

    await until(written, "the slice rank wrote its device")
    assert seen.read_text().strip() == StoredH100().nvmlDeviceGetUUID((0, 0))


async def test_a_slice_whose_instance_nvml_does_not_list_fails_its_launch(
    real_agent: Agent, store: EventStore, tmp_path: Path
) -> None:
    """The instance was destroyed (or its GPU lost) between the reservation and the launch:
    the rank started with a synthetic MIG UUID, which no real device has, and died in CUDA's
    initialisation as if its own program had failed; the LookupError of a real node's
    missing UUID was raised outside the launch's error handling."""
    seen = tmp_path / "seen"
    await deliver(real_agent, store, "gone", await submit_slice(store, "gone", 2, seen))
    await real_agent.launches_done()

    async def exited() -> list[TaskExited]:
        return await events_of(store, "gone", TaskExited)

    await until(exited, "the launch failure recorded")
    [failure] = await exited()
    assert "no MIG instance 3g.40gb at slot 2" in (failure.reason or "")
    assert not failure.permanent  # the instance may be there again, or the gang placed elsewhere
    assert not seen.exists()
