"""Where the API finds a rank's output: the agents' working directories.

An agent starts each rank in `<work_dir>/<job>/a<attempt>/rank-<rank>/` with its stdout and
stderr in `rank.log` (services/agent/ranks.py). On one machine (`make up`, the tests) the API
reads that directory itself: `GANGWAY_LOGS_DIR` names it (default `.gangway/agent`, the agents'
default `GANGWAY_WORK_DIR`). A deployment over several hosts must make every node's work
directory visible at that path on the API's host (a shared filesystem, or a log shipper writing
the same layout); docs/logs.md says so. Everything here is a plain function of a directory and
ids already checked by the route, so that no path from a request ever leaves the root.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

LOG_FILE = "rank.log"
_ATTEMPT = re.compile(r"^a(\d+)$")
_RANK = re.compile(r"^rank-(\d+)$")
# Reading backwards for --tail: this much at a time.
_BLOCK = 64 * 1024


@dataclass(frozen=True, slots=True)
class RankLog:
    job_id: str
    attempt: int
    rank: int
    path: Path


def job_dir(root: Path, job_id: str) -> Path:
    return root / job_id


def attempts(root: Path, job_id: str) -> list[int]:
    """The attempts that left a directory, oldest first."""
    try:
        names = os.listdir(job_dir(root, job_id))
    except OSError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _ATTEMPT.match(name)))


def ranks(root: Path, job_id: str, attempt: int) -> list[int]:
    try:
        names = os.listdir(job_dir(root, job_id) / f"a{attempt}")
    except OSError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _RANK.match(name)))


def rank_log(root: Path, job_id: str, attempt: int, rank: int) -> RankLog:
    path = job_dir(root, job_id) / f"a{attempt}" / f"rank-{rank}" / LOG_FILE
    return RankLog(job_id, attempt, rank, path)


def read_from(path: Path, offset: int, limit: int = 1 << 20) -> bytes:
    """Up to `limit` bytes of `path` from `offset`; empty when it does not exist (yet)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(limit)
    except FileNotFoundError:
        return b""


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def tail_offset(path: Path, lines: int) -> int:
    """The offset where the last `lines` lines of `path` begin (a last line without its
    newline counts as a line)."""
    size = size_of(path)
    if lines <= 0:
        return size
    with path.open("rb") as handle:
        end = size
        # A trailing newline ends the last line; it does not start another.
        handle.seek(max(0, size - 1))
        if size and handle.read(1) == b"\n":
            end -= 1
        seen = 0
        position = end
        while position > 0:
            start = max(0, position - _BLOCK)
            handle.seek(start)
            block = handle.read(position - start)
            index = len(block)
            while True:
                index = block.rfind(b"\n", 0, index)
                if index < 0:
                    break
                seen += 1
                if seen == lines:
                    return start + index + 1
            position = start
    return 0
