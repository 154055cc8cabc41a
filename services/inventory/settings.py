"""The inventory's settings: discovery and liveness knobs over the shared runtime settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.runtime.settings import Settings


class InventorySettings(Settings):
    # GANGWAY_CLUSTER: a shorthand NODESxGPUS[:RACK_SIZE[:RACKS_PER_BLOCK]] or a YAML file.
    cluster: str = "16x8:4:2"
    # auto: NVML if a driver loads, else the cluster spec; nvml / spec force one.
    discovery: Literal["auto", "nvml", "spec"] = "auto"
    # Where an NVML-discovered host sits (a real host knows its rack from its labels).
    node_id: str | None = None
    node_rack: str = "r000"
    node_block: str = "b00"
    node_labels: dict[str, str] = Field(default_factory=dict)

    heartbeat_timeout_s: float = Field(default=10.0, gt=0)
    # After a (re)start, no node is declared lost before this much time has passed.
    startup_grace_s: float = Field(default=10.0, ge=0)
    liveness_check_interval_s: float = Field(default=1.0, gt=0)
    # Blindness (services/inventory/liveness.py, docs/reliability.md): no NodeLost while at
    # least `liveness_min_silent_nodes` nodes, and more than this fraction of the live ones,
    # are silent at once, nor while the inventory cannot reach the bus itself.
    liveness_max_silent_fraction: float = Field(default=0.5, ge=0, le=1)
    liveness_min_silent_nodes: int = Field(default=3, ge=1)
    # After it hears again, no node is declared lost for this long (default: the timeout).
    liveness_resume_grace_s: float | None = Field(default=None, ge=0)
    # How long the probe of the inventory's own bus connection may take before it counts as down.
    bus_probe_timeout_s: float = Field(default=2.0, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
