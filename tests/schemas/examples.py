"""One valid instance of every event type: the catalogue's living examples."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from schemas.base import Event
from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointRequested,
    CheckpointShard,
)
from schemas.jobs import (
    GangReserved,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobChanges,
    JobDeferred,
    JobFailed,
    JobHeld,
    JobHoldReleased,
    JobRejected,
    JobRequeued,
    JobResumed,
    JobResumeRequested,
    JobSpec,
    JobSubmitted,
    JobSucceeded,
    JobSuspended,
    JobSuspendRequested,
    JobUpdated,
    PreemptionRequested,
    RankPlacement,
    ReservationPlanned,
    TaskExited,
    TaskStarted,
    TopologySpec,
)
from schemas.leadership import LeaderElected
from schemas.nodes import (
    GpuGeometryChanged,
    GpuInfo,
    GpuRecovered,
    GpuUnhealthy,
    MigInstanceSpec,
    NodeDegraded,
    NodeDrained,
    NodeDrainRequested,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUndrained,
    StragglerDetected,
)
from schemas.teams import (
    QueueConfigured,
    TeamCreated,
    TeamKeyDeleted,
    TeamPolicyConfigured,
    TeamSecretDeleted,
    TeamSecretSet,
    TeamTokenIssued,
    TeamTokenRevoked,
)

AT = datetime(2026, 11, 21, 14, 20, tzinfo=UTC)
SHA = "0" * 63 + "1"

SPEC = JobSpec(
    name="llama-70b-pretrain",
    team="nlp",
    priority="production",
    tasks=4,
    gpus_per_task=8,
    topology=TopologySpec(tp_size=8, prefer="rack"),
    command=["torchrun", "train.py"],
    env={"NCCL_DEBUG": "WARN"},
    estimated_runtime_s=3600,
)

EXAMPLES: dict[str, Event] = {
    event.type: event
    for event in (
        JobSubmitted(job_id="j1", spec=SPEC, submitted_by="team:nlp"),
        JobAdmitted(job_id="j1", queue="nlp", priority="production"),
        JobRejected(job_id="j1", code="unknown_team", reason="team 'nlp' does not exist"),
        JobCancelRequested(job_id="j1", by="team:nlp"),
        JobSuspendRequested(job_id="j1", by="admin"),
        JobResumeRequested(job_id="j1", by="admin"),
        JobDeferred(job_id="j1", code="no_capacity", message="needs 32 GPUs; 8 are free"),
        ReservationPlanned(job_id="j1", start_at=AT, nodes=["n0001", "n0002"]),
        GangReserved(
            job_id="j1",
            attempt=1,
            ranks=[
                RankPlacement(rank=r, node_id=f"n000{r}", gpus=list(range(8))) for r in range(4)
            ],
        ),
        TaskStarted(job_id="j1", attempt=1, rank=0, node_id="n0000"),
        TaskExited(job_id="j1", attempt=1, rank=0, node_id="n0000", exit_code=0),
        PreemptionRequested(
            job_id="j1", attempt=1, preemptor_job_id="j2", reason="priority", grace_s=120
        ),
        JobRequeued(job_id="j1", attempt=1, code="preempted", reason="preempted by j2"),
        JobSuspended(job_id="j1", attempt=1),
        JobResumed(job_id="j1"),
        JobSucceeded(job_id="j1", attempt=1),
        JobFailed(job_id="j1", attempt=2, reason="rank 3 exited with 1 after 3 retries"),
        JobCancelled(job_id="j1", attempt=1, reason="cancelled by team:nlp"),
        JobHeld(job_id="j1", by="team:nlp"),
        JobHoldReleased(job_id="j1", by="team:nlp"),
        JobUpdated(
            job_id="j1",
            by="team:nlp",
            changes=JobChanges(priority="research", max_runtime_s=7200, max_retries=1),
        ),
        NodeRegistered(
            node_id="n0000",
            hostname="gpu-n0000",
            gpu_type="H100",
            gpus=[
                GpuInfo(index=i, uuid=f"GPU-{i}", model="H100", memory_mb=81559) for i in range(8)
            ],
            rack="r000",
            block="b00",
            discovered_by="spec",
        ),
        NodeLost(node_id="n0000", reason="no heartbeat for 30s", last_heartbeat_at=AT),
        NodeRecovered(node_id="n0000"),
        NodeDegraded(node_id="n0000", signal="ecc", detail="2 uncorrected ECC errors", gpu_index=3),
        NodeDrainRequested(node_id="n0000", reason="ECC errors", by="health"),
        NodeDrained(node_id="n0000"),
        NodeUndrained(node_id="n0000", by="admin"),
        GpuUnhealthy(node_id="n0000", gpu_index=3, reason="XID 79"),
        GpuRecovered(node_id="n0000", gpu_index=3),
        GpuGeometryChanged(
            node_id="n0000",
            gpu_index=3,
            geometry=[
                MigInstanceSpec(profile="3g.40gb", start=4),
                MigInstanceSpec(profile="2g.20gb", start=0),
            ],
            previous=[],
            reconfigure_s=60.0,
            reason="fits waiting slices: 3g.40gb, 2g.20gb",
        ),
        StragglerDetected(
            node_id="n0000", job_id="j1", rank=2, step_time_s=1.9, median_step_time_s=1.0
        ),
        TeamCreated(name="nlp", guaranteed_gpus=64, max_gpus=128, token_sha256=SHA),
        QueueConfigured(name="research", guaranteed_gpus=256, max_gpus=None),
        TeamPolicyConfigured(
            team="nlp",
            allowed_priority_classes=["production", "research"],
            non_preemptible_allowed=False,
            max_pending_jobs=100,
            submissions_per_second=5.0,
        ),
        TeamTokenIssued(team="nlp", token_id=SHA[:16], name="ci-robot", token_sha256=SHA),
        TeamTokenRevoked(team="nlp", token_id=SHA[:16]),
        TeamSecretSet(
            team="nlp",
            name="hf",
            key_id=UUID("00000000-0000-0000-0000-000000000001"),
            ciphertext="bm9uY2UtYW5kLXNlYWxlZC12YWx1ZQ==",
        ),
        TeamSecretDeleted(team="nlp", name="hf"),
        TeamKeyDeleted(team="nlp", key_id=UUID("00000000-0000-0000-0000-000000000001")),
        CheckpointRequested(job_id="j1", attempt=1, reason="preemption"),
        CheckpointCommitted(
            job_id="j1",
            attempt=1,
            checkpoint_id="ck-1",
            step=1200,
            shards=[CheckpointShard(rank=0, uri="file:///ckpt/j1/1200/0", bytes=1024, sha256=SHA)],
        ),
        CheckpointCorrupted(job_id="j1", checkpoint_id="ck-1", reason="shard 0 sha256 mismatch"),
        CheckpointFailed(
            job_id="j1", attempt=1, checkpoint_id="ck-2", reason="rank 1: no shard within 60 s"
        ),
        LeaderElected(epoch=3, leader_id="scheduler-a"),
    )
}
