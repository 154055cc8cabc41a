"""Snapshots of the scheduler's folded state in `scheduler_snapshots`: a cache, never the truth.

A snapshot is the pickled `Folded` (core state, stream versions, the position it covers). It is
only loaded by code of the same `code_version`, a digest of the scheduling core's source, the
event schemas and the policy: state folded by other code could differ from what this code would
fold, and a full replay must always give the state the snapshot gives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import logging
import pickle
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

import core
from core.policy import SchedulingPolicy
from schemas import REGISTRY, EventRegistry
from services.runtime.collector import gc_paused
from services.scheduler.folding import Folded

log = logging.getLogger(__name__)

# Raised whenever the layout of what is pickled changes in a way the digest would not catch.
SNAPSHOT_FORMAT = 2

_SAVE = """
INSERT INTO scheduler_snapshots (position, code_version, state, size_bytes)
VALUES ($1, $2, $3, $4)
"""
_LOAD = """
SELECT position, state FROM scheduler_snapshots
WHERE code_version = $1 AND position <= $2
ORDER BY position DESC LIMIT 1
"""
_PRUNE = """
DELETE FROM scheduler_snapshots WHERE id IN (
    SELECT id FROM scheduler_snapshots
    WHERE code_version = $1 ORDER BY position DESC OFFSET $2
)
"""
# Snapshots of other code are useless to this code; a newer deployment clears them.
_PRUNE_OTHER_VERSIONS = "DELETE FROM scheduler_snapshots WHERE code_version <> $1"


def code_version(policy: SchedulingPolicy, registry: EventRegistry = REGISTRY) -> str:
    """A digest of everything that decides what a fold produces."""
    digest = hashlib.sha256()
    digest.update(f"format={SNAPSHOT_FORMAT};python={sys.version_info[:2]}".encode())
    core_package = Path(core.__file__).resolve().parent
    folding = Path(__file__).resolve().parent / "folding.py"
    for path in [*sorted(core_package.glob("*.py")), folding]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for type_name in sorted(registry.types):
        digest.update(f"{type_name}:v{registry.model(type_name).schema_version};".encode())
    digest.update(repr(policy).encode())
    return digest.hexdigest()[:32]


def dumps(folded: Folded) -> bytes:
    buffer = io.BytesIO()
    # The pickler's memo holds a reference to every object: the collector would rescan them
    # all, again and again, for nothing (it more than doubled the time of large snapshots).
    with gc_paused():
        _FastPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(folded)
    return zlib.compress(buffer.getvalue(), 1)


def loads(blob: bytes) -> Folded:
    # Unpickling a large state allocates as replay does: without the collector's scans.
    with gc_paused():
        folded = pickle.loads(zlib.decompress(blob))
    if not isinstance(folded, Folded):
        raise TypeError(f"snapshot holds a {type(folded).__name__}, not Folded")
    return folded


_SLOT_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _slot_fields(cls: type) -> tuple[str, ...] | None:
    """The fields of a slotted dataclass (None for any other class, and for one that says how
    it is pickled: `core.shape.Shape` is built again when loaded, as the hash it keeps is of
    the strings of the process that pickled it)."""
    try:
        return _SLOT_FIELDS[cls]
    except KeyError:
        pass
    fields = None
    own_reduce = "__reduce__" in cls.__dict__ or "__reduce_ex__" in cls.__dict__
    if dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__ and not own_reduce:
        fields = tuple(f.name for f in dataclasses.fields(cls))
    _SLOT_FIELDS[cls] = fields
    return fields


def _set_slots(obj: object, values: tuple[Any, ...]) -> None:
    fields = _slot_fields(type(obj))
    assert fields is not None
    for name, value in zip(fields, values, strict=True):
        object.__setattr__(obj, name, value)


class _FastPickler(pickle.Pickler):
    """Pickles slotted dataclasses (the core's records) as a tuple of field values.

    The standard way (dataclasses' __getstate__) looks the fields up for every object: 40 µs
    each, most of a snapshot's time with 100,000 jobs.
    """

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        fields = _slot_fields(cls)
        if fields is None:
            return NotImplemented
        values = tuple(getattr(obj, name) for name in fields)
        return (object.__new__, (cls,), values, None, None, _set_slots)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    position: int
    size_bytes: int


class SnapshotStore:
    """Saves and loads snapshots of one code version."""

    def __init__(self, pool: asyncpg.Pool, version: str) -> None:
        self.pool = pool
        self.version = version

    async def save(self, folded: Folded, *, keep: int = 3) -> SnapshotInfo:
        """Serialise and store `folded`; the caller must not fold into it until this returns.

        Pickling a large state takes seconds: it runs in a thread, so that the event loop
        keeps answering (the leader's lock pings) meanwhile.
        """
        blob = await asyncio.to_thread(dumps, folded)
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_SAVE, folded.position, self.version, blob, len(blob))
            await conn.execute(_PRUNE, self.version, keep)
            await conn.execute(_PRUNE_OTHER_VERSIONS, self.version)
        log.info("snapshot at position %d (%d bytes)", folded.position, len(blob))
        return SnapshotInfo(folded.position, len(blob))

    async def load(self, *, max_position: int) -> Folded | None:
        """The latest snapshot of this version covering at most `max_position`, if any."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(_LOAD, self.version, max_position)
        if row is None:
            return None
        try:
            folded = loads(row["state"])
        except Exception as error:
            # A cache that cannot be read is no reason to stop: replay from the start instead.
            log.warning("snapshot at %d unreadable (%r); replaying fully", row["position"], error)
            return None
        if folded.position != row["position"]:
            log.warning(
                "snapshot row at %d holds position %d; ignored", row["position"], folded.position
            )
            return None
        return folded
