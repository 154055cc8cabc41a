"""Checkpoint storage on a directory: atomic shards, per-shard records, a manifest per checkpoint.

Layout under the root: `<job>/<checkpoint_id>/rank-<r>.bin` (the shard), `rank-<r>.json` (its
size, sha256 and step, written after the shard by whoever wrote it) and `manifest.json`
(written by the checkpoint service once every shard verified). Every file lands by
tmp + fsync + rename + fsync of the directory, so a reader sees a whole file or none.
Works on a node-local disk for one host and on shared storage (NFS, Lustre) for many.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from uuid import UUID

from schemas.checkpoints import CheckpointShard
from services.runtime.untrusted import open_directory_below, open_regular, open_regular_in

MANIFEST = "manifest.json"
# The checkpoint request a rank that checkpoints itself reads, in its working directory.
REQUEST = "checkpoint-request.json"
_CHECKPOINT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# What is read of a shard's record or a failure record (each a few hundred bytes when the
# agent writes it; a rank may leave anything there).
RECORD_LIMIT = 64 * 1024
FAILURE_LIMIT = 2000


def checkpoint_id_for(attempt: int, cause: UUID) -> str:
    """The id of the checkpoint one request (CheckpointRequested / PreemptionRequested) asks
    for: derived from the request, so agents and the service agree without talking."""
    return f"a{attempt}-{cause.hex[:16]}"


def checkpoint_dir(root: Path, job_id: str, checkpoint_id: str) -> Path:
    if not _CHECKPOINT_ID.match(job_id) or not _CHECKPOINT_ID.match(checkpoint_id):
        raise ValueError(f"unsafe checkpoint path component: {job_id!r}/{checkpoint_id!r}")
    return root / job_id / checkpoint_id


def shard_path(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.bin"


def record_path(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.json"


def write_atomic(path: Path, data: bytes, *, under: Path | None = None) -> None:
    """Write `data` to `path` so that a crash leaves the old file or the new one, never half.

    Ranks write in these directories and the agent writing here may be root: the temporary
    file is made new under a name no one can guess (never a file or symlink planted there),
    and the rename replaces whatever is at `path` (a symlink itself, not its target).
    `under`: a directory the writer trusts, which `path` lies in; the directories between are
    entered (made if missing) without following a symlink, since a rank owns them and could
    point one at any directory for root to write in (OSError then)."""
    if under is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    else:
        directory = open_directory_below(under, path.parent, make=True)
    try:
        tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(tmp, flags, 0o644, dir_fd=directory)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=directory)
            raise
        os.fsync(directory)
    finally:
        os.close(directory)


def sha256_of(path: Path) -> tuple[int, str]:
    """(size, sha256) of the file, read in chunks (shards can be gigabytes)."""
    # Only a regular file is read: a rank may leave a symlink (to any file root can read) or
    # a FIFO (a read that never ends) where its shard should be.
    with open_regular(path) as handle:
        return _digest(handle)


def _digest(handle: BinaryIO) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def sha256_in(directory: Path, name: str) -> tuple[int, str]:
    """`sha256_of` the regular file `name` in `directory`, neither reached through a symlink
    (a rank may replace its checkpoint directory by one between two looks)."""
    with open_regular_in(directory, name) as handle:
        return _digest(handle)


def read_small(directory: Path, name: str, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `name` in `directory`, neither of them
    reached through a symlink: FileNotFoundError when it is missing, OSError for anything
    but a regular file in a real directory.

    A rank owns its job's checkpoint directories: it may leave a symlink (to the admin's
    token, the services' settings, another team's files) where a record should be, or put
    one in place of a checkpoint directory, and the checkpoint service, reading as root,
    would follow it and copy what it read into the log (a failure's reason); a FIFO or
    /dev/zero would hang it or fill its memory."""
    with open_regular_in(directory, name) as handle:
        return handle.read(limit)


def is_regular(directory: Path, name: str) -> bool:
    """Whether `name` in `directory` is a regular file, neither reached through a symlink."""
    try:
        directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(directory_fd)


@dataclass(frozen=True, slots=True)
class ShardRecord:
    rank: int
    size: int
    sha256: str
    step: int

    def to_json(self) -> bytes:
        return json.dumps(
            {"rank": self.rank, "bytes": self.size, "sha256": self.sha256, "step": self.step}
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ShardRecord:
        data: Any = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("shard record is not a JSON object")
        record = cls(
            rank=int(data["rank"]),
            size=int(data["bytes"]),
            sha256=str(data["sha256"]),
            step=int(data.get("step", 0)),
        )
        if not re.fullmatch(r"[0-9a-f]{64}", record.sha256) or record.size < 0:
            raise ValueError("shard record has a bad digest or size")
        return record


def write_shard(
    directory: Path, rank: int, data: bytes, *, step: int = 0, under: Path | None = None
) -> ShardRecord:
    """Store one rank's shard and then its record (the record's presence means 'done');
    `under` as for `write_atomic`."""
    write_atomic(shard_path(directory, rank), data, under=under)
    record = ShardRecord(rank, len(data), hashlib.sha256(data).hexdigest(), step)
    write_atomic(record_path(directory, rank), record.to_json(), under=under)
    return record


def write_request(workdir: Path, directory: Path, rank: int, *, under: Path | None = None) -> Path:
    """Ask a rank that checkpoints itself where to write its shard: the JSON file its
    GANGWAY_CHECKPOINT_REQUEST names, in its working directory (written as every file here
    is, so that nothing the rank planted at that name is followed; `under` as for
    `write_atomic`)."""
    request = {"dir": str(directory), "shard": str(shard_path(directory, rank)), "rank": rank}
    path = workdir / REQUEST
    write_atomic(path, json.dumps(request).encode(), under=under)
    return path


def record_shard(
    directory: Path, rank: int, *, step: int = 0, under: Path | None = None
) -> ShardRecord:
    """Write the record of a shard a rank wrote itself (the agent does this for its ranks);
    `under` as for `write_atomic`."""
    size, digest = sha256_of(shard_path(directory, rank))
    record = ShardRecord(rank, size, digest, step)
    write_atomic(record_path(directory, rank), record.to_json(), under=under)
    return record


def failure_path(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.failed"


def record_failure(directory: Path, rank: int, reason: str, *, under: Path | None = None) -> None:
    """Say that this rank's shard will not come, and why (the service stops waiting for it);
    `under` as for `write_atomic`."""
    write_atomic(failure_path(directory, rank), reason.encode()[:FAILURE_LIMIT], under=under)


def failed_ranks(directory: Path, world_size: int) -> dict[int, str]:
    """The ranks whose writer gave up on their shard, with the reason it gave."""
    failed: dict[int, str] = {}
    for rank in range(world_size):
        name = failure_path(directory, rank).name
        try:
            raw = read_small(directory, name, FAILURE_LIMIT)
        except FileNotFoundError:
            continue
        except OSError:
            # Something a rank left there: its shard will not come, and nothing is followed.
            failed[rank] = "its failure record is not a regular file"
            continue
        failed[rank] = raw.decode(errors="replace").strip()
    return failed


def reported_ranks(directory: Path, world_size: int) -> set[int]:
    """The ranks whose record is present: those whose writer says their shard is done."""
    return {r for r in range(world_size) if is_regular(directory, record_path(directory, r).name)}


@dataclass(frozen=True, slots=True)
class Verification:
    shards: list[CheckpointShard]
    step: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.shards)


def verify(directory: Path, world_size: int) -> Verification:
    """Check every rank's shard against its record: present, same size, same sha256."""
    shards: list[CheckpointShard] = []
    problems: list[str] = []
    steps: set[int] = set()
    for rank in range(world_size):
        try:
            raw = read_small(directory, record_path(directory, rank).name, RECORD_LIMIT)
            record = ShardRecord.from_json(raw)
        except FileNotFoundError:
            problems.append(f"rank {rank}: shard never reported")
            continue
        except OSError as error:
            problems.append(f"rank {rank}: shard record unreadable ({error.strerror or error})")
            continue
        except (ValueError, KeyError, TypeError) as error:
            problems.append(f"rank {rank}: unreadable shard record ({error})")
            continue
        path = shard_path(directory, rank)
        try:
            size, digest = sha256_in(directory, path.name)
        except FileNotFoundError:
            problems.append(f"rank {rank}: shard file missing")
            continue
        except OSError as error:
            problems.append(f"rank {rank}: shard unreadable ({error.strerror or error})")
            continue
        if size != record.size:
            problems.append(f"rank {rank}: {size} bytes on disk, {record.size} written")
        elif digest != record.sha256:
            problems.append(f"rank {rank}: sha256 mismatch")
        else:
            steps.add(record.step)
            shards.append(
                CheckpointShard(rank=rank, uri=path.resolve().as_uri(), bytes=size, sha256=digest)
            )
    if len(steps) > 1:
        problems.append(f"ranks saved different steps: {sorted(steps)}")
    return Verification(shards=shards, step=min(steps, default=0), problems=problems)


def verify_committed(directory: Path, shards: list[CheckpointShard]) -> list[str]:
    """Check a committed checkpoint where it is used: every shard still holds the size and
    sha256 recorded in its CheckpointCommitted. Returns the problems (none: usable)."""
    problems: list[str] = []
    for shard in shards:
        try:
            size, digest = sha256_in(directory, shard_path(directory, shard.rank).name)
        except OSError as error:
            problems.append(f"rank {shard.rank}: shard unreadable ({error.strerror or error})")
            continue
        if size != shard.bytes:
            problems.append(f"rank {shard.rank}: {size} bytes on disk, {shard.bytes} committed")
        elif digest != shard.sha256:
            problems.append(f"rank {shard.rank}: sha256 differs from the committed one")
    return problems


def write_manifest(
    directory: Path, *, job_id: str, attempt: int, checkpoint_id: str, verification: Verification
) -> None:
    manifest = {
        "job_id": job_id,
        "attempt": attempt,
        "checkpoint_id": checkpoint_id,
        "step": verification.step,
        "shards": [shard.model_dump() for shard in verification.shards],
    }
    # Below the job's directory, which no rank can replace: the checkpoint directory itself
    # is the rank's, and a symlink put there would have root write the manifest anywhere.
    write_atomic(
        directory / MANIFEST, json.dumps(manifest, indent=2).encode(), under=directory.parent
    )


def has_manifest(directory: Path) -> bool:
    return (directory / MANIFEST).is_file()
