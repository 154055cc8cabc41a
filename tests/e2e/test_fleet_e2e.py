"""The node fleet end to end: lost nodes, sick GPUs and drains, with every service a process.

Faults are injected the way an operator would simulate them: a file per node in the fleet's
fault directory (services/agent/faults.py). Everything is observed in the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted
from schemas.jobs import GangReserved, JobRequeued, TaskExited, TaskStarted
from schemas.nodes import (
    GpuUnhealthy,
    NodeDrained,
    NodeDrainRequested,
    NodeLost,
    NodeRecovered,
    StragglerDetected,
)
from services.agent.faults import heal, inject
from services.runtime.kafka import connection_options, make_producer
from services.runtime.topics import Topics
from tests.e2e.system import System, eventually, running_system
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

CLUSTER = "8x8:2:2"
FLEET_ENV = {
    # Short, so that a silent node is lost within seconds; the grace keeps the fleet from
    # being declared lost while the services start one after the other.
    "GANGWAY_HEARTBEAT_INTERVAL_S": "0.5",
    "GANGWAY_HEARTBEAT_TIMEOUT_S": "5",
    "GANGWAY_STARTUP_GRACE_S": "20",
    "GANGWAY_STOP_TIMEOUT_S": "2",
    # The cluster's floor under checkpoint.interval_s, low enough for a test of seconds.
    "GANGWAY_CHECKPOINT_MIN_INTERVAL_S": "1",
}


@pytest.fixture(scope="module")
async def system(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    state_dir: Path = tmp_path_factory.mktemp("fleet-e2e")
    async with running_system(
        stack, state_dir, cluster=CLUSTER, scheduler_replicas=1, env=FLEET_ENV
    ) as running:
        async with running.client() as api:
            response = await api.post(
                "/v1/teams", json={"name": "ml", "guaranteed_gpus": 64, "max_gpus": None}
            )
            assert response.status_code == 201, response.text
        yield running


SUBMITTED: list[str] = []


@pytest.fixture(autouse=True)
async def cancel_what_the_test_submitted(system: System) -> AsyncIterator[None]:
    """Each test's jobs run until cancelled: cancel them after it, so the next test finds
    the fleet free."""
    yield
    async with system.client() as api:
        while SUBMITTED:
            await api.post(f"/v1/jobs/{SUBMITTED.pop()}/cancel")


def fault_dir(system: System) -> Path:
    return system.launcher.state_dir / "faults"


async def history(system: System, stream: str) -> list[Event]:
    return [envelope.payload for envelope in await system.store.read_stream(stream)]


async def submit(system: System, **fields: Any) -> str:
    body = {
        "name": "fleet",
        "team": "ml",
        "tasks": 2,
        "gpus_per_task": 8,
        "command": ["sleep", "600"],
        **fields,
    }
    async with system.client() as api:
        response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    SUBMITTED.append(str(response.json()["id"]))
    return SUBMITTED[-1]


async def gang_of(system: System, job_id: str, attempt: int) -> GangReserved | None:
    for event in await history(system, f"job-{job_id}"):
        if isinstance(event, GangReserved) and event.attempt == attempt:
            return event
    return None


async def running_gang(system: System, job_id: str, attempt: int) -> GangReserved:
    """Wait until `attempt` of the job is reserved and every rank of it has started."""
    gang = await eventually(
        lambda: gang_of(system, job_id, attempt), what=f"attempt {attempt} of {job_id} reserved"
    )

    async def all_started() -> bool:
        started = {
            e.rank
            for e in await history(system, f"job-{job_id}")
            if isinstance(e, TaskStarted) and e.attempt == attempt
        }
        return started == {r.rank for r in gang.ranks}

    await eventually(all_started, what=f"every rank of attempt {attempt} started")
    return gang  # type: ignore[no-any-return]


async def node_event(system: System, node_id: str, kind: type[Event]) -> Event | None:
    for event in await history(system, f"node-{node_id}"):
        if isinstance(event, kind):
            return event
    return None


async def test_a_gpu_reporting_xid_79_is_unhealthy_and_its_node_drained(system: System) -> None:
    node = "n0007"
    inject(fault_dir(system), node, {"gpus": {"5": {"xid_errors": [79]}}})
    try:
        unhealthy = await eventually(
            lambda: node_event(system, node, GpuUnhealthy), what="GpuUnhealthy recorded"
        )
        assert isinstance(unhealthy, GpuUnhealthy) and unhealthy.gpu_index == 5
        drain = await eventually(
            lambda: node_event(system, node, NodeDrainRequested), what="drain requested"
        )
        assert isinstance(drain, NodeDrainRequested) and "XID 79" in drain.reason
        await eventually(lambda: node_event(system, node, NodeDrained), what="node drained")
    finally:
        heal(fault_dir(system), node)


async def test_a_silent_node_is_lost_and_its_gang_restarts_whole_elsewhere(
    system: System,
) -> None:
    job_id = await submit(system)
    first = await running_gang(system, job_id, 1)
    silent = first.ranks[0].node_id
    inject(fault_dir(system), silent, {"silent": True})
    try:
        lost = await eventually(lambda: node_event(system, silent, NodeLost), what="node lost")
        assert isinstance(lost, NodeLost) and lost.last_heartbeat_at is not None

        async def requeued() -> JobRequeued | None:
            for event in await history(system, f"job-{job_id}"):
                if isinstance(event, JobRequeued) and event.attempt == 1:
                    return event
            return None

        assert (await eventually(requeued, what="the gang requeued")).code == "node_lost"
        second = await running_gang(system, job_id, 2)
        assert silent not in {rank.node_id for rank in second.ranks}
        assert len(second.ranks) == len(first.ranks)

        async def first_attempt_stopped() -> bool:
            exited = {
                e.rank
                for e in await history(system, f"job-{job_id}")
                if isinstance(e, TaskExited) and e.attempt == 1
            }
            return exited == {rank.rank for rank in first.ranks}

        # Whole: the rank on the healthy node is stopped too, not left running.
        await eventually(first_attempt_stopped, what="every rank of the lost gang stopped")
    finally:
        heal(fault_dir(system), silent)
    await eventually(lambda: node_event(system, silent, NodeRecovered), what="the node heard again")


async def test_a_gang_on_a_draining_node_checkpoints_and_resumes_from_it(system: System) -> None:
    command = ["sh", "-c", 'echo "$GANGWAY_CHECKPOINT_DIR" > resume-from; exec sleep 600']
    job_id = await submit(system, command=command)
    first = await running_gang(system, job_id, 1)
    hot = first.ranks[1].node_id
    # Two GPUs hot for consecutive heartbeats: drain the node, evicting its gang gracefully.
    inject(
        fault_dir(system), hot, {"gpus": {"0": {"temperature_c": 95}, "1": {"temperature_c": 96}}}
    )
    try:

        async def committed() -> CheckpointCommitted | None:
            for event in await history(system, f"checkpoint-{job_id}"):
                if isinstance(event, CheckpointCommitted):
                    return event
            return None

        checkpoint = await eventually(committed, what="the preempted gang's checkpoint")
        assert isinstance(checkpoint, CheckpointCommitted)
        assert sorted(shard.rank for shard in checkpoint.shards) == [0, 1]
        second = await running_gang(system, job_id, 2)
        assert hot not in {rank.node_id for rank in second.ranks}
    finally:
        heal(fault_dir(system), hot)

    resume_file = system.launcher.state_dir / "agent" / job_id / "a2" / "rank-0" / "resume-from"

    async def resumed_from() -> str:
        return resume_file.read_text().strip() if resume_file.exists() else ""

    where = await eventually(resumed_from, what="the resumed rank told its checkpoint")
    assert where.endswith(f"{job_id}/{checkpoint.checkpoint_id}")


async def test_a_job_with_a_checkpoint_interval_is_checkpointed_while_it_runs(
    system: System,
) -> None:
    job_id = await submit(system, tasks=1, checkpoint={"interval_s": 1})
    await running_gang(system, job_id, 1)

    async def commits() -> list[CheckpointCommitted]:
        found = [
            e
            for e in await history(system, f"checkpoint-{job_id}")
            if isinstance(e, CheckpointCommitted)
        ]
        return found if len(found) >= 2 else []

    found = await eventually(commits, what="two periodic checkpoints committed")
    assert len({c.checkpoint_id for c in found}) == len(found)
    still = [e for e in await history(system, f"job-{job_id}") if isinstance(e, TaskExited)]
    assert still == []


async def test_a_rank_stepping_far_slower_than_its_gang_is_reported_as_a_straggler(
    system: System,
) -> None:
    # Rank 2 takes 5 s a step, the others 1 s: each rank reports its steps to the agent.
    script = (
        'pace=1.0; [ "$GANGWAY_RANK" = 2 ] && pace=5.0; i=0; '
        'while :; do echo "$i $pace" >> "$GANGWAY_STEP_FILE"; i=$((i+1)); sleep 0.1; done'
    )
    job_id = await submit(system, tasks=3, gpus_per_task=1, command=["sh", "-c", script])
    gang = await running_gang(system, job_id, 1)
    slow_node = next(r.node_id for r in gang.ranks if r.rank == 2)

    async def straggler() -> StragglerDetected | None:
        for event in await history(system, f"node-{slow_node}"):
            if isinstance(event, StragglerDetected) and event.job_id == job_id:
                return event
        return None

    found = await eventually(straggler, what="the slow rank reported as a straggler")
    assert isinstance(found, StragglerDetected)
    assert (found.rank, found.step_time_s) == (2, 5.0)


async def test_cancelling_a_running_job_stops_every_rank(system: System) -> None:
    job_id = await submit(system)
    gang = await running_gang(system, job_id, 1)
    async with system.client() as api:
        response = await api.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code < 300, response.text

    async def stopped() -> set[int]:
        return {
            e.rank
            for e in await history(system, f"job-{job_id}")
            if isinstance(e, TaskExited) and e.reason == "cancelled"
        }

    async def all_stopped() -> bool:
        return await stopped() == {rank.rank for rank in gang.ranks}

    await eventually(all_stopped, what="every rank of the cancelled job stopped")


async def test_malformed_telemetry_is_dead_lettered_and_the_services_go_on(
    system: System,
) -> None:
    topics = Topics.from_settings(system.settings)
    producer = make_producer(system.settings, client_id="e2e-garbage")
    await producer.start()
    try:
        await producer.send_and_wait(topics.telemetry, b"\x00 not a heartbeat", key=b"n0003")
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topics.deadletter,
        **connection_options(system.settings),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:

        async def dead_letters_by() -> set[str]:
            found = set()
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    headers = dict(record.headers or ())
                    if record.value == b"\x00 not a heartbeat":
                        found.add(headers[b"deadletter.consumer".decode()].decode())
            return found

        seen: set[str] = set()

        async def both_dead_lettered() -> bool:
            seen.update(await dead_letters_by())
            return {"inventory", "health"} <= seen

        await eventually(both_dead_lettered, what="the message dead-lettered by both")
    finally:
        await consumer.stop()

    node = "n0006"
    inject(fault_dir(system), node, {"gpus": {"2": {"ecc_uncorrected": 3}}})
    try:
        await eventually(
            lambda: node_event(system, node, GpuUnhealthy), what="health still judging"
        )
    finally:
        heal(fault_dir(system), node)


async def test_a_job_with_an_automatic_interval_is_given_one_and_its_ranks_are_told(
    system: System,
) -> None:
    """`checkpoint: {interval_s: auto}`: the scheduler records the Young-Daly interval in the
    gang's GangReserved (nothing measured yet: the priors') and every rank gets it."""
    job_id = await submit(
        system,
        tasks=1,
        checkpoint={"interval_s": "auto"},
        command=["sh", "-c", 'echo "interval=$GANGWAY_CHECKPOINT_INTERVAL_S"; sleep 600'],
    )
    gang = await running_gang(system, job_id, 1)
    assert gang.checkpoint_interval_s is not None and gang.checkpoint_interval_s > 60

    async def told() -> str:
        async with system.client() as api:
            response = await api.get(f"/v1/jobs/{job_id}/logs")
        return response.text if "interval=" in response.text else ""

    output = await eventually(told, what="the rank printed its interval")
    assert f"interval={gang.checkpoint_interval_s:.10g}" in output
