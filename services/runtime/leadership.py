"""Single-leader election: a session advisory lock, and an epoch that fences deposed leaders."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg

from schemas.leadership import SCHEDULER_STREAM, LeaderElected
from services.runtime.errors import DATABASE_UNAVAILABLE
from services.runtime.records import StreamAppend
from services.runtime.retry import Outage, until_available
from services.runtime.store import SCHEDULER_LEADERSHIP, EventStore

log = logging.getLogger(__name__)

_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended('gangway.leader.' || $1, 0))"

# Raises the epoch in the same transaction as the LeaderElected event that records it, through
# the owner's function: the services' role cannot write leader_epochs (migrations/0030).
_BUMP = "SELECT leader_epoch_bump($1, $2)"


@dataclass
class Leadership:
    """Held while `conn` lives: PostgreSQL releases the lock when the session ends, so a crashed
    leader is replaced as soon as its connection is gone. Append with `epoch=leadership.epoch`."""

    name: str
    leader_id: str
    epoch: int
    conn: asyncpg.Connection

    async def still_held(self) -> bool:
        """False once the session that holds the lock is gone: stop acting as the leader."""
        if self.conn.is_closed():
            return False
        try:
            await self.conn.fetchval("SELECT 1")
        except Exception:
            # Whatever broke the session (terminated, network, protocol), the lock went with it.
            self.conn.terminate()
            return False
        return True

    async def release(self) -> None:
        if not self.conn.is_closed():
            await self.conn.close()


async def acquire_leadership(
    store: EventStore,
    dsn: str,
    leader_id: str,
    *,
    name: str = SCHEDULER_LEADERSHIP,
    poll_interval_s: float = 1.0,
    stop: asyncio.Event | None = None,
) -> Leadership | None:
    """Wait until this process leads `name`, raise the epoch, and return the leadership.

    Returns None when `stop` is set first. The epoch bump fences every append made with an
    older epoch from then on (see EventStore.append's `epoch`).
    """
    conn: asyncpg.Connection = await asyncpg.connect(dsn)
    try:
        while not await conn.fetchval(_TRY_LOCK, name):
            if stop is not None:
                try:
                    await asyncio.wait_for(stop.wait(), poll_interval_s)
                    await conn.close()
                    return None
                except TimeoutError:
                    continue
            await asyncio.sleep(poll_interval_s)
        async with store.pool.acquire() as c, c.transaction():
            epoch = int(await c.fetchval(_BUMP, name, leader_id))
            if name == SCHEDULER_STREAM:
                elected = LeaderElected(epoch=epoch, leader_id=leader_id)
                await store.append_many(
                    [StreamAppend(SCHEDULER_STREAM, None, [elected])],
                    epoch=epoch,
                    leadership=name,
                    conn=c,
                )
        log.info("%s leads %s at epoch %d", leader_id, name, epoch)
        return Leadership(name=name, leader_id=leader_id, epoch=epoch, conn=conn)
    except BaseException:
        await conn.close()
        raise


async def compete(
    store: EventStore,
    dsn: str,
    leader_id: str,
    *,
    name: str,
    poll_interval_s: float = 1.0,
    stop: asyncio.Event,
    outage: Outage | None = None,
) -> Leadership | None:
    """`acquire_leadership`, across database outages: a lock connection that cannot be opened,
    or that breaks while waiting, is opened again on a new session (with backoff) until this
    process leads or `stop` is set (None).

    A leader that lost its lock (its session ended: a database restart, pg_terminate_backend,
    a pause past the session timeout) stops acting at once and calls this again: it may win
    again, under a new epoch, or stand by.
    """
    return await until_available(
        lambda: acquire_leadership(
            store, dsn, leader_id, name=name, poll_interval_s=poll_interval_s, stop=stop
        ),
        outage or Outage(log, f"{leader_id}: the {name} leader lock's database"),
        stop,
        transient=DATABASE_UNAVAILABLE,
    )
