"""The checkpoint service against the real log: verified shards commit, damaged ones do not."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointRequested,
)
from schemas.envelope import EventEnvelope
from schemas.jobs import (
    GangReserved,
    JobRequeued,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    RankPlacement,
)
from services.checkpoint.service import CheckpointService
from services.checkpoint.settings import CheckpointSettings
from services.runtime import EventStore, Settings
from services.runtime.checkpoint_store import (
    MANIFEST,
    checkpoint_dir,
    checkpoint_id_for,
    record_failure,
    shard_path,
    write_shard,
)
from tests.integration.conftest import settings, stack, store

pytestmark = pytest.mark.integration
__all__ = ["settings", "stack", "store"]

JOB = "j1"


def service(settings: Settings, store: EventStore, root: Path) -> CheckpointService:
    return CheckpointService(
        CheckpointSettings(**{**settings.model_dump(), "checkpoint_root": root}, _env_file=None),
        store,
    )


async def request(store: EventStore, world: int) -> EventEnvelope:
    gang = GangReserved(
        job_id=JOB,
        attempt=1,
        ranks=[RankPlacement(rank=r, node_id=f"n{r}", gpus=[0]) for r in range(world)],
    )
    await store.append(f"job-{JOB}", None, [gang])
    [envelope] = await store.append(
        f"checkpoint-{JOB}", None, [CheckpointRequested(job_id=JOB, attempt=1, reason="test")]
    )
    return envelope


async def ask(store: EventStore) -> EventEnvelope:
    [envelope] = await store.append(
        f"checkpoint-{JOB}", None, [CheckpointRequested(job_id=JOB, attempt=1, reason="test")]
    )
    return envelope


async def test_every_shard_written_commits_the_checkpoint_once(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=2)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    for rank in range(2):
        write_shard(directory, rank, b"state" * rank + b"!", step=4)
    checkpoints = service(settings, store, tmp_path)
    first = await checkpoints.collect(JOB, 1, cause, wait_s=10)
    again = await checkpoints.collect(JOB, 1, cause, wait_s=10)  # a redelivered request
    assert isinstance(first, CheckpointCommitted) and first == again
    recorded = [e.payload for e in await store.read_stream(f"checkpoint-{JOB}")]
    assert [e.type for e in recorded] == ["CheckpointRequested", "CheckpointCommitted"]
    assert (directory / MANIFEST).is_file()


async def test_a_commit_is_measured_once_its_duration_and_its_size_in_bytes(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=2)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    for rank in range(2):
        write_shard(directory, rank, b"state" * rank + b"!", step=4)
    checkpoints = service(settings, store, tmp_path)
    registry = checkpoints.registry
    requested = {"trigger": "requested"}  # neither periodic nor an eviction
    assert registry.get_sample_value("gangway_checkpoint_size_bytes_count", requested) == 0
    committed = await checkpoints.collect(JOB, 1, cause, wait_s=10)
    await checkpoints.collect(JOB, 1, cause, wait_s=10)  # a redelivery measures nothing
    assert isinstance(committed, CheckpointCommitted)
    assert registry.get_sample_value("gangway_checkpoint_size_bytes_count", requested) == 1
    assert (
        registry.get_sample_value("gangway_checkpoint_size_bytes_sum", requested)
        == 7
        == sum(shard.bytes for shard in committed.shards)
    )
    assert registry.get_sample_value("gangway_checkpoint_duration_seconds_count", requested) == 1
    periodic = {"trigger": "periodic"}
    assert registry.get_sample_value("gangway_checkpoint_duration_seconds_count", periodic) == 0


async def test_a_damaged_shard_is_recorded_as_corrupted(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=2)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    for rank in range(2):
        write_shard(directory, rank, b"0123456789", step=4)
    shard_path(directory, 1).write_bytes(b"0123456780")
    result = await service(settings, store, tmp_path).collect(JOB, 1, cause, wait_s=10)
    assert isinstance(result, CheckpointCorrupted)
    assert "rank 1: sha256 mismatch" in result.reason
    assert not (directory / MANIFEST).exists()


async def test_a_rank_that_never_writes_fails_the_checkpoint_when_its_time_is_up(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=3)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    write_shard(directory, 0, b"x", step=1)
    write_shard(directory, 1, b"y", step=1)
    result = await service(settings, store, tmp_path).collect(JOB, 1, cause, wait_s=0.5)
    assert isinstance(result, CheckpointFailed)
    assert result.reason == "timed out: no shard from rank 2 within 0.5 s"


async def test_a_request_no_rank_answers_still_ends_in_a_verdict(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=2)
    result = await service(settings, store, tmp_path).collect(JOB, 1, cause, wait_s=0.3)
    assert isinstance(result, CheckpointFailed) and "rank 0, 1" in result.reason
    recorded = [e.type for e in await store.read_stream(f"checkpoint-{JOB}")]
    assert recorded == ["CheckpointRequested", "CheckpointFailed"]


async def test_a_request_for_a_job_that_ended_is_judged_then_not_at_its_deadline(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    # A gang asked to checkpoint for a preemption finished its work within the grace period:
    # no rank is left to write a shard, and the verdict said 'timed out' two minutes after
    # the job had succeeded (attack11: 44 of 47 CheckpointFailed under a stream of work).
    cause = await request(store, world=2)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    write_shard(directory, 0, b"x", step=1)
    await store.append(f"job-{JOB}", None, [JobSucceeded(job_id=JOB, attempt=1)])
    result = await service(settings, store, tmp_path).collect(JOB, 1, cause, wait_s=600)
    assert isinstance(result, CheckpointFailed)
    assert result.reason == "the job succeeded before rank 1 wrote a shard"


async def test_a_rank_that_could_not_checkpoint_fails_it_at_once_with_its_reason(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=2)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    write_shard(directory, 0, b"x", step=1)
    record_failure(directory, 1, "FileNotFoundError: rank-1.bin.tmp")
    result = await service(settings, store, tmp_path).collect(JOB, 1, cause, wait_s=600)
    assert isinstance(result, CheckpointFailed)
    assert result.reason == "rank 1: FileNotFoundError: rank-1.bin.tmp"


async def test_shards_of_an_attempt_requeued_for_a_lost_node_are_never_committed(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=2)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    for rank in range(2):
        write_shard(directory, rank, b"state", step=3)
    await store.append(
        f"job-{JOB}",
        None,
        [JobRequeued(job_id=JOB, attempt=1, code="node_lost", reason="node n1 was lost")],
    )
    result = await service(settings, store, tmp_path).collect(JOB, 1, cause, wait_s=10)
    assert isinstance(result, CheckpointFailed)
    assert "released (requeued: node_lost)" in result.reason
    assert not (directory / MANIFEST).exists()


async def test_a_restarted_service_collects_what_was_requested_before(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    cause = await request(store, world=1)
    directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
    write_shard(directory, 0, b"state", step=2)
    restarted = service(settings, store, tmp_path)
    assert await restarted.resume_pending() == 1
    await restarted.drain()
    recorded = [e.payload for e in await store.read_stream(f"checkpoint-{JOB}")]
    assert [e.type for e in recorded] == ["CheckpointRequested", "CheckpointCommitted"]
    assert await service(settings, store, tmp_path).resume_pending() == 0


async def test_only_the_newest_good_checkpoints_stay_on_disk(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    checkpoints = CheckpointService(
        CheckpointSettings(
            **{**settings.model_dump(), "checkpoint_root": tmp_path, "checkpoint_keep": 2},
            _env_file=None,
        ),
        store,
    )
    directories = []
    for step in range(4):
        cause = await request(store, world=1) if step == 0 else await ask(store)
        directory = checkpoint_dir(tmp_path, JOB, checkpoint_id_for(1, cause.event_id))
        write_shard(directory, 0, b"state %d" % step, step=step)
        assert isinstance(await checkpoints.collect(JOB, 1, cause, wait_s=10), CheckpointCommitted)
        directories.append(directory)
    assert [d.exists() for d in directories] == [False, False, True, True]


async def test_an_ended_jobs_checkpoints_go_after_the_retention_and_usage_is_per_team(
    settings: Settings, store: EventStore, tmp_path: Path
) -> None:
    checkpoints = service(settings, store, tmp_path)
    spec = JobSpec(name="t", team="nlp")
    await store.append(
        "job-ended", None, [JobSubmitted(job_id="ended", spec=spec, submitted_by="t")]
    )
    [done] = await store.append("job-ended", None, [JobSucceeded(job_id="ended", attempt=1)])
    await store.append(
        "job-live",
        None,
        [JobSubmitted(job_id="live", spec=JobSpec(name="t", team="cv"), submitted_by="t")],
    )
    write_shard(checkpoint_dir(tmp_path, "ended", "a1-x"), 0, b"old state")
    write_shard(checkpoint_dir(tmp_path, "live", "a1-y"), 0, b"12345")

    retention = timedelta(seconds=checkpoints.settings.checkpoint_retention_s)
    assert await checkpoints.sweep(done.recorded_at + retention / 2) == []
    assert await checkpoints.sweep(done.recorded_at + retention) == ["ended"]
    assert not (tmp_path / "ended").exists() and (tmp_path / "live").exists()
    usage = checkpoints.registry.get_sample_value("gangway_checkpoint_bytes", {"team": "cv"})
    assert usage is not None and usage > 5
