"""Re-geometry: when the scheduler re-partitions a GPU of a `mig: dynamic` node. Pure.

Changing a GPU's MIG geometry is a scheduled decision with a cost, not a free knob:
- only an idle GPU is re-partitioned (no slice, share or whole task on it): a GPU with work
  waits for that work to end; nothing is evicted for a geometry;
- it costs the node's `reconfigure_s`, during which the GPU serves nothing (the ledger's
  `busy_until`); the decision is recorded as GpuGeometryChanged with that cost;
- hysteresis: a GPU whose geometry changed less than `hold_s` ago keeps it, so that a burst of
  slices followed by a gang (and back) does not flap one GPU between layouts.

Two reasons to re-partition: waiting slices that fit in no free instance anywhere (a geometry
is built for them, on the idle GPU whose node has the fewest idle GPUs, to keep whole nodes for
gangs), and waiting whole-GPU work that finds no whole GPU (an idle MIG GPU goes back to whole,
on the node with the most idle GPUs, where a gang is likeliest to fit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from core.mig import Geometry, MigModel, geometry_with
from core.sharing import GpuLedger, NodeLedger, SharingLedger, TaskAsk
from schemas.nodes import GpuGeometryChanged, MigInstanceSpec

DEFAULT_HOLD_FACTOR = 10.0  # hysteresis: a geometry stays at least this many reconfigure_s


@dataclass(frozen=True, slots=True)
class GeometryDecision:
    node_id: str
    gpu_index: int
    geometry: Geometry
    previous: Geometry
    reconfigure_s: float
    reason: str

    def event(self) -> GpuGeometryChanged:
        return GpuGeometryChanged(
            node_id=self.node_id,
            gpu_index=self.gpu_index,
            geometry=[MigInstanceSpec(profile=i.profile, start=i.start) for i in self.geometry],
            previous=[MigInstanceSpec(profile=i.profile, start=i.start) for i in self.previous],
            reconfigure_s=self.reconfigure_s,
            reason=self.reason,
        )


def hold_s_of(node: NodeLedger, hold_s: float | None) -> float:
    return DEFAULT_HOLD_FACTOR * node.reconfigure_s if hold_s is None else hold_s


def may_repartition(node: NodeLedger, gpu: GpuLedger, now: float, hold_s: float | None) -> bool:
    """Idle, healthy, on a dynamic node, not being re-partitioned, and past its hold time."""
    if node.mig != "dynamic" or node.model is None or not node.schedulable:
        return False
    if not gpu.healthy or not gpu.idle or now < gpu.busy_until:
        return False
    changed = gpu.geometry_changed_at
    return changed is None or now - changed >= hold_s_of(node, hold_s)


def plan_regeometry(
    ledger: SharingLedger,
    waiting: Sequence[TaskAsk],
    now: float,
    *,
    hold_s: float | None = None,
) -> list[GeometryDecision]:
    """The re-partitions worth starting now for the waiting tasks (in order of arrival)."""
    decisions: list[GeometryDecision] = []
    taken: set[tuple[str, int]] = set()
    unplaced_slices = _without_an_instance(ledger, [a for a in waiting if a.kind == "mig"])
    # The geometry cut for a set of waiting slices depends on the GPU model only: computed once
    # per (model, slices), not once per node (a cluster of like nodes asks the same question).
    fills: dict[tuple[str, tuple[TaskAsk, ...]], tuple[Geometry, list[TaskAsk]]] = {}
    while unplaced_slices:
        found = _geometry_for_slices(ledger, unplaced_slices, now, hold_s, taken, fills)
        if found is None:
            break
        decision, served = found
        decisions.append(decision)
        taken.add((decision.node_id, decision.gpu_index))
        for ask in served:
            unplaced_slices.remove(ask)
    whole_wanted = [ask for ask in waiting if ask.kind == "whole"]
    if whole_wanted and all(ledger.place(ask, now) is None for ask in whole_wanted):
        decision_whole = _whole_again(ledger, now, hold_s, taken)
        if decision_whole is not None:
            decisions.append(decision_whole)
    return decisions


def _without_an_instance(ledger: SharingLedger, asks: Sequence[TaskAsk]) -> list[TaskAsk]:
    """The slices no free instance will serve: instances free now and those of GPUs still
    being re-partitioned count alike, so that a slice waiting for a GPU that is being cut for
    it does not get another GPU cut."""
    free: Counter[tuple[str, str]] = Counter()
    for node in ledger.nodes.values():
        if not node.schedulable:
            continue
        for gpu in node.gpus:
            if not gpu.healthy or gpu.whole is not None:
                continue
            for instance in gpu.geometry:
                if instance.start not in gpu.slices:
                    free[(node.node_id, instance.profile)] += 1
    left: list[TaskAsk] = []
    for ask in asks:
        where = next(
            (
                key
                for key, count in free.items()
                if count > 0
                and key[1] == ask.mig_profile
                and ledger.nodes[key[0]].of_type(ask)
                and ledger.nodes[key[0]].fits_host(ask)
            ),
            None,
        )
        if where is None:
            left.append(ask)
        else:
            free[where] -= 1
    return left


def _geometry_for_slices(
    ledger: SharingLedger,
    asks: Sequence[TaskAsk],
    now: float,
    hold_s: float | None,
    taken: set[tuple[str, int]],
    fills: dict[tuple[str, tuple[TaskAsk, ...]], tuple[Geometry, list[TaskAsk]]],
) -> tuple[GeometryDecision, list[TaskAsk]] | None:
    best: tuple[tuple[int, int, str, int], GeometryDecision, list[TaskAsk]] | None = None
    for node in ledger.nodes.values():
        model = node.model
        if model is None:
            continue
        # Only for slices this node could host (its type, CPUs, memory): an instance cut where
        # the task cannot land serves nobody, and the slice, still waiting, would have the
        # next idle GPU cut in the next cycle (_without_an_instance asks the same).
        fitting = [
            a
            for a in asks
            if node.of_type(a) and node.fits_host(a) and a.mig_profile in model.profiles
        ]
        if not fitting:
            continue
        idle = sum(1 for gpu in node.gpus if gpu.idle and not gpu.geometry)
        for gpu in node.gpus:
            if (node.node_id, gpu.index) in taken or not may_repartition(node, gpu, now, hold_s):
                continue
            fill_key = (model.name, tuple(fitting))
            if fill_key not in fills:
                fills[fill_key] = _fill(model, fitting)
            geometry, served = fills[fill_key]
            if not served or geometry == gpu.geometry:
                continue
            # The fewest slices left waiting, then the node with the fewest idle GPUs (keep
            # whole nodes whole), then a GPU already in MIG mode (no MIG-mode switch).
            key = (-len(served), idle, node.node_id, 0 if gpu.geometry else 1)
            if best is None or key < best[0]:
                profiles = Counter(a.mig_profile for a in served)
                reason = "fits waiting slices: " + ", ".join(
                    f"{count} x {name}" for name, count in sorted(profiles.items())
                )
                decision = GeometryDecision(
                    node.node_id, gpu.index, geometry, gpu.geometry, node.reconfigure_s, reason
                )
                best = (key, decision, served)
            break  # the node's GPUs are alike: its first eligible one stands for them
    return None if best is None else (best[1], best[2])


def _fill(model: MigModel, asks: Sequence[TaskAsk]) -> tuple[Geometry, list[TaskAsk]]:
    """A valid geometry holding as many of the asks as fit (largest first), the rest of the
    GPU cut into the most asked profile that still fits, so that it serves the next ones."""
    ordered = sorted(asks, key=lambda a: -model.profiles[a.mig_profile or ""].compute_slices)
    geometry: Geometry = ()
    served: list[TaskAsk] = []
    for ask in ordered:
        grown = geometry_with(model, geometry, [ask.mig_profile or ""])
        if grown is not None:
            geometry, served = grown, [*served, ask]
    counts = Counter(a.mig_profile for a in asks)
    for name, _ in sorted(counts.items(), key=lambda item: (-item[1], str(item[0]))):
        while name is not None:
            grown = geometry_with(model, geometry, [name])
            if grown is None:
                break
            geometry = grown
    return geometry, served


def _whole_again(
    ledger: SharingLedger, now: float, hold_s: float | None, taken: set[tuple[str, int]]
) -> GeometryDecision | None:
    best: tuple[tuple[int, str, int], GeometryDecision] | None = None
    for node in ledger.nodes.values():
        idle = sum(1 for gpu in node.gpus if gpu.idle and not gpu.geometry)
        for gpu in node.gpus:
            if not gpu.geometry or (node.node_id, gpu.index) in taken:
                continue
            if not may_repartition(node, gpu, now, hold_s):
                continue
            key = (-idle, node.node_id, gpu.index)
            if best is None or key < best[0]:
                best = (
                    key,
                    GeometryDecision(
                        node.node_id,
                        gpu.index,
                        (),
                        gpu.geometry,
                        node.reconfigure_s,
                        "a whole GPU for waiting whole-GPU work",
                    ),
                )
    return None if best is None else best[1]


def apply_decision(ledger: SharingLedger, decision: GeometryDecision, now: float) -> None:
    ledger.set_geometry(decision.node_id, decision.gpu_index, decision.geometry, now)
