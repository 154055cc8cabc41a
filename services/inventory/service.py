"""The inventory service: registers the discovered nodes and turns silence into NodeLost.

Thin: discovery and the liveness rules are pure modules; this wires them to the log (node
events, read by position) and the telemetry topic (heartbeats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge

from schemas.base import Event
from schemas.nodes import NodeLost, NodeRecovered, NodeRegistered
from schemas.telemetry import NodeHeartbeat, StepTimeSample
from services.inventory.liveness import Liveness, Sight, Transition
from services.inventory.settings import InventorySettings
from services.runtime.errors import DATABASE_UNAVAILABLE, StaleLeader
from services.runtime.kafka import make_admin
from services.runtime.leadership import Leadership
from services.runtime.metrics import new_registry
from services.runtime.records import StreamAppend
from services.runtime.retry import Outage
from services.runtime.store import EventStore

log = logging.getLogger(__name__)

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
        self.blind_gauge = Gauge(
            "gangway_inventory_blind",
            "1 while liveness cannot judge (bus down, mass silence or the grace after)",
            registry=registry,
        )
        self.leadership: Leadership | None = None

    def restart_clock(self) -> None:
        """Judge liveness from now on (at start, and when this process becomes the one that
        judges): every node gets the startup grace, and the log is folded afresh."""
        self.started_at = datetime.now(UTC)
        self.liveness = Liveness(
            self.settings.heartbeat_timeout_s,
            not_before=self.started_at + timedelta(seconds=self.settings.startup_grace_s),
            max_silent_fraction=self.settings.liveness_max_silent_fraction,
            min_silent_nodes=self.settings.liveness_min_silent_nodes,
            resume_grace_s=self.settings.liveness_resume_grace_s,
        )
        self.latest: dict[str, NodeRegistered] = {}
        self.position = 0
        self._sight: Sight = "grace"  # the startup grace is no news
        self._was_blind = False

    async def follow_log(self) -> None:
        """Fold the node events appended since the last call (any producer's)."""
        while True:
            batch = await self.store.read_all(self.position, 5000, types=NODE_LIFE_TYPES)
            for envelope in batch:
                handler = _LIFE_FOLDS.get(type(envelope.payload))
                if handler is not None:
                    handler(self, envelope.payload, envelope.recorded_at)
                self.position = envelope.position or self.position
            if len(batch) < 5000:
                break
        lost = len(self.liveness.lost)
        self.nodes_gauge.labels("lost").set(lost)
        self.nodes_gauge.labels("alive").set(len(self.latest) - lost)

    def _on_registered(self, event: NodeRegistered, at: datetime) -> None:
        self.latest[event.node_id] = event
        if event.node_id not in self.liveness:
            self.liveness.track(event.node_id, lost=False, since=max(at, self.started_at))

    def _on_lost(self, event: NodeLost, at: datetime) -> None:
        self.liveness.track(event.node_id, lost=True, since=at)

    def _on_recovered(self, event: NodeRecovered, at: datetime) -> None:
        self.liveness.track(event.node_id, lost=False, since=max(at, self.started_at))

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

    async def check(self, *, bus_connected: bool = True) -> list[Transition]:
        """Append NodeLost / NodeRecovered for the nodes whose liveness changed; none lost
        while this observer cannot hear (its bus connection is down, or most of the fleet is
        silent at once). As the liveness leader, its appends carry its epoch: a deposed
        inventory's NodeLost is refused (StaleLeader)."""
        await self.follow_log()
        now = datetime.now(UTC)
        changes = self.liveness.transitions(now, bus_connected=bus_connected)
        self._note_sight(self.liveness.sight(now))
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
            leadership = self.leadership
            await self.store.append_many(
                [StreamAppend(e.stream, None, [e]) for e in events],
                epoch=leadership.epoch if leadership is not None else None,
                leadership=LIVENESS_LEADERSHIP,
            )
            await self.follow_log()
        return changes

    def _note_sight(self, sight: Sight) -> None:
        """One log line per change of what this observer can see."""
        self.blind_gauge.set(0 if sight == "clear" else 1)
        if sight == self._sight:
            return
        previous, self._sight = self._sight, sight
        if sight == "bus-down":
            log.warning("liveness: the bus is unreachable; no node will be declared lost")
        elif sight == "mass-silence":
            log.warning(
                "liveness: %d nodes silent at once: this observer is cut off, not the nodes; "
                "no node will be declared lost",
                self.liveness.silent,
            )
        elif sight == "grace":
            if previous != "clear":
                log.warning(
                    "liveness: hearing the fleet again; no node declared lost before %s",
                    self.liveness.not_before.isoformat(timespec="seconds"),
                )
        elif previous == "grace" and self._was_blind:
            log.warning("liveness: judging the fleet again")
        self._was_blind = sight in ("bus-down", "mass-silence") or (
            sight == "grace" and self._was_blind
        )

    async def check_forever(
        self,
        stop: asyncio.Event,
        leadership: Leadership | None = None,
        probe: BusProbe | None = None,
    ) -> None:
        """Judge every interval until `stop` is set or, when leading, the leadership is lost
        (then return: the caller competes again, and stops the consumer)."""
        outage = Outage(log, "inventory: the event log")
        while not stop.is_set():
            if leadership is not None and not await leadership.still_held():
                # Another inventory may judge liveness now; two judges would record twice.
                log.warning("inventory lost its liveness leadership; competing again")
                return
            bus_connected = True if probe is None else await probe.connected()
            try:
                await self.check(bus_connected=bus_connected)
                outage.recovered()
            except StaleLeader as fenced:
                log.warning("inventory fenced (%s); competing again", fenced)
                return
            except DATABASE_UNAVAILABLE as error:
                # The database is away for a moment: nothing was appended; the next tick
                # decides again (a node lost meanwhile is still lost then).
                outage.failed(error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.liveness_check_interval_s)


# The log fold's dispatch table: each node-life event class and how liveness takes it.
_LIFE_FOLDS: dict[type[Event], Callable[[Inventory, Any, datetime], None]] = {
    NodeRegistered: Inventory._on_registered,
    NodeLost: Inventory._on_lost,
    NodeRecovered: Inventory._on_recovered,
}
NODE_LIFE_TYPES = tuple(event_class.type for event_class in _LIFE_FOLDS)


class BusProbe:
    """Whether this process reaches the broker now: a metadata request, bounded in time. The
    telemetry consumer cannot tell: during an outage it simply fetches nothing."""

    def __init__(self, settings: InventorySettings) -> None:
        self.settings = settings
        self._admin: AIOKafkaAdminClient | None = None

    async def connected(self) -> bool:
        timeout = self.settings.bus_probe_timeout_s
        try:
            if self._admin is None:
                admin = make_admin(
                    self.settings,
                    client_id=f"{self.settings.service_name}-probe",
                    request_timeout_ms=int(timeout * 1000),
                )
                self._admin = admin
                await asyncio.wait_for(admin.start(), timeout)
            await asyncio.wait_for(self._admin.describe_cluster(), timeout)
        except (KafkaError, OSError, TimeoutError):
            await self.close()
            return False
        return True

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(admin.close(), self.settings.bus_probe_timeout_s)
