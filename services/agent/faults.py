"""Fault injection for simulated nodes: a JSON file per node under the fault directory.

`<fault_dir>/<node_id>.json`, read at every heartbeat, e.g.
    {"silent": true}                              the node stops heartbeating
    {"gpus": {"3": {"xid_errors": [79]}}}         GPU 3 reports XID 79 (fallen off the bus)
    {"gpus": {"0": {"temperature_c": 95}}, "nic_gbps": 40}
Deleting the file heals the node. A malformed file is ignored (and logged), never fatal.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.telemetry import GpuSample

log = logging.getLogger(__name__)

_GPU_FIELDS = {"temperature_c", "ecc_uncorrected", "xid_errors", "utilization", "memory_used_mb"}


@dataclass(frozen=True)
class Fault:
    silent: bool = False
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    nic_gbps: float | None = None


HEALTHY = Fault()


def parse_fault(text: str) -> Fault:
    """The fault a file describes; ValueError when it is not one."""
    data: Any = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("a fault file holds a JSON object")
    unknown = set(data) - {"silent", "gpus", "nic_gbps"}
    if unknown:
        raise ValueError(f"unknown fault keys: {sorted(unknown)}")
    gpus: dict[int, dict[str, Any]] = {}
    raw_gpus = data.get("gpus", {})
    if not isinstance(raw_gpus, dict):
        raise ValueError("gpus must map a GPU index to its readings")
    for index, readings in raw_gpus.items():
        if not isinstance(readings, dict) or set(readings) - _GPU_FIELDS:
            raise ValueError(f"gpu {index}: readings must be among {sorted(_GPU_FIELDS)}")
        # Readings a GPU could report, judged now as the heartbeat will judge them: one that
        # no heartbeat can carry would fail every round, and with it every node's heartbeat.
        GpuSample.model_validate({**readings, "index": 0})
        gpus[int(index)] = dict(readings)
    silent = data.get("silent", False)
    if not isinstance(silent, bool):
        raise ValueError("silent is true or false")
    nic = data.get("nic_gbps")
    if nic is not None:
        nic = float(nic)
        if not nic >= 0:
            raise ValueError("nic_gbps is a speed, at least 0")
    return Fault(silent=silent, gpus=gpus, nic_gbps=nic)


def fault_path(fault_dir: Path, node_id: str) -> Path:
    return fault_dir / f"{node_id}.json"


def inject(fault_dir: Path, node_id: str, fault: dict[str, Any]) -> None:
    """Write a fault file (the tests' and an operator's way to break a simulated node)."""
    fault_dir.mkdir(parents=True, exist_ok=True)
    tmp = fault_dir / f".{node_id}.tmp"
    tmp.write_text(json.dumps(fault))
    tmp.replace(fault_path(fault_dir, node_id))


def heal(fault_dir: Path, node_id: str) -> None:
    fault_path(fault_dir, node_id).unlink(missing_ok=True)


class FaultReader:
    """Reads the current faults once per heartbeat round: one directory listing, and a read
    only of the files present (a healthy fleet costs one listing)."""

    def __init__(self, fault_dir: Path) -> None:
        self.fault_dir = fault_dir
        self._complained: set[str] = set()

    def current(self) -> dict[str, Fault]:
        try:
            names = [p for p in self.fault_dir.iterdir() if p.suffix == ".json"]
        except FileNotFoundError:
            return {}
        faults: dict[str, Fault] = {}
        for path in names:
            try:
                faults[path.stem] = parse_fault(path.read_text())
            except FileNotFoundError:
                continue  # healed between the listing and the read
            except (ValueError, TypeError) as error:
                if path.name not in self._complained:
                    self._complained.add(path.name)
                    log.warning("ignoring malformed fault file %s: %s", path, error)
        return faults
