"""A rank's output on the agent's own disk: listed, read and retired here, served over HTTP by
services/agent/log_server.py (the API never reads a node's disk).

An agent starts each rank in `<work_dir>/<job>/a<attempt>/rank-<rank>/` with its stdout and
stderr in `rank.log` (services/agent/ranks.py). Everything here is a plain function of that
directory and ids already checked by the route, so that no path from a request ever leaves the
root; a rank writes in these very directories, so nothing it plants (a symlink, a FIFO) is
followed or blocks the reader.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from services.runtime.untrusted import open_regular

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
        return open_regular(source.path)
    except (OSError, ValueError):
        return None


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


def ended_at(root: Path, job_id: str, attempt: int) -> float | None:
    """When the attempt last wrote anything (its newest rank log or rank directory), as a
    timestamp; None when it left no directory. A rank writes its log up to its exit, so for an
    attempt that is over this is when it ended, near enough for retention."""
    attempt_dir = job_dir(root, job_id) / f"a{attempt}"
    try:
        newest = os.lstat(attempt_dir).st_mtime
    except OSError:
        return None
    for rank in ranks(root, job_id, attempt):
        for path in (attempt_dir / f"rank-{rank}", attempt_dir / f"rank-{rank}" / LOG_FILE):
            try:
                newest = max(newest, os.lstat(path).st_mtime)
            except OSError:
                continue
    return newest


def retire(
    root: Path, now: float, keep_s: float, running: Callable[[str, int], bool]
) -> list[tuple[str, int]]:
    """Delete the working directories (and so the logs) of attempts that ended more than
    `keep_s` ago; a job directory left empty goes too. Returns the (job, attempt)s deleted."""
    gone: list[tuple[str, int]] = []
    try:
        jobs = os.listdir(root)
    except OSError:
        return gone
    for job_id in jobs:
        if not stat.S_ISDIR(os.lstat(root / job_id).st_mode):
            continue
        for attempt in attempts(root, job_id):
            if running(job_id, attempt):
                continue
            ended = ended_at(root, job_id, attempt)
            if ended is None or now - ended < keep_s:
                continue
            # rmtree never follows a symlink a rank left: it unlinks the link itself.
            shutil.rmtree(job_dir(root, job_id) / f"a{attempt}", ignore_errors=True)
            gone.append((job_id, attempt))
        with contextlib.suppress(OSError):
            os.rmdir(job_dir(root, job_id))  # only when nothing is left in it
    return gone
