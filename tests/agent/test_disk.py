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


def test_a_directory_nested_past_the_longest_path_counts_as_past_the_limit(
    tmp_path: Path,
) -> None:
    """A rank could nest directories past PATH_MAX (4,096 bytes) and write there: a walk by
    path cannot list them, and what they held escaped the bound. It now counts as past it."""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(20):  # 20 levels of 250 characters: 5,000 bytes of path
            os.mkdir("d" * 250, dir_fd=fd)
            inner = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("hidden", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as out:
            out.write(os.urandom(MIB))
    finally:
        os.close(fd)
    limit = DiskLimit(100 * MIB, 1000)
    use = disk_use(tmp_path, limit)
    assert use.over(limit)
    assert "could not be measured" in over_limit_reason(use, limit)
    assert not disk_use(tmp_path / "absent", limit).over(limit)
