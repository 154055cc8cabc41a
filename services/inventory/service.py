"""The inventory service: registers the discovered nodes and turns silence into NodeLost.

Thin: discovery and the liveness rules are pure modules; this wires them to the log (node
events, read by position) and the telemetry topic (heartbeats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter, Gauge

from schemas.base import Event
from schemas.nodes import NodeLost, NodeRecovered, NodeRegistered
from schemas.telemetry import NodeHeartbeat, StepTimeSample
from services.inventory.liveness import Liveness, Transition
from services.inventory.settings import InventorySettings
from services.runtime.leadership import Leadership
from services.runtime.metrics import new_registry
from services.runtime.records import StreamAppend
from services.runtime.store import EventStore

log = logging.getLogger(__name__)

NODE_LIFE_TYPES = ("NodeRegistered", "NodeLost", "NodeRecovered")
LIVENESS_LEADERSHIP = "inventory"
_REGISTER_BATCH = 500


def registrations_to_append(
    discovered: Sequence[NodeRegistered], latest: dict[str, NodeRegistered]
) -> list[NodeRegistered]:
    """The discovered nodes whose latest registration in the log differs (or is missing)."""
    return [node for node in discovered if latest.get(node.node_id) != node]


class Inventory:
    def __init__(self, settings: InventorySettings, store: EventStore) -> None:
        self.settings = settings
        self.store = store
        self.restart_clock()
        self._unknown_logged: set[str] = set()
        registry = new_registry()
        self.registry = registry
        self.heartbeats = Counter(
            "gangway_inventory_heartbeats", "Heartbeats received", registry=registry
        )
        self.nodes_gauge = Gauge(
            "gangway_inventory_nodes", "Registered nodes by liveness", ["state"], registry=registry
        )

    def restart_clock(self) -> None:
        """Judge liveness from now on (at start, and when this process becomes the one that
        judges): every node gets the startup grace, and the log is folded afresh."""
        self.started_at = datetime.now(UTC)
        self.liveness = Liveness(
            self.settings.heartbeat_timeout_s,
            not_before=self.started_at + timedelta(seconds=self.settings.startup_grace_s),
        )
        self.latest: dict[str, NodeRegistered] = {}
        self.position = 0

    async def follow_log(self) -> None:
        """Fold the node events appended since the last call (any producer's)."""
        while True:
            batch = await self.store.read_all(self.position, 5000, types=NODE_LIFE_TYPES)
            for envelope in batch:
                event = envelope.payload
                if isinstance(event, NodeRegistered):
                    self.latest[event.node_id] = event
                    if event.node_id not in self.liveness:
                        since = max(envelope.recorded_at, self.started_at)
                        self.liveness.track(event.node_id, lost=False, since=since)
                elif isinstance(event, NodeLost):
                    self.liveness.track(event.node_id, lost=True, since=envelope.recorded_at)
                elif isinstance(event, NodeRecovered):
                    since = max(envelope.recorded_at, self.started_at)
                    self.liveness.track(event.node_id, lost=False, since=since)
                self.position = envelope.position or self.position
            if len(batch) < 5000:
                break
        lost = len(self.liveness.lost)
        self.nodes_gauge.labels("lost").set(lost)
        self.nodes_gauge.labels("alive").set(len(self.latest) - lost)

    async def register(self, discovered: Sequence[NodeRegistered]) -> int:
        """Append NodeRegistered for every discovered node not already registered identically."""
        await self.follow_log()
        todo = registrations_to_append(discovered, self.latest)
        for start in range(0, len(todo), _REGISTER_BATCH):
            chunk = todo[start : start + _REGISTER_BATCH]
            await self.store.append_many([StreamAppend(n.stream, None, [n]) for n in chunk])
        await self.follow_log()
        return len(todo)

    async def on_telemetry(self, message: NodeHeartbeat | StepTimeSample) -> None:
        if not isinstance(message, NodeHeartbeat):
            return
        self.heartbeats.inc()
        known = self.liveness.heard(message.node_id, message.at, datetime.now(UTC))
        if not known and message.node_id not in self._unknown_logged:
            self._unknown_logged.add(message.node_id)
            log.warning("heartbeat from unregistered node %s ignored", message.node_id)

    async def check(self) -> list[Transition]:
        """Append NodeLost / NodeRecovered for the nodes whose liveness changed."""
        await self.follow_log()
        changes = self.liveness.transitions(datetime.now(UTC))
        events: list[Event] = []
        for change in changes:
            if change.change == "lost":
                timeout = self.settings.heartbeat_timeout_s
                events.append(
                    NodeLost(
                        node_id=change.node_id,
                        reason=f"no heartbeat for {timeout:g} s",
                        last_heartbeat_at=change.last_heartbeat_at,
                    )
                )
            else:
                events.append(NodeRecovered(node_id=change.node_id))
        for event in events:
            log.info("%s %s", event.type, getattr(event, "node_id", ""))
        if events:
            await self.store.append_many([StreamAppend(e.stream, None, [e]) for e in events])
            await self.follow_log()
        return changes

    async def check_forever(
        self, stop: asyncio.Event, leadership: Leadership | None = None
    ) -> None:
        while not stop.is_set():
            if leadership is not None and not await leadership.still_held():
                # Another inventory judges liveness now; two judges would record twice.
                log.error("inventory lost its liveness leadership; stopping")
                stop.set()
                return
            try:
                await self.check()
            except Exception:
                # The database may be away for a moment; the next tick tries again.
                log.exception("liveness check failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.liveness_check_interval_s)
