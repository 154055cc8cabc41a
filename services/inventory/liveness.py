"""Liveness bookkeeping: who has missed heartbeats for too long, and who came back.

Pure: times come in as arguments. A heartbeat counts at the time it was sent, bounded by when it
was received, so a heartbeat replayed from the topic after a restart never revives a dead node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal


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

    def __init__(self, timeout_s: float, *, not_before: datetime) -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self.not_before = not_before
        self._nodes: dict[str, _Node] = {}

    def __contains__(self, node_id: str) -> bool:
        return node_id in self._nodes

    @property
    def lost(self) -> set[str]:
        return {node_id for node_id, node in self._nodes.items() if node.lost}

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

    def transitions(self, now: datetime) -> list[Transition]:
        """Apply and return the changes due at `now`."""
        changes: list[Transition] = []
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
            if now < self.not_before:
                continue
            reference = max(node.changed_at, node.last_seen or node.changed_at)
            if now - reference > self.timeout:
                node.lost, node.changed_at = True, now
                changes.append(Transition(node_id, "lost", node.last_seen))
        return changes
