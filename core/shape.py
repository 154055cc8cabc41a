"""A gang's shape: what it needs from the topology, independent of who asks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.jobs import JobSpec

# (gpu type, unit GPUs, require, avoid reserved, CPUs per task, memory per task, NVLink)
FailureKey = tuple[str | None, int, str, bool, int, int, bool]
_Compared = tuple[str | None, int, int, int, int, int, str, int, int, bool]


@dataclass(frozen=True, slots=True)
class Shape:
    """What a gang needs from the topology, independent of who asks."""

    gpu_type: str | None
    unit_gpus: int
    tasks_per_unit: int
    gpus_per_task: int
    units: int
    min_units: int
    require: str
    # What each task asks of its node's host: thousandths of a CPU, MB of memory (0: nothing).
    cpus_milli: int = 0
    memory_mb: int = 0
    # Its tensor-parallel groups span GPUs (`tp_size` > 1): they go to nodes whose GPUs are
    # joined by NVLink only (`NodeRegistered.nvlink`), never to GPUs that talk over PCIe. Set
    # only where the cluster has such nodes (`shape_of`): on a cluster of NVLink alone a tp
    # gang and a plain one of the same units are one shape and share every per-shape answer
    # (placement's and preemption's memos of what failed, the waiting reasons).
    nvlink: bool = False
    # Derived once, not properties: a cycle reads them for every waiting job in ordering,
    # placing and preemption for fairness (34 million reads of `min_gpus` on the Philly window).
    # Left out of equality, as what they derive from is in it.
    min_gpus: int = field(init=False, repr=False, compare=False)
    asks_host: bool = field(init=False, repr=False, compare=False)
    # The hash of the compared fields, and the two failure keys (`failure_key`): a busy cycle
    # looks ~9,500 waiting jobs' shapes up in its per-shape answers, and hashing nine fields
    # and building a key tuple at each lookup were a visible share of placing them.
    _hash: int = field(init=False, repr=False, compare=False)
    _failure_keys: tuple[FailureKey, FailureKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_gpus", self.min_units * self.unit_gpus)
        object.__setattr__(self, "asks_host", bool(self.cpus_milli or self.memory_mb))
        object.__setattr__(self, "_hash", hash(self._compared()))
        # A gang that asks more of the host fails where one that asks less may fit: the host
        # ask is part of the key (after `avoid_reserved`, which callers read as key[3]).
        # A gang that needs NVLink fails where one that does not may fit (on PCIe nodes).
        gpu_type, unit, require, cpus, memory, nvlink = (
            self.gpu_type,
            self.unit_gpus,
            self.require,
            self.cpus_milli,
            self.memory_mb,
            self.nvlink,
        )
        keys = (
            (gpu_type, unit, require, False, cpus, memory, nvlink),
            (gpu_type, unit, require, True, cpus, memory, nvlink),
        )
        object.__setattr__(self, "_failure_keys", keys)

    def _compared(self) -> _Compared:
        """The fields equality compares, in field order (the constructor's arguments)."""
        return (
            self.gpu_type,
            self.unit_gpus,
            self.tasks_per_unit,
            self.gpus_per_task,
            self.units,
            self.min_units,
            self.require,
            self.cpus_milli,
            self.memory_mb,
            self.nvlink,
        )

    def __hash__(self) -> int:
        # Equal shapes hash alike: the fields equality compares (an explicit __hash__ of a
        # frozen dataclass is kept as written).
        return self._hash

    def __reduce__(self) -> tuple[type[Shape], _Compared]:
        # Built again when unpickled: a string's hash differs from process to process (the
        # scheduler loads snapshots another process pickled), so the kept hash is not stored.
        return (Shape, self._compared())

    @property
    def cpu_only(self) -> bool:
        """A task of no GPU at all (preprocessing): placed on CPUs and memory only."""
        return self.unit_gpus == 0

    @property
    def gpus(self) -> int:
        return self.units * self.unit_gpus

    def failure_key(self, avoid_reserved: bool) -> FailureKey:
        return self._failure_keys[avoid_reserved]


def ranks_per_unit(spec: JobSpec) -> int:
    """The consecutive ranks that must share one node: a tensor-parallel group of tp/g ranks
    when `tp_size` is a multiple of `gpus_per_task` g, else one (a tp that divides g fits in
    one task). The spec's validation guarantees one case or the other."""
    tp = spec.topology.tp_size
    g = spec.gpus_per_task
    return tp // g if tp is not None and tp > g else 1


def unit_gpus(spec: JobSpec) -> int:
    """The GPUs one unit (a task, or a tp group of several ranks) needs in one NVLink domain."""
    return ranks_per_unit(spec) * spec.gpus_per_task


def shape_of(spec: JobSpec, *, pcie_nodes: bool = True) -> Shape:
    """The gang's shape; `pcie_nodes`: whether the cluster has nodes whose GPUs NVLink does
    not join (the scheduler's state knows; without, a tp gang's shape asks for NVLink)."""
    g = spec.gpus_per_task
    tasks_per_unit = ranks_per_unit(spec)
    units = spec.tasks // tasks_per_unit
    min_units = max(1, -(-spec.gang_min_tasks // tasks_per_unit))
    return Shape(
        gpu_type=spec.gpu_type,
        unit_gpus=g * tasks_per_unit,
        tasks_per_unit=tasks_per_unit,
        gpus_per_task=g,
        units=units,
        min_units=min(min_units, units),
        require=spec.topology.require,
        cpus_milli=0 if spec.cpus_per_task is None else round(spec.cpus_per_task * 1000),
        memory_mb=spec.memory_mb_per_task or 0,
        nvlink=pcie_nodes and needs_nvlink(spec),
    )


def needs_nvlink(spec: JobSpec) -> bool:
    """Whether the job's tensor-parallel groups span GPUs, which then must talk over NVLink
    (a `tp_size` that divides `gpus_per_task` still spans the task's GPUs). A task of several
    GPUs without `tp_size` asks only that they share a node."""
    tp = spec.topology.tp_size
    return tp is not None and tp > 1


# The placement pools: a node's GPU type, set apart for nodes whose GPUs NVLink does not join
# (`NodeRegistered.nvlink` false): a gang takes GPUs of one pool, and a gang whose
# tensor-parallel groups span GPUs (`Shape.nvlink`) takes none of those.
_WITHOUT_NVLINK = "\x00without NVLink"


def pool_of(gpu_type: str, nvlink: bool) -> str:
    """The placement pool of a node of `gpu_type` whose GPUs NVLink joins (or not)."""
    return gpu_type if nvlink else gpu_type + _WITHOUT_NVLINK


def pool_has_nvlink(pool: str) -> bool:
    return not pool.endswith(_WITHOUT_NVLINK)


def pool_gpu_type(pool: str) -> str:
    return pool.removesuffix(_WITHOUT_NVLINK)


def shape_pools(shape: Shape, pools: Iterable[str]) -> list[str]:
    """The pools the gang may take GPUs from, in the order placement tries them: its GPU
    type's (they need not be among `pools`), or those of `pools` by GPU type. A gang that
    needs no NVLink tries a type's nodes without it first: NVLink nodes are the only ones a
    tp gang can use, and plain work that took them while PCIe boxes stood idle left tp gangs
    waiting (or preempting) on a cluster with room for both."""
    if shape.gpu_type is not None:
        if shape.nvlink:
            return [shape.gpu_type]
        return [shape.gpu_type + _WITHOUT_NVLINK, shape.gpu_type]
    if shape.nvlink:
        return sorted(pool for pool in pools if pool_has_nvlink(pool))
    return sorted(pools, key=_pcie_first)


def _pcie_first(pool: str) -> tuple[str, bool]:
    return pool_gpu_type(pool), pool_has_nvlink(pool)


def pool_suits(shape: Shape, pool: str) -> bool:
    """Whether the gang may take GPUs of `pool` (one of `shape_pools`, present or not)."""
    if shape.nvlink and not pool_has_nvlink(pool):
        return False
    return shape.gpu_type is None or shape.gpu_type == pool_gpu_type(pool)


def describe_need(shape: Shape) -> str:
    """'needs 64 GPUs (8 tasks x 8) in one rack, tp groups of 8 on one NVLink domain'."""
    tasks = shape.units * shape.tasks_per_unit
    if shape.cpu_only:
        return _describe_cpu_only(shape, tasks)
    text = f"needs {shape.gpus} GPU{'s' if shape.gpus != 1 else ''}"
    if tasks > 1:
        text += f" ({tasks} tasks x {shape.gpus_per_task})"
    if shape.gpu_type:
        text += f" of type {shape.gpu_type}"
    if shape.require == "node" or (shape.units == 1 and shape.gpus > 1):
        text += " in one NVLink domain"
    elif shape.require in ("rack", "block"):
        text += f" in one {shape.require}"
    if shape.tasks_per_unit > 1:
        text += f", tp groups of {shape.unit_gpus} GPUs each on one node"
    if shape.min_units < shape.units:
        text += f" (at least {shape.min_units * shape.tasks_per_unit} tasks)"
    if shape.asks_host:
        text += f", {describe_host(shape)} per task"
    return text


def describe_host(shape: Shape) -> str:
    """'32 CPUs and 64000 MB of memory': what one task asks of its node's host."""
    parts = []
    if shape.cpus_milli:
        parts.append(f"{cpus_text(shape.cpus_milli)} CPU{'s' if shape.cpus_milli != 1000 else ''}")
    if shape.memory_mb:
        parts.append(f"{shape.memory_mb} MB of memory")
    return " and ".join(parts)


def cpus_text(milli: int) -> str:
    """Thousandths of a CPU as a person writes them: 32, 0.5, 1.25."""
    return f"{milli / 1000:g}" if milli % 1000 else str(milli // 1000)


def _describe_cpu_only(shape: Shape, tasks: int) -> str:
    """'needs 4 tasks of 2 CPUs and 4096 MB of memory, no GPU'."""
    text = f"needs {tasks} task{'s' if tasks != 1 else ''} of {describe_host(shape)}, no GPU"
    if shape.require in ("node", "rack", "block"):
        text += f", in one {shape.require}"
    if shape.min_units < shape.units:
        text += f" (at least {shape.min_units * shape.tasks_per_unit} tasks)"
    return text
