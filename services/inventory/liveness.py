"""Liveness bookkeeping: who has missed heartbeats for too long, and who came back.

Pure: times come in as arguments. A heartbeat counts at the time it was sent, bounded by when it
was received, so a heartbeat replayed from the topic after a restart never revives a dead node.

Silence is evidence of a dead node only while the observer can hear the others. The judge
records no NodeLost while it is blind (docs/reliability.md, "Liveness"):

- its own connection to the bus is down (the service probes it and says so), or
- a mass silence: at least `min_silent_nodes` nodes, and more than `max_silent_fraction` of the
  nodes not already lost, are overdue at the same time. One machine room does not lose most of
  its nodes in the same ten seconds; a broker restart or a cut link does exactly that. (The
  Kubernetes node lifecycle controller stops evicting in a zone past its unhealthy threshold for
  the same reason.)

Once it can hear again it waits `resume_grace_s` (the fleet's heartbeats, and the consumer's
rejoin, need that long to arrive) before declaring any node lost; a node still silent then is
lost as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

Sight = Literal["clear", "bus-down", "mass-silence", "grace"]


@dataclass(frozen=True, slots=True)
class Transition:
    node_id: str
    change: Literal["lost", "recovered"]
    last_heartbeat_at: datetime | None


@dataclass(slots=True)
class _Node:
    last_seen: datetime | None
    lost: bool
    changed_at: datetime  # when it was last declared lost or (re)joined


class Liveness:
    """Tracks every registered node; `transitions(now)` says which changed state.

    `not_before`: no node is declared lost before it, whatever the log says about its last
    heartbeat, so that a restarted inventory gives the fleet time to be heard from again.
    """

    def __init__(
        self,
        timeout_s: float,
        *,
        not_before: datetime,
        max_silent_fraction: float = 0.5,
        min_silent_nodes: int = 3,
        resume_grace_s: float | None = None,
    ) -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self.not_before = not_before
        self.max_silent_fraction = max_silent_fraction
        self.min_silent_nodes = min_silent_nodes
        grace_s = timeout_s if resume_grace_s is None else resume_grace_s
        self.resume_grace = timedelta(seconds=grace_s)
        self._nodes: dict[str, _Node] = {}
        self._blind: Sight | None = None  # why this observer cannot judge now, if it cannot
        self._silent = 0  # overdue nodes at the last judgement

    def __contains__(self, node_id: str) -> bool:
        return node_id in self._nodes

    @property
    def lost(self) -> set[str]:
        return {node_id for node_id, node in self._nodes.items() if node.lost}

    @property
    def silent(self) -> int:
        """How many nodes were overdue at the last judgement (declared lost or held back)."""
        return self._silent

    def sight(self, now: datetime) -> Sight:
        """Whether this observer may judge at `now`: clear, blind (and why), or in the grace
        that follows blindness."""
        if self._blind is not None:
            return self._blind
        return "grace" if now < self.not_before else "clear"

    def track(self, node_id: str, *, lost: bool, since: datetime) -> None:
        """Follow `node_id`, lost or not as of `since` (from the log); keeps what it heard."""
        node = self._nodes.get(node_id)
        if node is None:
            self._nodes[node_id] = _Node(last_seen=None, lost=lost, changed_at=since)
        else:
            node.lost = lost
            node.changed_at = since

    def heard(self, node_id: str, sent_at: datetime, received_at: datetime) -> bool:
        """Record a heartbeat; False when the node is not tracked (not registered)."""
        node = self._nodes.get(node_id)
        if node is None:
            return False
        at = min(sent_at, received_at)
        if node.last_seen is None or at > node.last_seen:
            node.last_seen = at
        return True

    def transitions(self, now: datetime, *, bus_connected: bool = True) -> list[Transition]:
        """Apply and return the changes due at `now`; `bus_connected` False: the observer's
        own connection is down, so nobody's silence means anything."""
        changes: list[Transition] = []
        overdue: list[str] = []
        alive = 0
        for node_id, node in self._nodes.items():
            if node.lost:
                if (
                    node.last_seen is not None
                    and node.last_seen > node.changed_at
                    and now - node.last_seen <= self.timeout
                ):
                    node.lost, node.changed_at = False, now
                    changes.append(Transition(node_id, "recovered", node.last_seen))
                continue
            alive += 1
            reference = max(node.changed_at, node.last_seen or node.changed_at)
            if now - reference > self.timeout:
                overdue.append(node_id)
        self._silent = len(overdue)
        if not bus_connected:
            self._blind = "bus-down"
            return changes
        if len(overdue) >= self.min_silent_nodes and len(overdue) > (
            self.max_silent_fraction * alive
        ):
            self._blind = "mass-silence"
            return changes
        if self._blind is not None:
            # Hearing again: give the fleet's heartbeats time to arrive before judging anyone.
            self._blind = None
            self.not_before = max(self.not_before, now + self.resume_grace)
        if now < self.not_before:
            return changes
        for node_id in overdue:
            node = self._nodes[node_id]
            node.lost, node.changed_at = True, now
            changes.append(Transition(node_id, "lost", node.last_seen))
        return changes
