"""What no wait can fix, known when a job is submitted: a gang larger than its queue's ceiling,
or than the fleet could ever hold. The API answers these at once (422 problem+json, like an
unknown GPU type) instead of a 201 for a job admission would reject a moment later: `sbatch`
refuses a job no partition could run the same way.

The rules and their words are admission's (core/admission.py `admit`: over_quota_max,
task_too_large, gang_too_large), judged with the same pure pieces (`max_placeable_tasks`,
`unit_gpus`) over the API's read models; admission judges them again over the log. Nothing is
judged while no node is known (admission then answers `no_nodes`), nor for CPU-only tasks.
Every node ever registered counts, lost or drained ones too: they may come back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.admission import NodeShape, max_placeable_tasks
from core.shape import unit_gpus
from schemas.jobs import JobSpec
from services.api.problems import ProblemError
from services.api.projections.model import ReadModels


@dataclass
class _Fleet:
    """The fleet's node shapes and, per job shape, how many tasks it could hold: rebuilt when
    a node record changes (a registration, a state change), not per submission."""

    key: tuple[int, ...]
    shapes: list[NodeShape]
    largest: dict[str, int]
    placeable: dict[tuple[object, ...], int] = field(default_factory=dict)


_fleet: _Fleet | None = None


def _fleet_of(models: ReadModels) -> _Fleet:
    global _fleet
    # Node records are immutable, replaced on every node event: their identities say whether
    # anything changed, at the cost of one pass in C instead of a rebuild in Python.
    key = tuple(map(id, models.nodes.values()))
    if _fleet is None or _fleet.key != key:
        shapes = [
            NodeShape(
                node_id=node.id,
                gpu_type=node.gpu_type,
                gpus=len(node.gpu_indices),
                rack=node.rack,
                block=node.block,
            )
            for node in models.nodes.values()
        ]
        largest: dict[str, int] = {}
        for shape in shapes:
            largest[shape.gpu_type] = max(largest.get(shape.gpu_type, 0), shape.gpus)
        _fleet = _Fleet(key, shapes, largest)
    return _fleet


def capacity_problem(
    spec: JobSpec, models: ReadModels, chain: Sequence[str]
) -> ProblemError | None:
    """The 422 for a gang no wait can place (the first rule that applies), or None."""
    if spec.gpus_per_task == 0 or not models.nodes:
        return None
    needed = spec.gang_min_tasks * spec.gpus_per_task
    for name in chain:
        ceiling = models.queues[name].max_gpus
        if ceiling is not None and needed > ceiling:
            return ProblemError(
                422,
                "over-quota-max",
                f"needs {needed} GPUs but queue {name!r} may never use more than {ceiling}",
            )
    fleet = _fleet_of(models)
    if spec.gpu_type is not None and spec.gpu_type not in fleet.largest:
        return None  # the unknown GPU type is its own problem (validation.py)
    largest = fleet.largest[spec.gpu_type] if spec.gpu_type else max(fleet.largest.values())
    group = unit_gpus(spec)
    if group > largest:
        what = "a task" if group == spec.gpus_per_task else "a tensor-parallel group"
        return ProblemError(
            422,
            "task-too-large",
            f"{what} needs {group} GPUs in one NVLink domain but the largest node has {largest}",
        )
    key = (spec.gpu_type, spec.gpus_per_task, spec.topology.tp_size, spec.topology.require)
    placeable = fleet.placeable.get(key)
    if placeable is None:
        nodes = [s for s in fleet.shapes if spec.gpu_type is None or s.gpu_type == spec.gpu_type]
        placeable = fleet.placeable[key] = max_placeable_tasks(spec, nodes)
    if placeable < spec.gang_min_tasks:
        require = spec.topology.require
        scope = "the cluster" if require == "none" else f"one {require}"
        return ProblemError(
            422,
            "gang-too-large",
            f"needs {spec.gang_min_tasks} tasks of {spec.gpus_per_task} GPUs but {scope} can "
            f"hold at most {placeable}",
        )
    return None
