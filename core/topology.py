"""Cluster specs: the shorthand `NODESxGPUS[:RACK_SIZE[:RACKS_PER_BLOCK]]` or YAML node groups.

Pure: it takes the text (callers read files) and returns the NodeRegistered events a spec-built
fleet announces. Node ids are n0000…, racks r000…, blocks b00…, numbered across the whole spec.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from schemas.nodes import GpuInfo, NodeRegistered

DEFAULT_GPU_TYPE = "H100"
DEFAULT_RACK_SIZE = 16
DEFAULT_RACKS_PER_BLOCK = 8
MAX_NODES = 200_000
MAX_GPUS_PER_NODE = 64

# Memory of the common data-centre parts, so that spec-built nodes look like real ones.
_GPU_MEMORY_MB = {
    "H100": 81_559,
    "H200": 143_771,
    "A100": 81_920,
    "A100-40GB": 40_960,
    "B200": 183_359,
    "L40S": 46_068,
    "V100": 16_384,
    "P100": 16_384,
}
_SHORTHAND = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*(?::\s*(\d+)\s*(?::\s*(\d+)\s*)?)?$")
_GROUP_KEYS = {
    "count",
    "gpus",
    "gpu_type",
    "rack",
    "block",
    "labels",
    "rack_size",
    "racks_per_block",
    "memory_mb",
}


class ClusterSpecError(ValueError):
    """The cluster spec cannot be read; the message is one line a person can act on."""


@dataclass(frozen=True, slots=True)
class _Group:
    count: int
    gpus: int
    gpu_type: str
    rack: str | None
    block: str | None
    labels: dict[str, str]
    rack_size: int
    racks_per_block: int
    memory_mb: int | None


def parse_cluster_spec(text: str) -> list[NodeRegistered]:
    """The nodes of a shorthand (`176x8:16:4`) or of YAML text listing node groups."""
    if not isinstance(text, str) or not text.strip():
        raise ClusterSpecError("cluster spec is empty")
    match = _SHORTHAND.match(text)
    if match is not None:
        nodes, gpus, rack_size, racks_per_block = match.groups()
        group = _Group(
            count=_positive(int(nodes), "node count", MAX_NODES),
            gpus=_positive(int(gpus), "GPUs per node", MAX_GPUS_PER_NODE),
            gpu_type=DEFAULT_GPU_TYPE,
            rack=None,
            block=None,
            labels={},
            rack_size=_positive(int(rack_size or DEFAULT_RACK_SIZE), "rack size", MAX_NODES),
            racks_per_block=_positive(
                int(racks_per_block or DEFAULT_RACKS_PER_BLOCK), "racks per block", MAX_NODES
            ),
            memory_mb=None,
        )
        return _build([group])
    if "\n" not in text and re.match(r"^\s*\d+\s*x", text):
        raise ClusterSpecError(
            f"bad cluster shorthand {text.strip()!r}: "
            "expected NODESxGPUS[:RACK_SIZE[:RACKS_PER_BLOCK]]"
        )
    return _build(_groups_from_yaml(text))


def _groups_from_yaml(text: str) -> list[_Group]:
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        first_line = str(error).splitlines()[0] if str(error) else "syntax error"
        message = f"cluster spec is neither a shorthand nor valid YAML: {first_line}"
        raise ClusterSpecError(message) from None
    defaults: Mapping[str, Any] = {}
    if isinstance(document, Mapping):
        defaults = document
        raw_groups = document.get("groups", document.get("nodes"))
    else:
        raw_groups = document
    if not isinstance(raw_groups, list) or not raw_groups:
        raise ClusterSpecError(
            "cluster spec YAML must list node groups (a list, or a mapping with 'groups:')"
        )
    rack_size = _int_field(defaults, "rack_size", DEFAULT_RACK_SIZE, "cluster")
    racks_per_block = _int_field(defaults, "racks_per_block", DEFAULT_RACKS_PER_BLOCK, "cluster")
    default_type = str(defaults.get("gpu_type", DEFAULT_GPU_TYPE))
    groups: list[_Group] = []
    total = 0
    for number, raw in enumerate(raw_groups, start=1):
        where = f"group {number}"
        if not isinstance(raw, Mapping):
            raise ClusterSpecError(f"{where} must be a mapping of count, gpus, gpu_type …")
        unknown = set(raw) - _GROUP_KEYS
        if unknown:
            raise ClusterSpecError(
                f"{where} has unknown keys: {', '.join(sorted(map(str, unknown)))}"
            )
        labels = raw.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise ClusterSpecError(f"{where}: labels must be a mapping")
        count = _positive(_int_field(raw, "count", 1, where), f"{where} count", MAX_NODES)
        total += count
        if total > MAX_NODES:
            raise ClusterSpecError(f"cluster spec has more than {MAX_NODES} nodes")
        gpu_type = str(raw.get("gpu_type", default_type)).strip()
        if not gpu_type:
            raise ClusterSpecError(f"{where}: gpu_type must not be empty")
        memory = raw.get("memory_mb")
        groups.append(
            _Group(
                count=count,
                gpus=_positive(
                    _int_field(raw, "gpus", 8, where), f"{where} gpus", MAX_GPUS_PER_NODE
                ),
                gpu_type=gpu_type,
                rack=None if raw.get("rack") is None else str(raw["rack"]),
                block=None if raw.get("block") is None else str(raw["block"]),
                labels={str(k): str(v) for k, v in labels.items()},
                rack_size=_positive(
                    _int_field(raw, "rack_size", rack_size, where), f"{where} rack_size", MAX_NODES
                ),
                racks_per_block=_positive(
                    _int_field(raw, "racks_per_block", racks_per_block, where),
                    f"{where} racks_per_block",
                    MAX_NODES,
                ),
                memory_mb=None if memory is None else _int_field(raw, "memory_mb", 0, where),
            )
        )
    return groups


def _build(groups: list[_Group]) -> list[NodeRegistered]:
    total = sum(group.count for group in groups)
    width = max(4, len(str(total - 1)))
    nodes: list[NodeRegistered] = []
    auto_rack = 0  # racks numbered across groups, so that groups never share an auto rack
    for group in groups:
        memory = group.memory_mb or _GPU_MEMORY_MB.get(group.gpu_type, 81_920)
        for offset in range(group.count):
            index = len(nodes)
            rack_number = auto_rack + offset // group.rack_size
            rack = group.rack or f"r{rack_number:03d}"
            block = group.block or f"b{rack_number // group.racks_per_block:02d}"
            node_id = f"n{index:0{width}d}"
            gpus = [
                GpuInfo.model_construct(
                    index=gpu,
                    uuid=f"GPU-{node_id}-{gpu}",
                    model=group.gpu_type,
                    memory_mb=memory,
                )
                for gpu in range(group.gpus)
            ]
            nodes.append(
                NodeRegistered(
                    node_id=node_id,
                    hostname=node_id,
                    gpu_type=group.gpu_type,
                    gpus=gpus,
                    rack=rack,
                    block=block,
                    nvlink_domain=node_id,
                    labels=dict(group.labels),
                    discovered_by="spec",
                )
            )
        if group.rack is None:
            auto_rack += -(-group.count // group.rack_size)
    return nodes


def _int_field(raw: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value: object = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClusterSpecError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def _positive(value: int, what: str, ceiling: int) -> int:
    if value < 1:
        raise ClusterSpecError(f"{what} must be at least 1, got {value}")
    if value > ceiling:
        raise ClusterSpecError(f"{what} must be at most {ceiling}, got {value}")
    return value
