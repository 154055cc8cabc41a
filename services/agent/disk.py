"""A rank's disk, bounded: what it writes in its working directory (its `rank.log` included).

A rank could fill the node's filesystem (found by the hostile-tenant run, 2026-11-23): its
output and its files grew without bound, and on a `make up` installation that filesystem also
holds PostgreSQL's data and Kafka's log, so one tenant printing without end stopped every
tenant's appends. Two mechanisms, neither needing a filesystem quota:

- the agent measures each running rank's working directory every `disk_check_s` (blocks
  allocated, not apparent sizes, so a sparse file counts what it really holds; files and
  directories counted too, since inodes run out as well) and stops a rank over its limit with a
  typed reason (`DISK_LIMIT_REASON`), recorded in its TaskExited as permanent: the job fails
  at once, since a next attempt would write as much again;
- a file the rank deleted but holds open keeps its blocks where no walk sees them: the files
  its processes hold open with no name left, on the working directory's filesystem, count
  towards its limit too (`held_deleted`);
- the rank starts with `RLIMIT_FSIZE` at the same limit, so that no single file (its
  `rank.log` first of all) outgrows it between two measurements: a write past it fails and the
  rank dies of SIGXFSZ, which the agent reads as the same reason.

The limit is the job's `disk_mb_per_task`, else the agent's default `rank_disk_mb`, and never
more than the operator's cap `rank_disk_max_mb`.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from schemas.jobs import JobSpec

MIB = 1024 * 1024
DISK_LIMIT_REASON = "disk limit exceeded"
# Died of SIGXFSZ: directly, or as reported by a shell or sandbox around the process.
SIGXFSZ_EXIT_CODES = frozenset({-int(signal.SIGXFSZ), 128 + int(signal.SIGXFSZ)})


@dataclass(frozen=True, slots=True)
class DiskLimit:
    """What one rank may hold in its working directory."""

    bytes: int
    entries: int

    @property
    def mb(self) -> int:
        return self.bytes // MIB


def disk_limit(spec: JobSpec, default_mb: int, cap_mb: int, entries: int) -> DiskLimit:
    """The rank's limit: the job's `disk_mb_per_task`, else `default_mb`; at most `cap_mb`."""
    asked = spec.disk_mb_per_task if spec.disk_mb_per_task is not None else default_mb
    return DiskLimit(min(asked, cap_mb) * MIB, entries)


@dataclass(frozen=True, slots=True)
class DiskUse:
    bytes: int
    entries: int
    # A directory the walk could not read (nested past the longest path the kernel takes, or
    # made unreadable): what is under it is unknown, so it is no use to the rank's bound.
    unreadable: str | None = None

    def over(self, limit: DiskLimit) -> bool:
        return (
            self.bytes > limit.bytes or self.entries > limit.entries or self.unreadable is not None
        )


def disk_use(root: Path, limit: DiskLimit | None = None) -> DiskUse:
    """The blocks allocated under `root` (bytes) and the files and directories there. Links
    are counted, never followed; a directory that vanishes meanwhile is passed over, one that
    cannot be read ends the walk as `unreadable`. With `limit`, the walk stops once past it:
    a rank that made a million files costs the agent no more than its limit's worth of them."""
    used = 0
    entries = 0
    pending = [str(root)]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    except OSError as error:
                        return DiskUse(used, entries, error.strerror or type(error).__name__)
                    used += info.st_blocks * 512
                    entries += 1
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(entry.path)
                    if limit is not None and (used > limit.bytes or entries > limit.entries):
                        return DiskUse(used, entries)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed or replaced meanwhile: the next round counts what is there
        except OSError as error:
            # Files under a directory the agent cannot list would escape the bound (a rank
            # nesting directories past PATH_MAX, then writing there): it counts as past it.
            return DiskUse(used, entries, error.strerror or type(error).__name__)
    return DiskUse(used, entries)


def processes_of(leaders: Collection[int]) -> dict[int, set[int]]:
    """Per rank's leader pid, the processes that are the rank's: its process group's members
    and its descendants (under bubblewrap the job runs in a session of its own below the
    leader), from one scan of /proc."""
    parents: dict[int, list[int]] = {}
    groups: dict[int, set[int]] = {leader: set() for leader in leaders}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(entry.name)
        parents.setdefault(int(fields[1]), []).append(pid)
        if int(fields[2]) in groups:
            groups[int(fields[2])].add(pid)
    for leader, members in groups.items():
        members.add(leader)
        pending = [leader]
        while pending:
            for child in parents.get(pending.pop(), ()):
                if child not in members:
                    members.add(child)
                    pending.append(child)
    return groups


def held_deleted(pids: Iterable[int], devices: Collection[int], most: int) -> int | None:
    """The blocks (bytes) of the regular files on `devices` that `pids` hold open with no name
    left: deleted, they are in no directory a walk reads, yet hold their blocks until closed.
    Each file counted once. Files in memory (/dev/shm, a private /tmp, memfd) are on other
    devices: charged to the rank's memory, not its disk. A process the agent may not inspect
    is passed over. None: the processes hold more than `most` descriptors together (the
    limit's count of entries), past which the agent stops looking, as the walk does: a rank
    could otherwise make each round stat millions of copies of one descriptor, or hide a
    deleted file behind them, so it counts as past its limit."""
    seen: set[tuple[int, int]] = set()
    held = 0
    looked = 0
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        looked += len(descriptors)
        if looked > most:
            return None
        for fd in descriptors:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if info.st_nlink or not stat.S_ISREG(info.st_mode) or info.st_dev not in devices:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                held += info.st_blocks * 512
    return held


def over_limit_reason(use: DiskUse, limit: DiskLimit, where: str = "its working directory") -> str:
    """The TaskExited reason of a rank stopped for its disk, for a person."""
    if use.unreadable is not None:
        return (
            f"{DISK_LIMIT_REASON}: {where} could not be measured "
            f"({use.unreadable}: nested too deep, or unreadable)"
        )
    if use.entries > limit.entries:
        return f"{DISK_LIMIT_REASON}: {where} held more than {limit.entries} files and directories"
    # The walk stopped once past the limit: how far past it is not known.
    return f"{DISK_LIMIT_REASON}: {where} held more than its {limit.mb} MB (disk_mb_per_task)"


def file_size_reason(limit: DiskLimit) -> str:
    """The reason of a rank that died of SIGXFSZ: a file of it reached the limit."""
    return (
        f"{DISK_LIMIT_REASON}: a file it wrote (its output included) reached its "
        f"{limit.mb} MB (disk_mb_per_task)"
    )


def limit_file_size(limit: DiskLimit) -> None:
    """In the rank's child process, before exec: no file it writes may outgrow the limit
    (async-signal-safe: one system call)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit.bytes, limit.bytes))
