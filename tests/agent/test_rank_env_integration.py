"""Two agents, one node each, run a gang together: without talking to each other they give
its four ranks one MASTER_ADDR and MASTER_PORT, and each rank its place in the gang."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.jobs import GangReserved, JobSpec, JobSubmitted, RankPlacement, TaskExited
from services.agent.agent import Agent
from services.agent.ranks import derived_master_port
from services.agent.settings import AgentSettings
from services.runtime import EventStore, Settings
from services.runtime.discovery import load_cluster_spec
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

NODES = load_cluster_spec("2x8")  # n0000, n0001
VARIABLES = "MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK"
SHOW_ENV = ["sh", "-c", " ".join(f'echo "{v}=${v}";' for v in VARIABLES.split())]


@pytest.fixture
async def agents(
    settings: Settings, store: EventStore, tmp_path: Path
) -> AsyncIterator[list[Agent]]:
    running = []
    for node in NODES:
        agent_settings = AgentSettings(
            **{
                **settings.model_dump(),
                "work_dir": tmp_path / "work",
                "checkpoint_root": tmp_path / "checkpoints",
                "fault_dir": tmp_path / "faults",
                "stop_timeout_s": 2.0,
            },
            _env_file=None,
        )
        # The agent of another node reads rank 0's node's registration from the log.
        await store.append(node.stream, None, [node])
        running.append(Agent(agent_settings, store, [node]))
    yield running
    for agent in running:
        await agent.shutdown()


async def test_agents_of_one_gang_agree_on_its_rendezvous(
    agents: list[Agent], store: EventStore, tmp_path: Path
) -> None:
    job = "jtorch"
    spec = JobSpec(name="t", team="ml", tasks=4, gpus_per_task=4, command=SHOW_ENV)
    gang = GangReserved(
        job_id=job,
        attempt=2,
        ranks=[
            RankPlacement(rank=r, node_id=NODES[r % 2].node_id, gpus=[r // 2]) for r in range(4)
        ],
    )
    await store.append(f"job-{job}", None, [JobSubmitted(job_id=job, spec=spec, submitted_by="t")])
    [envelope] = await store.append(f"job-{job}", None, [gang])
    # The second node's agent first: it must not wait for rank 0's.
    for agent in reversed(agents):
        async with agent.store.pool.acquire() as conn:
            await agent.handlers()["GangReserved"](envelope, conn)
        await agent.launches_done()

    async def all_exited() -> bool:
        events = [e.payload for e in await store.read_stream(f"job-{job}")]
        return len([e for e in events if isinstance(e, TaskExited)]) == 4

    async with asyncio.timeout(30):
        while True:
            if await all_exited():
                break
            await asyncio.sleep(0.05)
    envs = [
        dict(
            line.split("=", 1)
            for line in (tmp_path / "work" / job / "a2" / f"rank-{r}" / "rank.log")
            .read_text()
            .splitlines()
        )
        for r in range(4)
    ]
    port = str(derived_master_port(job, 2))
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) for e in envs} == {
        ("127.0.0.1", port, "4")
    }
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "2"),
        ("1", "1", "0", "2"),
        ("2", "0", "1", "2"),
        ("3", "1", "1", "2"),
    ]
    # Rank 0's agent gave the port back once the attempt's ranks on its node had exited.
    assert agents[0].master_ports.held == {}


async def test_a_busy_port_of_a_gang_shared_with_another_agent_fails_its_launch_as_transient(
    agents: list[Agent], store: EventStore
) -> None:
    job = "jbusy"
    spec = JobSpec(name="t", team="ml", tasks=2, gpus_per_task=1, command=["sleep", "600"])
    gang = GangReserved(
        job_id=job,
        attempt=1,
        ranks=[RankPlacement(rank=r, node_id=NODES[r].node_id, gpus=[0]) for r in (0, 1)],
    )
    await store.append(f"job-{job}", None, [JobSubmitted(job_id=job, spec=spec, submitted_by="t")])
    [envelope] = await store.append(f"job-{job}", None, [gang])
    port = derived_master_port(job, 1)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("0.0.0.0", port))
        except OSError:
            pytest.skip(f"port {port} is taken on this host already")
        taken.listen()
        async with agents[0].store.pool.acquire() as conn:
            await agents[0].handlers()["GangReserved"](envelope, conn)
        await agents[0].launches_done()
    [exited] = [
        e.payload
        for e in await store.read_stream(f"job-{job}")
        if isinstance(e.payload, TaskExited)
    ]
    assert (exited.rank, exited.permanent) == (0, False)
    assert exited.reason is not None
    assert f"MASTER_PORT {port} of attempt 1 is in use" in exited.reason
    assert agents[0].master_ports.held == {}
