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

from core.mig import mig_model, pack
from schemas.nodes import DEFAULT_RECONFIGURE_S, GpuInfo, MigMode, NodeRegistered

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
    "cpus",
    "gpu_model",
    "gpu_memory_mb",
    "mig",
    "reconfigure_s",
    "nvlink",
}
# The GPU model a short gpu_type stands for when the spec names none (its MIG profile table).
_DEFAULT_GPU_MODEL = {
    "H100": "H100-80GB",
    "H200": "H200-141GB",
    "A100": "A100-80GB",
    "A100-40GB": "A100-40GB",
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
    # Node memory (host RAM), CPUs and the GPUs' memory when it differs from the model's.
    memory_mb: int | None = None
    cpus: int | None = None
    gpu_model: str | None = None
    gpu_memory_mb: int | None = None
    mig: MigMode = "none"
    mig_profiles: tuple[str, ...] = ()
    reconfigure_s: float = DEFAULT_RECONFIGURE_S
    # Whether NVLink joins the nodes' GPUs (false: PCIe only, e.g. L40S or PCIe H100 boxes).
    nvlink: bool = True


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
        gpu_model = raw.get("gpu_model", _DEFAULT_GPU_MODEL.get(gpu_type))
        gpu_model = None if gpu_model is None else str(gpu_model).strip() or None
        mig, mig_profiles = _mig_field(raw.get("mig", "none"), gpu_model, where)
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
                memory_mb=_optional_positive(raw, "memory_mb", where),
                cpus=_optional_positive(raw, "cpus", where),
                gpu_model=gpu_model,
                gpu_memory_mb=_optional_positive(raw, "gpu_memory_mb", where),
                mig=mig,
                mig_profiles=mig_profiles,
                reconfigure_s=_seconds_field(raw, "reconfigure_s", DEFAULT_RECONFIGURE_S, where),
                nvlink=_bool_field(raw, "nvlink", True, where),
            )
        )
    return groups


def _build(groups: list[_Group]) -> list[NodeRegistered]:
    total = sum(group.count for group in groups)
    width = max(4, len(str(total - 1)))
    nodes: list[NodeRegistered] = []
    auto_rack = 0  # racks numbered across groups, so that groups never share an auto rack
    for group in groups:
        table = mig_model(group.gpu_model)
        memory = group.gpu_memory_mb or (
            table.memory_mb if table is not None else _GPU_MEMORY_MB.get(group.gpu_type, 81_920)
        )
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
                    nvlink=group.nvlink,
                    labels=dict(group.labels),
                    discovered_by="spec",
                    cpus=group.cpus,
                    memory_mb=group.memory_mb,
                    gpu_model=group.gpu_model,
                    mig=group.mig,
                    mig_profiles=list(group.mig_profiles),
                    reconfigure_s=group.reconfigure_s,
                )
            )
        if group.rack is None:
            auto_rack += -(-group.count // group.rack_size)
    return nodes


def _mig_field(value: object, gpu_model: str | None, where: str) -> tuple[MigMode, tuple[str, ...]]:
    """`mig: none | dynamic | [profiles]`: a fixed list must make one valid geometry of the
    group's GPU model (the profiles of one GPU, e.g. [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb])."""
    if value is None or value == "none" or value is False:
        return "none", ()
    table = mig_model(gpu_model)
    if table is None:
        raise ClusterSpecError(
            f"{where}: mig needs a gpu_model with a MIG profile table "
            f"(H100-80GB, H200-141GB, A100-80GB, A100-40GB), got {gpu_model!r}"
        )
    if value == "dynamic":
        return "dynamic", ()
    if not isinstance(value, list) or not value:
        raise ClusterSpecError(f"{where}: mig must be none, dynamic or a list of profiles")
    profiles = tuple(str(name).strip().removeprefix("MIG ") for name in value)
    unknown = sorted({name for name in profiles if table.profile(name) is None})
    if unknown:
        raise ClusterSpecError(
            f"{where}: {table.name} has no MIG profile {', '.join(unknown)} "
            f"(it has {', '.join(sorted(table.profiles))})"
        )
    if pack(table, profiles) is None:
        raise ClusterSpecError(
            f"{where}: the profiles {', '.join(profiles)} do not fit together on one "
            f"{table.name} (overlapping slots or more than 7 compute slices)"
        )
    return "fixed", profiles


def _optional_positive(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    if raw.get(key) is None:
        return None
    return _positive(_int_field(raw, key, 0, where), f"{where} {key}", 1 << 40)


def _seconds_field(raw: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value: object = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ClusterSpecError(f"{where}: {key} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _bool_field(raw: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value: object = raw.get(key, default)
    if not isinstance(value, bool):
        raise ClusterSpecError(f"{where}: {key} must be true or false, got {value!r}")
    return value


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
