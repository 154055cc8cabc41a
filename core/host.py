"""CPUs and memory as resources: what a node's host holds beside its GPUs (DESIGN §8).

A node declares `cpus` and `memory_mb` (the cluster spec; NVML hosts read them from the OS); a
task may ask `cpus_per_task` and `memory_mb_per_task`. A node that declares neither is not
limited in it (a fleet that never declared CPUs schedules as before). The core counts CPUs in
thousandths, so that fractional asks (0.5 CPU) add up exactly.

- Whole-GPU gangs: a node's free GPUs hold only as many tasks as its free CPUs and memory do
  (`Snapshot.node_units`): a node with free GPUs but no free CPUs cannot take the rank.
- CPU-only gangs (`gpus_per_task: 0`, preprocessing): placed on hosts alone, preferring nodes
  whose GPUs are all taken (their CPUs serve no GPU gang), then the best fit in CPUs, so that
  the CPUs beside free GPUs stay for the GPU gangs that will need them.
- `why`: a gang that would fit on GPUs but not on hosts names the resource that blocks it.
- A node that declares no CPUs is unlimited for GPU gangs (their GPUs bound them), but a
  CPU-only gang has nothing else to bound it: 4,096 preprocessing ranks would all land on the
  first such node. For CPU-only tasks such a node counts as `UNDECLARED_CPUS_PER_GPU` CPUs per
  GPU (at least one GPU's worth), the low end of real GPU servers (a DGX H100 has 14 cores per
  GPU, cloud 8-GPU hosts 12 to 24). Real hosts never need it: NVML discovery reads the OS.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from core.shape import Shape, cpus_text, needs_nvlink
from core.state import CoreJob, rank_host
from schemas.jobs import JobSpec
from schemas.reasons import DeferCode, RejectCode

if TYPE_CHECKING:
    from core.placement import Allocation, Snapshot
    from core.surface import PlanningSurface

INSUFFICIENT_CPUS: DeferCode = "insufficient_cpus"
INSUFFICIENT_MEMORY: DeferCode = "insufficient_memory"

UNDECLARED_CPUS_PER_GPU = 8


def cpu_only_cpus_milli(declared_milli: int | None, gpu_count: int) -> int:
    """The CPUs (thousandths) a node offers CPU-only tasks: what it declares, else the
    assumed `UNDECLARED_CPUS_PER_GPU` per GPU (see the module's docstring)."""
    if declared_milli is not None:
        return declared_milli
    return UNDECLARED_CPUS_PER_GPU * max(1, gpu_count) * 1000


def place_on_hosts(snap: Snapshot, shape: Shape, avoid_reserved: bool) -> Allocation | None:
    """Where a CPU-only gang fits now, as (node, tasks) pairs, or None.

    Nodes are taken in preference order: fewest free GPUs first (CPUs beside busy GPUs are the
    ones no GPU gang can use), then nodes that declare their host before those that do not,
    then the fewest free CPUs that still hold a task (best fit), then the node index. `require`
    keeps the gang in one node, rack or block (the domain whose best node comes first).
    """
    cpus, memory = shape.cpus_milli, shape.memory_mb
    wanted = shape.units
    gpu_type, require = shape.gpu_type, shape.require
    reserved = snap.reserved if avoid_reserved else frozenset()
    taken, count = snap.host_taken, snap.count
    ranked: list[tuple[tuple[int, int, int, int], int, int]] = []
    # One pass over the fleet, inlined (Snapshot.host_units per node costs several times more).
    for node in snap.nodes:
        if not node.schedulable or (gpu_type is not None and node.gpu_type != gpu_type):
            continue
        index = node.index
        if index in reserved:
            continue
        took_cpus, took_memory = taken.get(index, (0, 0))
        units = wanted
        free_cpus = (
            cpu_only_cpus_milli(node.cpus_milli, node.gpu_count) - node.cpus_bound_milli - took_cpus
        )
        if cpus:
            units = min(units, max(0, free_cpus) // cpus)
        if memory and node.memory_mb is not None:
            units = min(
                units, max(0, node.memory_mb - node.memory_bound_mb - took_memory) // memory
            )
        if units <= 0:
            continue
        declared = 0 if node.cpus_milli is not None else 1
        key = (count.get(index, 0), declared, free_cpus, index)
        if require == "none":
            domain = 0
        elif require == "node":
            domain = index
        else:
            domain = node.rack_id if require == "rack" else node.block_id
        ranked.append((key, units, domain))
    ranked.sort()
    if shape.require == "none":
        return _take(ranked, wanted, shape.min_units)
    domains: dict[int, list[tuple[tuple[int, int, int, int], int, int]]] = {}
    for entry in ranked:
        domains.setdefault(entry[2], []).append(entry)
    fallback: Allocation | None = None
    for members in domains.values():  # in order of each domain's best node
        found = _take(members, wanted, shape.min_units)
        if found is None:
            continue
        if sum(units for _, units in found) == wanted:
            return found
        if fallback is None:
            fallback = found
    return fallback


def _take(
    ranked: list[tuple[tuple[int, int, int, int], int, int]], wanted: int, least: int
) -> Allocation | None:
    allocation: Allocation = []
    placed = 0
    for key, units, _ in ranked:
        take = min(units, wanted - placed)
        allocation.append((key[3], take))
        placed += take
        if placed == wanted:
            return allocation
    return allocation if placed >= least and placed > 0 else None


def release_gang(snap: Snapshot, job: CoreJob, *, gather: bool = True) -> None:
    """Give a gang's GPUs and host resources back to a planning snapshot.

    `gather`: its GPUs enter per node (`Snapshot.release_gathered`), as the head's plan lets
    them in: a wide victim tried by the preemption planner holds hundreds of ranks, several
    to a node. Without, rank by rank (`Snapshot.release`): the same snapshot, the reference.
    """
    cpus, memory = rank_host(job.spec)
    if gather:
        usable = snap.usable
        gathered: dict[int, int] = {}
        for index, mask in job.ranks:
            back = usable(index, mask)
            if back:
                gathered[index] = gathered.get(index, 0) | back
        snap.release_gathered(gathered)
    else:
        for index, mask in job.ranks:
            snap.release(index, mask)
    if cpus or memory:
        for index, _ in job.ranks:
            snap.shift_host(index, -cpus, -memory)


def host_blocker(
    snap: Snapshot, shape: Shape, avoid_reserved: bool
) -> tuple[DeferCode, str] | None:
    """The host resource that keeps a gang out although it waits for capacity, with the
    sentence `why` shows; None when GPUs (or locality) are what it waits for."""
    from core.placement import find_placement

    if shape.cpu_only:
        resource = _scarcer(snap, shape, None)
        most = _most_free(snap, resource, None)
        where = "any node"
    else:
        if not shape.asks_host:
            return None
        bare = replace(shape, cpus_milli=0, memory_mb=0)
        if find_placement(snap, bare, avoid_reserved) is None:
            return None  # it waits for GPUs, host or not
        resource = "memory"
        if shape.cpus_milli:
            cpus_alone = replace(shape, memory_mb=0)
            if find_placement(snap, cpus_alone, avoid_reserved) is None:
                resource = "cpus"
        most = _most_free(snap, resource, shape.unit_gpus)
        where = "any node with free GPUs"
    if resource == "cpus":
        return (
            INSUFFICIENT_CPUS,
            f"needs {cpus_text(shape.cpus_milli)} CPUs per task; the most free on {where} is "
            f"{cpus_text(most)}",
        )
    return (
        INSUFFICIENT_MEMORY,
        f"needs {shape.memory_mb} MB of memory per task; the most free on {where} is {most} MB",
    )


def _scarcer(snap: Snapshot, shape: Shape, unit_gpus: int | None) -> str:
    """For a CPU-only gang: CPUs, unless some node has the CPUs and memory is what lacks."""
    if not shape.memory_mb:
        return "cpus"
    if not shape.cpus_milli:
        return "memory"
    most_cpus = _most_free(snap, "cpus", unit_gpus)
    return "cpus" if most_cpus < shape.cpus_milli else "memory"


def _most_free(snap: Snapshot, resource: str, unit_gpus: int | None) -> int:
    """The most free CPUs (thousandths) or memory (MB) on a schedulable node that declares it;
    only nodes with at least `unit_gpus` free GPUs when given."""
    most = 0
    if unit_gpus is None:
        indices: Collection[int] = [node.index for node in snap.nodes if node.schedulable]
    else:
        indices = [index for index, count in snap.count.items() if count >= unit_gpus]
    nodes = snap.nodes
    for index in indices:
        cpus, memory = snap.host_free(index)
        if cpus is None and unit_gpus is None:  # a CPU-only task counts the assumed CPUs
            node = nodes[index]
            taken = snap.host_taken.get(index, (0, 0))[0]
            cpus = cpu_only_cpus_milli(None, node.gpu_count) - node.cpus_bound_milli - taken
        free = cpus if resource == "cpus" else memory
        if free is not None:
            most = max(most, free)
    return most


def host_infeasible(state: PlanningSurface, shape: Shape) -> str | None:
    """Why no schedulable node, even empty, could hold one task's host ask (or None)."""
    if not shape.asks_host:
        return None
    largest_cpus: int | None = 0
    largest_memory: int | None = 0
    any_node = False
    for node in state.node_records:
        if not node.schedulable or (shape.gpu_type is not None and node.gpu_type != shape.gpu_type):
            continue
        if not shape.cpu_only and node.gpu_count < shape.unit_gpus:
            continue
        if shape.nvlink and not node.nvlink:
            continue  # a tp group never goes there, whatever its CPUs and memory
        any_node = True
        declared = node.cpus_milli
        if shape.cpu_only:
            declared = cpu_only_cpus_milli(declared, node.gpu_count)
        largest_cpus = _larger(largest_cpus, declared)
        largest_memory = _larger(largest_memory, node.memory_mb)
    if not any_node:
        return None  # the GPU rules explain it
    per_unit = shape.tasks_per_unit
    if largest_cpus is not None and shape.cpus_milli * per_unit > largest_cpus:
        return (
            f"needs {cpus_text(shape.cpus_milli)} CPUs per task; no schedulable node has that "
            f"many (largest has {cpus_text(largest_cpus)})"
        )
    if largest_memory is not None and shape.memory_mb * per_unit > largest_memory:
        return (
            f"needs {shape.memory_mb} MB of memory per task; no schedulable node has that much "
            f"(largest has {largest_memory} MB)"
        )
    return None


def _larger(current: int | None, declared: int | None) -> int | None:
    """The larger of two capacities, None (not declared: not limited) being the largest."""
    if current is None or declared is None:
        return None
    return max(current, declared)


class HostShape(Protocol):
    """A node as admission sees it: its GPUs, CPUs, memory and place in the topology."""

    @property
    def node_id(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def rack(self) -> str: ...
    @property
    def block(self) -> str: ...
    @property
    def cpus(self) -> int | None: ...
    @property
    def memory_mb(self) -> int | None: ...
    @property
    def nvlink(self) -> bool: ...


def host_rejection(spec: JobSpec, nodes: Collection[HostShape]) -> tuple[RejectCode, str] | None:
    """Why admission refuses the job's host ask for good: a task that asks more CPUs or memory
    than any node of its GPU type (with room for its GPUs) has, or a CPU-only gang that the
    whole fleet (within its `require`) could not hold even empty."""
    cpus = 0 if spec.cpus_per_task is None else round(spec.cpus_per_task * 1000)
    memory = spec.memory_mb_per_task or 0
    if not cpus and not memory:
        return None
    nvlink = needs_nvlink(spec)
    fitting = [
        node
        for node in nodes
        if (spec.gpu_type is None or node.gpu_type == spec.gpu_type)
        and node.gpus >= spec.gpus_per_task
        # A tensor-parallel group that spans GPUs goes only where NVLink joins them.
        and (node.nvlink or not nvlink)
    ]
    if not fitting:
        return None  # the GPU rules refuse it
    largest_cpus: int | None = 0
    largest_memory: int | None = 0
    cpu_only = not spec.gpus_per_task

    def cpus_of(node: HostShape) -> int | None:
        declared = None if node.cpus is None else node.cpus * 1000
        return cpu_only_cpus_milli(declared, node.gpus) if cpu_only else declared

    for node in fitting:
        largest_cpus = _larger(largest_cpus, cpus_of(node))
        largest_memory = _larger(largest_memory, node.memory_mb)
    if largest_cpus is not None and cpus > largest_cpus:
        return (
            "task_too_large",
            f"a task needs {cpus_text(cpus)} CPUs but the largest node has "
            f"{cpus_text(largest_cpus)}{_assumed_note(cpu_only, fitting)}",
        )
    if largest_memory is not None and memory > largest_memory:
        return (
            "task_too_large",
            f"a task needs {memory} MB of memory but the largest node has {largest_memory} MB",
        )
    if spec.gpus_per_task:
        return None
    domains: dict[str, int] = {}
    require = spec.topology.require
    for node in fitting:
        per_node = spec.tasks
        node_cpus = cpus_of(node)
        if cpus and node_cpus is not None:
            per_node = min(per_node, node_cpus // cpus)
        if memory and node.memory_mb is not None:
            per_node = min(per_node, node.memory_mb // memory)
        domain = {"node": node.node_id, "rack": node.rack, "block": node.block}.get(require, "")
        domains[domain] = domains.get(domain, 0) + per_node
    placeable = max(domains.values(), default=0)
    if placeable < spec.gang_min_tasks:
        scope = {"none": "the cluster"}.get(require, f"one {require}")
        return (
            "gang_too_large",
            f"needs {spec.gang_min_tasks} CPU-only tasks but {scope} can hold at most "
            f"{placeable}{_assumed_note(cpu_only, fitting)}",
        )
    return None


def _assumed_note(cpu_only: bool, nodes: Collection[HostShape]) -> str:
    if cpu_only and any(node.cpus is None for node in nodes):
        return f" (a node that declares no CPUs counts {UNDECLARED_CPUS_PER_GPU} per GPU)"
    return ""
