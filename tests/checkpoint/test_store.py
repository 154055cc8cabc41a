"""Checkpoint storage with real files: atomic shards, verification against their records."""

from __future__ import annotations

import json
import os
from pathlib import Path
from uuid import UUID

import pytest

from schemas.checkpoints import CheckpointCommitted, CheckpointCorrupted
from services.checkpoint.service import _bytes_under, outcome
from services.runtime.checkpoint_store import (
    MANIFEST,
    checkpoint_dir,
    checkpoint_id_for,
    failed_ranks,
    record_failure,
    record_shard,
    reported_ranks,
    shard_path,
    verify,
    verify_committed,
    write_manifest,
    write_request,
    write_shard,
)

CAUSE = UUID("12345678-1234-5678-1234-567812345678")


def saved(tmp_path: Path, world: int = 3, step: int = 7) -> Path:
    directory = checkpoint_dir(tmp_path, "job1", checkpoint_id_for(2, CAUSE))
    for rank in range(world):
        write_shard(directory, rank, f"weights of rank {rank}".encode() * 100, step=step)
    return directory


def test_every_shard_intact_verifies_with_sizes_and_digests(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    result = verify(directory, 3)
    assert result.ok
    assert [s.rank for s in result.shards] == [0, 1, 2]
    assert result.shards[1].bytes == len(b"weights of rank 1" * 100)
    assert result.step == 7


def test_a_flipped_byte_in_a_shard_is_a_digest_mismatch(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    data = bytearray(shard_path(directory, 1).read_bytes())
    data[10] ^= 0xFF
    shard_path(directory, 1).write_bytes(bytes(data))
    result = verify(directory, 3)
    assert not result.ok
    assert result.problems == ["rank 1: sha256 mismatch"]


def test_a_truncated_shard_is_a_size_mismatch(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    shard_path(directory, 2).write_bytes(b"short")
    assert verify(directory, 3).problems == ["rank 2: 5 bytes on disk, 1700 written"]


def test_a_rank_that_never_reported_makes_the_checkpoint_incomplete(tmp_path: Path) -> None:
    directory = saved(tmp_path, world=2)
    result = verify(directory, 3)
    assert result.problems == ["rank 2: shard never reported"]
    assert reported_ranks(directory, 3) == {0, 1}


def test_a_shard_file_gone_after_its_record_is_missing(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    shard_path(directory, 0).unlink()
    assert verify(directory, 3).problems == ["rank 0: shard file missing"]


def test_ranks_at_different_steps_do_not_make_one_checkpoint(tmp_path: Path) -> None:
    directory = saved(tmp_path, world=2, step=7)
    write_shard(directory, 1, b"later", step=9)
    assert verify(directory, 2).problems == ["ranks saved different steps: [7, 9]"]


def test_a_shard_written_by_the_rank_is_recorded_by_its_digest(tmp_path: Path) -> None:
    directory = tmp_path / "job" / "ck"
    directory.mkdir(parents=True)
    shard_path(directory, 0).write_bytes(b"the rank's own bytes")
    record = record_shard(directory, 0, step=3)
    assert record.size == len(b"the rank's own bytes")
    assert verify(directory, 1).ok


# A rank writes in these very directories (its checkpoint directory, its working directory),
# and the agent that writes there runs as root: what a rank plants there is never followed.
# attack5: a rank's symlink `checkpoint-request.json -> /any/file` made the agent overwrite
# that file with the request at the next eviction.


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's own bytes")
    return victim


def test_a_write_replaces_a_symlink_planted_at_its_path_never_its_target(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    directory = tmp_path / "job" / "ck"
    directory.mkdir(parents=True)
    for name in ("rank-0.bin", "rank-0.json", "checkpoint-request.json"):
        (directory / name).symlink_to(victim)

    write_shard(directory, 0, b"shard")
    request = write_request(directory, directory, 0)

    assert victim.read_bytes() == b"root's own bytes"
    assert not shard_path(directory, 0).is_symlink()
    assert verify(directory, 1).ok
    assert json.loads(request.read_text())["shard"] == str(shard_path(directory, 0))


def test_a_write_follows_no_symlink_planted_at_a_temporary_name(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    directory = tmp_path / "job" / "ck"
    directory.mkdir(parents=True)
    (directory / f".rank-0.json.{os.getpid()}.tmp").symlink_to(victim)

    write_shard(directory, 0, b"shard")

    assert victim.read_bytes() == b"root's own bytes"
    assert verify(directory, 1).ok


@pytest.mark.parametrize("planted", ["job", "job/ck"])
def test_a_write_below_a_trusted_root_follows_no_directory_a_rank_replaced_by_a_symlink(
    tmp_path: Path, planted: str
) -> None:
    # A rank owns its job's checkpoint directories: it may replace one by a symlink to any
    # directory, where root, writing by the path, made files of fixed names (rank-0.json,
    # rank-0.failed, checkpoint-request.json) in a directory of its choosing.
    root = tmp_path / "checkpoints"
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (root / "job" / "ck").mkdir(parents=True)
    shard_path(root / "job" / "ck", 0).write_bytes(b"the rank's shard")
    (root / planted).rename(tmp_path / "moved")
    (root / planted).symlink_to(elsewhere, target_is_directory=True)
    directory = root / "job" / "ck"

    with pytest.raises(OSError):
        record_shard(directory, 0, step=1, under=root)
    with pytest.raises(OSError):
        record_failure(directory, 0, "gone", under=root)
    with pytest.raises(OSError):
        write_request(directory, directory, 0, under=root)
    with pytest.raises(OSError):
        write_shard(directory, 0, b"x", under=root)

    assert list(elsewhere.iterdir()) == []


def test_a_write_below_a_trusted_root_makes_the_directories_it_lacks(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    directory = checkpoint_dir(root, "job-1", "a1-0123")

    write_shard(directory, 0, b"shard", step=2, under=root)

    assert verify(directory, 1).ok


def test_a_shard_that_is_a_symlink_or_a_fifo_is_not_read(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    directory = tmp_path / "job" / "ck"
    directory.mkdir(parents=True)
    shard_path(directory, 0).symlink_to(victim)
    os.mkfifo(shard_path(directory, 1))  # opened for reading, it would block for ever

    for rank in (0, 1):
        with pytest.raises(OSError):
            record_shard(directory, rank)
    write_shard(directory, 2, b"shard")
    shard_path(directory, 2).unlink()
    shard_path(directory, 2).symlink_to(victim)

    problems = verify(directory, 3).problems
    assert len(problems) == 3 and "rank 2: shard unreadable" in problems[2]


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    names = sorted(p.name for p in directory.iterdir())
    assert names == [f"rank-{r}.{ext}" for r in range(3) for ext in ("bin", "json")]


def test_the_manifest_lists_every_verified_shard(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    write_manifest(
        directory, job_id="job1", attempt=2, checkpoint_id="c", verification=verify(directory, 3)
    )
    manifest = json.loads((directory / MANIFEST).read_text())
    assert [s["rank"] for s in manifest["shards"]] == [0, 1, 2]
    assert manifest["step"] == 7


def test_the_checkpoint_id_follows_from_the_request() -> None:
    assert checkpoint_id_for(2, CAUSE) == checkpoint_id_for(2, CAUSE) == "a2-1234567812345678"


@pytest.mark.parametrize("job_id", ["../etc", "a/b", ""])
def test_a_job_id_cannot_escape_the_checkpoint_root(tmp_path: Path, job_id: str) -> None:
    with pytest.raises(ValueError, match="unsafe"):
        checkpoint_dir(tmp_path, job_id, "c1")


def test_an_intact_checkpoint_is_committed(tmp_path: Path) -> None:
    result = outcome("job1", 2, "c1", verify(saved(tmp_path), 3))
    assert isinstance(result, CheckpointCommitted)
    assert (result.attempt, result.step, len(result.shards)) == (2, 7, 3)


def test_a_damaged_checkpoint_is_recorded_as_corrupted_with_the_reason(tmp_path: Path) -> None:
    directory = saved(tmp_path)
    shard_path(directory, 1).write_bytes(b"x")
    result = outcome("job1", 2, "c1", verify(directory, 3))
    assert isinstance(result, CheckpointCorrupted)
    assert "rank 1" in result.reason


def test_a_failure_record_a_rank_made_a_symlink_is_not_read_into_the_reason(
    tmp_path: Path,
) -> None:
    # Seen live: a team's rank put `rank-0.failed -> .gangway/admin.token` in its checkpoint
    # directory, and the checkpoint service (root) recorded the admin token as the reason of
    # the job's CheckpointFailed, which the team reads through the API.
    secret = tmp_path / "admin.token"
    secret.write_text("the admin token")
    directory = checkpoint_dir(tmp_path / "root", "job1", checkpoint_id_for(2, CAUSE))
    directory.mkdir(parents=True)
    (directory / "rank-0.failed").symlink_to(secret)
    record_failure(directory, 1, "disk full")
    failed = failed_ranks(directory, 2)
    assert failed[1] == "disk full"
    assert "admin token" not in failed[0]


def test_a_failure_record_is_read_only_up_to_its_limit(tmp_path: Path) -> None:
    directory = checkpoint_dir(tmp_path, "job1", checkpoint_id_for(2, CAUSE))
    directory.mkdir(parents=True)
    (directory / "rank-0.failed").write_bytes(b"x" * 10_000_000)
    assert len(failed_ranks(directory, 1)[0]) <= 2000


def test_a_record_a_rank_made_a_symlink_is_not_read(tmp_path: Path) -> None:
    directory = saved(tmp_path, world=2)
    elsewhere = tmp_path / "record"
    elsewhere.write_bytes((directory / "rank-1.json").read_bytes())
    (directory / "rank-1.json").unlink()
    (directory / "rank-1.json").symlink_to(elsewhere)
    assert reported_ranks(directory, 2) == {0}
    result = verify(directory, 2)
    assert not result.ok
    assert any(problem.startswith("rank 1:") for problem in result.problems)


def test_a_checkpoint_directory_a_rank_replaced_by_a_symlink_is_neither_read_nor_written(
    tmp_path: Path,
) -> None:
    # The rank owns its job's checkpoint directory and may rename a checkpoint away and put a
    # symlink in its place (to another team's checkpoint, to any directory): the service,
    # root, would verify the files there and write its manifest into that directory.
    other = saved(tmp_path / "other", world=2)
    directory = checkpoint_dir(tmp_path / "root", "job1", checkpoint_id_for(3, CAUSE))
    directory.parent.mkdir(parents=True)
    directory.symlink_to(other)
    assert reported_ranks(directory, 2) == set()
    result = verify(directory, 2)
    assert not result.ok
    good = verify(other, 2)
    with pytest.raises(OSError):
        write_manifest(
            directory, job_id="job1", attempt=3, checkpoint_id=directory.name, verification=good
        )
    assert not (other / MANIFEST).exists()
    assert verify_committed(directory, good.shards)


def test_a_symlink_a_rank_left_is_not_counted_as_its_teams_storage(tmp_path: Path) -> None:
    directory = saved(tmp_path / "root", world=1)
    own = _bytes_under(directory.parent)
    big = tmp_path / "big"
    with open(big, "wb") as handle:
        handle.truncate(1 << 40)  # sparse: a terabyte that takes no disk
    (directory / "rank-1.bin").symlink_to(big)
    assert _bytes_under(directory.parent) == own
