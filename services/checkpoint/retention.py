"""Which checkpoints to delete: all but the newest K committed (and still good) ones of a job,
every failed or corrupted one, and everything of a job some time after it ended.

Pure over the job's checkpoint events; the service does the deleting.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.base import Event
from schemas.checkpoints import CheckpointCommitted, CheckpointCorrupted, CheckpointFailed


def checkpoints_to_prune(events: Iterable[Event], keep: int) -> list[str]:
    """The checkpoint ids of the job whose storage may go, oldest first. Only judged
    checkpoints are named: one still being gathered is never pruned under its writers."""
    committed: list[str] = []
    bad: list[str] = []
    for event in events:
        if isinstance(event, CheckpointCommitted):
            committed.append(event.checkpoint_id)
        elif isinstance(event, CheckpointCorrupted | CheckpointFailed):
            bad.append(event.checkpoint_id)
    good = [c for c in committed if c not in bad]
    kept = set(good[-keep:]) if keep > 0 else set()
    seen: set[str] = set()
    prune: list[str] = []
    for checkpoint_id in [*committed, *bad]:
        if checkpoint_id not in kept and checkpoint_id not in seen:
            seen.add(checkpoint_id)
            prune.append(checkpoint_id)
    return prune
