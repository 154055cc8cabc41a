"""Step times the ranks report through their step file."""

from __future__ import annotations

import os
from pathlib import Path

from services.agent.steps import parse_steps, read_new_steps


def test_complete_lines_become_samples_and_a_partial_line_waits() -> None:
    samples, used = parse_steps(b"0 1.5\n1 1.25\n2 1.")
    assert samples == [(0, 1.5), (1, 1.25)]
    assert used == len(b"0 1.5\n1 1.25\n")


def test_malformed_or_impossible_lines_are_skipped() -> None:
    samples, _ = parse_steps(b"hello\n3 x\n-1 2.0\n4 0\n5 inf\n6 2.5 extra\n7 2.0\n")
    assert samples == [(7, 2.0)]


def test_reading_resumes_where_the_last_read_ended(tmp_path: Path) -> None:
    path = tmp_path / "steps"
    assert read_new_steps(path, 0) == ([], 0)
    path.write_bytes(b"0 1.0\n1 1.1\n2 ")
    first, offset = read_new_steps(path, 0)
    with path.open("ab") as handle:
        handle.write(b"1.2\n")
    second, _ = read_new_steps(path, offset)
    assert first == [(0, 1.0), (1, 1.1)]
    assert second == [(2, 1.2)]


def test_a_step_file_that_is_not_a_regular_file_reads_as_none(tmp_path: Path) -> None:
    # attack5: the rank owns the step file's name. A directory there failed every heartbeat
    # round (the whole fleet fell silent); a FIFO blocked the round for ever; a symlink had
    # the root agent read whatever file it named.
    victim = tmp_path / "victim"
    victim.write_bytes(b"0 1.0\n1 1.0\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo")

    for name in ("dir", "link", "fifo"):
        assert read_new_steps(tmp_path / name, 0) == ([], 0)


def test_a_flood_of_steps_is_read_as_its_newest_few(tmp_path: Path) -> None:
    # attack9: one rank appending a MiB of `0 1` lines twice a second had each heartbeat round
    # parse, sign and send 262,144 samples per rank: the fleet's heartbeats, sent by the same
    # rounds, fell silent, and health and inventory lagged behind the telemetry topic.
    path = tmp_path / "steps"
    flood = b"".join(b"%d 1.0\n" % step for step in range(300_000))
    path.write_bytes(flood + b"300000 2.")
    samples, offset = read_new_steps(path, 0)
    assert 0 < len(samples) <= 64  # a round's worth, not the backlog
    assert samples[-1] == (299_999, 1.0)
    assert [step for step, _ in samples] == list(range(300_000 - len(samples), 300_000))
    assert offset == len(flood)  # the backlog is passed over, the partial line waits
    with path.open("ab") as handle:
        handle.write(b"5\n300001 1.5\n")
    assert read_new_steps(path, offset) == ([(300_000, 2.5), (300_001, 1.5)], path.stat().st_size)
