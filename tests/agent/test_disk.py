"""What a rank's working directory holds and may hold (services/agent/disk.py)."""

from __future__ import annotations

import os
from pathlib import Path

from schemas.jobs import JobSpec
from services.agent.disk import MIB, DiskLimit, disk_limit, disk_use, over_limit_reason


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "team": "ml", **fields})


def test_the_limit_is_the_jobs_else_the_default_never_past_the_operators_cap() -> None:
    assert disk_limit(spec(), 100, 1000, 50).bytes == 100 * MIB
    assert disk_limit(spec(disk_mb_per_task=500), 100, 1000, 50).bytes == 500 * MIB
    assert disk_limit(spec(disk_mb_per_task=5000), 100, 1000, 50).bytes == 1000 * MIB
    assert disk_limit(spec(), 100, 1000, 50).entries == 50


def test_use_counts_blocks_held_not_apparent_sizes_and_follows_no_link(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(os.urandom(MIB))
    with (tmp_path / "sparse").open("wb") as sparse:
        sparse.truncate(1024 * MIB)  # a gigabyte that holds nothing
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more").write_bytes(os.urandom(MIB))
    (tmp_path / "root").symlink_to("/")  # a link out of the directory is not walked
    use = disk_use(tmp_path)
    assert 2 * MIB <= use.bytes < 3 * MIB
    assert use.entries == 5


def test_a_walk_stops_once_past_the_limit(tmp_path: Path) -> None:
    for index in range(50):
        (tmp_path / f"f{index}").touch()
    limit = DiskLimit(MIB, 10)
    use = disk_use(tmp_path, limit)
    assert use.over(limit)
    assert use.entries == 11  # not all 50: a million files cost no more than the limit
    assert "more than 10 files" in over_limit_reason(use, limit)
    assert not disk_use(tmp_path).over(DiskLimit(MIB, 50))


def test_a_missing_directory_holds_nothing(tmp_path: Path) -> None:
    assert disk_use(tmp_path / "gone").bytes == 0
