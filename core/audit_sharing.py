"""The auditor's view of fractional GPUs: invariant 1 ("a GPU is bound at most once") read for
slices and shares, over a recorded log.

It folds the sharing ledger (core/sharing.py) from NodeRegistered, GpuGeometryChanged,
GangReserved and the gang-releasing events, and reports, as invariant-1 violations:
- a geometry that is not valid for the GPU's model, or set on a GPU that was not idle, or on a
  node whose MIG geometry the scheduler may not change;
- a slice placed outside the GPU's geometry, in an instance already held, or while the GPU is
  being re-partitioned;
- shares over 1000 thousandths or the GPU's memory, MPS shares past 48 on a GPU (its MPS
  server's clients), or shares of two teams on one soft-shared GPU;
- a GPU whole, sliced and shared at once; a node giving more CPUs or memory than it declared.
"""

from __future__ import annotations

from core.live_sharing import ask_of_placement
from core.mig import MigInstance, geometry_problems
from core.sharing import SharingLedger, Spot, gpu_problems, share_memory_mb
from schemas.base import Event
from schemas.jobs import (
    GANG_RELEASING_EVENTS,
    GangReserved,
    JobEvent,
    JobSpec,
    JobSubmitted,
    RankPlacement,
)
from schemas.nodes import GpuGeometryChanged, NodeRegistered


class SharingAudit:
    """Feed it every event in log order; it returns what each one broke (message, positions)."""

    def __init__(self) -> None:
        self.ledger = SharingLedger()
        self._specs: dict[str, JobSpec] = {}
        self._holders: dict[str, list[str]] = {}

    def observe(self, event: Event, position: int, at: float) -> list[str]:
        if isinstance(event, NodeRegistered):
            self.ledger.register(event)
            return []
        if isinstance(event, GpuGeometryChanged):
            return self._geometry(event, at)
        if isinstance(event, JobSubmitted):
            self._specs[event.job_id] = event.spec
            return []
        if isinstance(event, GangReserved):
            return self._reserved(event, at)
        if isinstance(event, GANG_RELEASING_EVENTS) and isinstance(event, JobEvent):
            for holder in self._holders.pop(event.job_id, []):
                self.ledger.release(holder)
        return []

    def whole_usable(self, node_id: str, index: int, at: float) -> bool:
        """Whether a whole-GPU gang could be given this GPU at `at`, as far as sharing goes:
        not in MIG mode (a fixed node's, a partitioned or re-partitioning dynamic GPU) and
        holding no slices or shares. Health, drains and whole gangs are the caller's."""
        node = self.ledger.nodes.get(node_id)
        if node is None:
            return True
        gpu = next((g for g in node.gpus if g.index == index), None)
        if gpu is None:
            return True
        return (
            node.mig != "fixed"
            and not gpu.geometry
            and not gpu.slices
            and not gpu.shares
            and at >= gpu.busy_until
        )

    def _geometry(self, event: GpuGeometryChanged, at: float) -> list[str]:
        node = self.ledger.nodes.get(event.node_id)
        if node is None or event.gpu_index >= len(node.gpus):
            return [f"geometry of unknown GPU {event.node_id}/{event.gpu_index}"]
        where = f"{event.node_id} GPU {event.gpu_index}"
        found: list[str] = []
        geometry = [MigInstance(i.start, i.profile) for i in event.geometry]
        if node.mig != "dynamic":
            found.append(f"{where}: re-partitioned on a node with mig: {node.mig}")
        if node.model is None:
            found.append(f"{where}: re-partitioned, but its model has no MIG")
        else:
            found.extend(f"{where}: {p}" for p in geometry_problems(node.model, geometry))
        if not node.gpus[event.gpu_index].idle:
            found.append(f"{where}: re-partitioned while it held work")
        self.ledger.set_geometry(event.node_id, event.gpu_index, geometry, at)
        node.gpus[event.gpu_index].busy_until = at + event.reconfigure_s
        return found

    def _reserved(self, event: GangReserved, at: float) -> list[str]:
        spec = self._specs.get(event.job_id)
        team = spec.team if spec is not None else ""
        found: list[str] = []
        holders = self._holders.setdefault(event.job_id, [])
        for rank in event.ranks:
            node = self.ledger.nodes.get(rank.node_id)
            if node is None or any(index >= len(node.gpus) for index in rank.gpus):
                continue  # the main auditor reports GPUs that do not exist
            ask = ask_of_placement(rank, spec, team)
            spot = Spot(
                rank.node_id,
                tuple(rank.gpus),
                mig=None if rank.mig is None else MigInstance(rank.mig.start, rank.mig.profile),
                thousandths=ask.thousandths,
                gpu_memory_mb=(
                    share_memory_mb(ask, node.gpus[rank.gpus[0]])
                    if ask.kind == "share" and rank.gpus
                    else 0
                ),
            )
            where = f"job {event.job_id} rank {rank.rank} on {rank.node_id}"
            if rank.mig is not None:
                if len(rank.gpus) != 1:
                    found.append(f"{where}: a slice names {len(rank.gpus)} GPUs, not one")
                    continue
                gpu = node.gpus[rank.gpus[0]]
                if spot.mig not in gpu.geometry:
                    found.append(f"{where}: no {rank.mig.profile} at slot {rank.mig.start}")
                elif rank.mig.start in gpu.slices:
                    found.append(f"{where}: slice at slot {rank.mig.start} is already held")
                if at < gpu.busy_until:
                    found.append(f"{where}: placed while its GPU is being re-partitioned")
            holder = f"{event.job_id}:{event.attempt}:{rank.rank}"
            self.ledger.release(holder)
            self.ledger.bind(holder, ask, spot)
            holders.append(holder)
            found.extend(f"{where}: {p}" for p in self._node_problems(rank))
        return found

    def _node_problems(self, rank: RankPlacement) -> list[str]:
        node = self.ledger.nodes[rank.node_id]
        found: list[str] = []
        for index in rank.gpus:
            found.extend(gpu_problems(node, node.gpus[index]))
        if node.cpus is not None and node.cpus_used > node.cpus + 1e-9:
            found.append(f"{node.cpus_used} CPUs in use of {node.cpus}")
        if node.memory_mb is not None and node.memory_used > node.memory_mb:
            found.append(f"{node.memory_used} MB of memory in use of {node.memory_mb}")
        return found
