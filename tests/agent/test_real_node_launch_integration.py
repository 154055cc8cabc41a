"""An agent on a real GPU host (its node discovered through NVML; a stand-in driver serving the
stored H100's table holds one MIG instance): whole GPUs are named by UUID, a slice rank gets its
instance's MIG device UUID as NVML lists it, and a slice whose instance is not on the GPU fails
its launch saying what NVML lists, rather than starting with a device that does not exist."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.jobs import (
    GangReserved,
    JobSpec,
    JobSubmitted,
    MigSlice,
    RankPlacement,
    TaskExited,
)
from schemas.nodes import NodeRegistered
from services.agent.agent import Agent
from services.agent.heartbeats import NvmlSampler
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from services.runtime.discovery import load_cluster_spec
from tests.integration.conftest import settings, stack, store
from tests.inventory.test_mig_discovery import StoredH100

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

SHOW_DEVICES = ["sh", "-c", 'echo "CVD=$CUDA_VISIBLE_DEVICES"']
# The stand-in names the first instance's MIG device so (tests/inventory).
INSTANCE_AT_4 = "MIG-00000000-aaaa-bbbb-cccc-dddddddddddd"


@pytest.fixture
async def host(
    settings: Settings, store: EventStore, tmp_path: Path
) -> AsyncIterator[tuple[Agent, NodeRegistered]]:
    [spec_node] = load_cluster_spec("1x1")
    node = spec_node.model_copy(update={"discovered_by": "nvml"})
    agent_settings = AgentSettings(
        **{
            **settings.model_dump(),
            "work_dir": tmp_path / "work",
            "checkpoint_root": tmp_path / "checkpoints",
            "fault_dir": tmp_path / "faults",
            "stop_timeout_s": 2.0,
            # The device nodes come from the real driver's /proc listing, which this host lacks.
            "rank_sandbox": "none",
        },
        _env_file=None,
    )
    await store.append(node.stream, None, [node])
    sampler = NvmlSampler(StoredH100(instances=(("3g.40gb", 4),)))
    agent = Agent(agent_settings, store, [node], sampler=sampler)
    yield agent, node
    await agent.shutdown()


async def _run(
    agent: Agent, store: EventStore, job: str, spec: JobSpec, placement: RankPlacement
) -> TaskExited:
    await store.append(f"job-{job}", None, [JobSubmitted(job_id=job, spec=spec, submitted_by="t")])
    [envelope] = await store.append(
        f"job-{job}", None, [GangReserved(job_id=job, attempt=1, ranks=[placement])]
    )
    async with agent.store.pool.acquire() as conn:
        await agent.handlers()["GangReserved"](envelope, conn)
    await agent.launches_done()
    async with asyncio.timeout(30):
        while True:
            exits = [
                e.payload
                for e in await store.read_stream(f"job-{job}")
                if isinstance(e.payload, TaskExited)
            ]
            if exits:
                return exits[0]
            await asyncio.sleep(0.05)


def _devices(tmp_path: Path, job: str) -> str:
    return (tmp_path / "work" / job / "a1" / "rank-0" / "rank.log").read_text().strip()


async def test_a_real_host_names_gpus_by_uuid_and_slices_by_nvml_s_mig_device(
    host: tuple[Agent, NodeRegistered], store: EventStore, tmp_path: Path
) -> None:
    agent, node = host
    whole = JobSpec(name="w", team="ml", gpus_per_task=1, command=SHOW_DEVICES)
    exited = await _run(
        agent, store, "jwhole", whole, RankPlacement(rank=0, node_id=node.node_id, gpus=[0])
    )
    assert exited.exit_code == 0, exited.reason
    assert _devices(tmp_path, "jwhole") == f"CVD={node.gpus[0].uuid}"

    sliced = JobSpec(name="s", team="ml", mig_profile="3g.40gb", command=SHOW_DEVICES)
    slot_4 = RankPlacement(
        rank=0, node_id=node.node_id, gpus=[0], mig=MigSlice(profile="3g.40gb", start=4)
    )
    exited = await _run(agent, store, "jslice", sliced, slot_4)
    assert exited.exit_code == 0, exited.reason
    assert _devices(tmp_path, "jslice") == f"CVD={INSTANCE_AT_4}"


async def test_a_slice_whose_instance_is_not_on_the_gpu_fails_its_launch_with_the_reason(
    host: tuple[Agent, NodeRegistered], store: EventStore
) -> None:
    agent, node = host
    sliced = JobSpec(name="s", team="ml", mig_profile="3g.40gb", command=SHOW_DEVICES)
    slot_0 = RankPlacement(
        rank=0, node_id=node.node_id, gpus=[0], mig=MigSlice(profile="3g.40gb", start=0)
    )
    exited = await _run(agent, store, "jgone", sliced, slot_0)
    assert exited.exit_code == 127
    assert exited.reason is not None
    assert "GPU 0 has no MIG instance at slice 0 (NVML lists instances at [4])" in exited.reason
    assert not exited.permanent
