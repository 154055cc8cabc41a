"""Shared GPUs in the live state: which GPUs hold MIG geometries, slices and soft shares, folded
from the log (NodeRegistered, GpuGeometryChanged, GangReserved and the gang releases).

The scheduler state (core/state.py) keeps one `LiveSharing` beside its whole-GPU masks:
- a GPU that holds a MIG geometry, soft shares, or is being re-partitioned is out of the
  whole-GPU pool (`shared_mask`): gangs never land on it; a GPU whose last share left, or whose
  geometry went back to none, is whole again;
- the sharing ledger (core/sharing.py) holds who has which slice or share; the state keeps the
  ledger's view of whole-GPU gangs, health and schedulability in step (`sync`), so that the
  ledger's own rules (a share never lands on a GPU a gang holds; only an idle GPU is
  re-partitioned) hold in the live cycle as they do in the simulator;
- a slice or share task counts exactly what it holds: a 1g slice of an H100 1/7 of a GPU, a
  0.25 share 1/4 (`task_gpus`): quotas, fair share and the allocated count add Fractions, so
  seven 1g slices make exactly one GPU.

A rank that still runs when its gang is released keeps its slice or share until its TaskExited
(as a whole-GPU rank keeps its GPUs): two attempts never share an instance on the hardware.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from core.mig import COMPUTE_SLICES, MigInstance, mig_model
from core.sharing import FULL, SharingLedger, Spot, TaskAsk, share_memory_mb
from schemas.jobs import JobSpec, RankPlacement
from schemas.nodes import GpuGeometryChanged, NodeRegistered

# An amount of GPUs: whole GPUs count as ints (the fast, common case), slices and shares as
# exact Fractions. int + Fraction is a Fraction, so sums stay exact.
GpuAmount = int | Fraction

# The ledger's holder of a GPU bound whole to a gang (the state's masks say which gang).
WHOLE_GANG = "(gang)"

# (job id, attempt, rank): one task's hold.
RankKey = tuple[str, int, int]


def as_number(amount: GpuAmount) -> int | float:
    """An exact amount as a person (and JSON) reads it: whole numbers stay ints, a fraction is
    shown to 4 decimals (1/7 → 0.1429); the exact value is what is added up."""
    if isinstance(amount, int) or amount.denominator == 1:
        return int(amount)
    return round(float(amount), 4)


def task_gpus(spec: JobSpec) -> GpuAmount:
    """What one task of the job counts of GPUs: its whole GPUs, a slice's compute slices over 7
    (every MIG model has 7), or a share's thousandths."""
    if spec.mig_profile is not None:
        return Fraction(int(spec.mig_profile.split("g.", 1)[0]), COMPUTE_SLICES)
    if spec.gpu_fraction is not None:
        return Fraction(spec.gpu_thousandths, FULL)
    return spec.gpus_per_task


def job_gpus(spec: JobSpec, tasks: int | None = None) -> GpuAmount:
    """What the job's gang (or `tasks` of it) counts of GPUs, exactly."""
    return task_gpus(spec) * (spec.tasks if tasks is None else tasks)


def placement_gpus(placement: RankPlacement) -> GpuAmount:
    """What one recorded rank placement holds, exactly."""
    if placement.mig is not None:
        return Fraction(int(placement.mig.profile.split("g.", 1)[0]), COMPUTE_SLICES)
    if placement.share is not None:
        return Fraction(placement.share.thousandths, FULL)
    return len(placement.gpus)


def is_fractional(placement: RankPlacement) -> bool:
    return placement.mig is not None or placement.share is not None


def holder_of(job_id: str, attempt: int, rank: int) -> str:
    """The ledger's name for one task's hold (the auditor names them alike)."""
    return f"{job_id}:{attempt}:{rank}"


def ask_of_placement(placement: RankPlacement, spec: JobSpec | None, team: str) -> TaskAsk:
    cpus = (spec.cpus_per_task or 0.0) if spec is not None else 0.0
    memory = (spec.memory_mb_per_task or 0) if spec is not None else 0
    if placement.mig is not None:
        return TaskAsk(team, mig_profile=placement.mig.profile, cpus=cpus, memory_mb=memory)
    if placement.share is not None:
        return TaskAsk(
            team,
            thousandths=placement.share.thousandths,
            gpu_memory_mb=placement.share.memory_mb,
            sharing=placement.share.sharing,
            cpus=cpus,
            memory_mb=memory,
        )
    return TaskAsk(team, whole_gpus=len(placement.gpus), cpus=cpus, memory_mb=memory)


@dataclass(slots=True)
class LiveSharing:
    """The live state's sharing ledger and what it holds for whom."""

    # Indexed (core/sharing_index.py): the cycle ranks a task's spots by reading a few nodes,
    # not every GPU; whatever changes a node's GPUs here says so (`changed`).
    ledger: SharingLedger = field(default_factory=lambda: SharingLedger(indexed=True))
    # job id → its ranks' holders (rank → holder) of the current gang.
    by_job: dict[str, dict[int, str]] = field(default_factory=dict)
    # Ranks of released gangs that still run: their holds stay until they exit.
    lingering: dict[RankKey, str] = field(default_factory=dict)
    # Nodes with a GPU in MIG mode, with shares, or being re-partitioned (the only nodes the
    # cycle looks at for a free slice or a share beside an existing one).
    sharing_nodes: set[str] = field(default_factory=set)
    # The whole-GPU mask each node's ledger was last synced with (a sync that changes
    # nothing costs one comparison).
    _synced: dict[str, tuple[int, int, bool]] = field(default_factory=dict)

    # ------------------------------------------------------------- folds

    def register(self, event: NodeRegistered) -> None:
        """A node joined; a re-registration keeps what its GPUs hold (they did not change)."""
        known = self.ledger.nodes.get(event.node_id)
        if known is not None and len(known.gpus) == len(event.gpus):
            known.gpu_type = event.gpu_type
            known.model = mig_model(event.gpu_model or event.gpu_type)
            known.mig = event.mig
            known.reconfigure_s = event.reconfigure_s
            known.cpus = event.cpus
            known.memory_mb = event.memory_mb
            self.ledger.changed(event.node_id)
            return
        self.ledger.register(event)
        self._synced.pop(event.node_id, None)
        self._note(event.node_id)

    def set_geometry(self, event: GpuGeometryChanged, at: float) -> bool:
        """A re-partition recorded at `at`; False for a GPU this state does not know."""
        node = self.ledger.nodes.get(event.node_id)
        if node is None or event.gpu_index >= len(node.gpus):
            return False
        geometry = [MigInstance(i.start, i.profile) for i in event.geometry]
        self.ledger.set_geometry(event.node_id, event.gpu_index, geometry, at)
        node.gpus[event.gpu_index].busy_until = at + event.reconfigure_s
        self.ledger.changed(event.node_id)
        self._note(event.node_id)
        return True

    def bind(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        placement: RankPlacement,
        spec: JobSpec | None,
        team: str,
    ) -> None:
        node = self.ledger.nodes.get(placement.node_id)
        if node is None or not placement.gpus or placement.gpus[0] >= len(node.gpus):
            return
        ask = ask_of_placement(placement, spec, team)
        gpu = node.gpus[placement.gpus[0]]
        spot = Spot(
            placement.node_id,
            (placement.gpus[0],),
            mig=(
                None
                if placement.mig is None
                else MigInstance(placement.mig.start, placement.mig.profile)
            ),
            thousandths=ask.thousandths,
            gpu_memory_mb=(
                placement.share.memory_mb or share_memory_mb(ask, gpu)
                if placement.share is not None
                else 0
            ),
        )
        holder = holder_of(job_id, attempt, rank)
        self.ledger.release(holder)
        self.ledger.bind(holder, ask, spot)
        self.by_job.setdefault(job_id, {})[rank] = holder
        self._note(placement.node_id)

    def release(self, job_id: str, attempt: int, still_runs: set[int]) -> set[str]:
        """Release the job's holds but those of ranks still running; returns the nodes touched."""
        touched: set[str] = set()
        for rank, holder in sorted(self.by_job.pop(job_id, {}).items()):
            found = self.ledger.holders.get(holder)
            if found is None:
                continue
            node_id = found[1].node_id
            touched.add(node_id)
            if rank in still_runs:
                self.lingering[(job_id, attempt, rank)] = holder
            else:
                self.ledger.release(holder)
        for node_id in touched:
            self._note(node_id)
        return touched

    def rank_gone(self, key: RankKey) -> str | None:
        """A lingering rank exited: its hold ends. Returns its node, if it held anything."""
        holder = self.lingering.pop(key, None)
        if holder is None:
            return None
        found = self.ledger.holders.get(holder)
        self.ledger.release(holder)
        if found is None:
            return None
        self._note(found[1].node_id)
        return found[1].node_id

    def node_lost(self, node_id: str) -> None:
        """What lingered there is gone with the node."""
        for key, holder in list(self.lingering.items()):
            found = self.ledger.holders.get(holder)
            if found is not None and found[1].node_id == node_id:
                self.ledger.release(holder)
                del self.lingering[key]
        self._note(node_id)

    def sync(self, node_id: str, busy_mask: int, unhealthy_mask: int, schedulable: bool) -> None:
        """Keep the ledger's view of whole-GPU gangs (and ranks lingering on whole GPUs), GPU
        health and the node's schedulability in step with the state's masks."""
        node = self.ledger.nodes.get(node_id)
        if node is None:
            return
        seen = (busy_mask, unhealthy_mask, schedulable)
        if self._synced.get(node_id) == seen:
            return
        self._synced[node_id] = seen
        node.schedulable = schedulable
        for gpu in node.gpus:
            bit = 1 << gpu.index
            gpu.healthy = not unhealthy_mask & bit
            if gpu.slices or gpu.shares:
                continue
            gpu.whole = WHOLE_GANG if busy_mask & bit else None
        self.ledger.changed(node_id)

    # ------------------------------------------------------------- views

    def shared_mask(self, node_id: str) -> int:
        """The node's GPUs out of the whole-GPU pool: in MIG mode, holding shares or slices.

        A GPU going back to whole is in the pool at once; the cycle keeps it out of its
        snapshot until its re-partition is over (core/fractional.py), which needs no event."""
        node = self.ledger.nodes.get(node_id)
        if node is None or node_id not in self.sharing_nodes:
            return 0
        mask = 0
        for gpu in node.gpus:
            if gpu.geometry or gpu.shares or gpu.slices:
                mask |= 1 << gpu.index
        return mask

    def free_mig_gpus(self, node_ids: Iterable[str], now: float) -> Fraction:
        """The free MIG capacity of these nodes, exactly: each GPU in MIG mode counts its
        compute slices no slice holds, n/7 (an idle cut GPU 7/7). A GPU being re-partitioned
        counts what it will offer (it holds nothing, and evicting others would not make it
        serve sooner). Room on a soft-shared GPU is not counted: only its team may use it."""
        free = Fraction(0)
        nodes = self.ledger.nodes
        for node_id in node_ids:
            node = nodes.get(node_id)
            if node is None or not node.schedulable or node.model is None:
                continue
            profiles = node.model.profiles
            for gpu in node.gpus:
                if not gpu.healthy:
                    continue
                if not gpu.geometry:
                    if now < gpu.busy_until and gpu.idle:
                        free += 1  # going back to whole: out of the snapshot until then
                    continue
                held = sum(
                    profiles[i.profile].compute_slices
                    for i in gpu.geometry
                    if i.start in gpu.slices and i.profile in profiles
                )
                free += Fraction(COMPUTE_SLICES - held, COMPUTE_SLICES)
        return free

    def spots_of(self, job_id: str) -> list[Spot]:
        """Where the job's slices and shares are (its GPU each), rank by rank."""
        holders = self.by_job.get(job_id)
        if not holders:
            return []
        found = (self.ledger.holders.get(holder) for _, holder in sorted(holders.items()))
        return [held[1] for held in found if held is not None]

    def jobs_on(self, node_id: str, gpu_index: int) -> set[str]:
        """The jobs holding a slice or share of one GPU."""
        node = self.ledger.nodes.get(node_id)
        if node is None or gpu_index >= len(node.gpus):
            return set()
        gpu = node.gpus[gpu_index]
        holders = [holder for holder, _ in gpu.slices.values()] + list(gpu.shares)
        return {holder.rsplit(":", 2)[0] for holder in holders}

    def _note(self, node_id: str) -> None:
        node = self.ledger.nodes.get(node_id)
        if node is None:
            return
        if any(g.geometry or g.shares or g.slices or g.busy_until > 0 for g in node.gpus):
            self.sharing_nodes.add(node_id)
        else:
            self.sharing_nodes.discard(node_id)
