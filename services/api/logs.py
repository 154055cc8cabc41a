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
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
    root: Path


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
    return RankLog(job_id, attempt, rank, path, root)


def open_log(source: RankLog) -> BinaryIO | None:
    """The rank's log for reading, or None when there is none. A rank writes in these very
    directories: only a regular file reached from the root without any symlink is read, so
    that a symlink a job leaves (to the control plane's files, another team's output) is
    never followed, and a FIFO it leaves never blocks the reader."""
    try:
        inside = Path(os.path.realpath(source.root)) / source.path.relative_to(source.root)
        if Path(os.path.realpath(source.path)) != inside:
            return None
        fd = os.open(source.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def exists(source: RankLog) -> bool:
    handle = open_log(source)
    if handle is None:
        return False
    handle.close()
    return True


def read_from(source: RankLog, offset: int, limit: int = 1 << 20) -> bytes:
    """Up to `limit` bytes of the log from `offset`; empty when it does not exist (yet)."""
    handle = open_log(source)
    if handle is None:
        return b""
    with handle:
        handle.seek(offset)
        return handle.read(limit)


def tail_offset(source: RankLog, lines: int) -> int:
    """The offset where the last `lines` lines of the log begin (a last line without its
    newline counts as a line)."""
    handle = open_log(source)
    if handle is None:
        return 0
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if lines <= 0:
            return size
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
