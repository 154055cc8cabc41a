"""Retention: the newest K good checkpoints of a job stay; the rest may go."""

from __future__ import annotations

from schemas.base import Event
from schemas.checkpoints import (
    CheckpointCommitted,
    CheckpointCorrupted,
    CheckpointFailed,
    CheckpointShard,
)
from services.checkpoint.retention import checkpoints_to_prune

SHARD = CheckpointShard(rank=0, uri="file:///c", bytes=1, sha256="0" * 64)


def commit(checkpoint_id: str) -> CheckpointCommitted:
    return CheckpointCommitted(
        job_id="j1", attempt=1, checkpoint_id=checkpoint_id, step=1, shards=[SHARD]
    )


def test_only_the_newest_good_checkpoints_are_kept() -> None:
    events: list[Event] = [
        commit("c1"),
        commit("c2"),
        CheckpointFailed(job_id="j1", attempt=1, checkpoint_id="c3", reason="timed out"),
        commit("c4"),
        CheckpointCorrupted(job_id="j1", checkpoint_id="c4", reason="sha256"),
        commit("c5"),
    ]
    assert checkpoints_to_prune(events, keep=2) == ["c1", "c4", "c3"]


def test_nothing_is_pruned_while_fewer_than_k_exist() -> None:
    assert checkpoints_to_prune([commit("c1")], keep=3) == []
