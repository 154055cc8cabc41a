"""Fractional GPUs on nodes: MIG slices, soft shares (MPS, timeslice), whole GPUs, CPUs and
memory, and packing that fights fragmentation. Pure: plain data in, decisions out.

A `SharingLedger` holds, per node, what each GPU is doing: a whole-GPU task, a MIG geometry and
which of its instances are held, or soft shares (thousandths of compute, MB of memory) of one
team; and the node's CPUs and memory in use. `place` picks where one task goes; `bind` and
`release` change the ledger; `problems` lists every broken rule (the auditor's and the property
tests' oracle).

The rules (DESIGN §8):
- a GPU is whole, MIG-partitioned or soft-shared, never two at once;
- MIG slices only in instances of a valid geometry of the GPU's model, one task per instance;
  slices of different teams may share a GPU (hardware isolation);
- soft shares on one GPU sum to at most 1000 thousandths and their memory to at most the GPU's;
  at most MAX_MPS_CLIENTS_PER_GPU (48) of them are MPS shares (its MPS server's clients);
  a soft-shared GPU never hosts two teams at once (no isolation between co-tenants);
- a GPU being re-partitioned (until `busy_until`) serves nothing;
- a node's tasks never ask more CPUs or memory than it declared (undeclared: not limited).

Packing follows the fragmentation measure of the FGD paper (Weng et al., "Beware of
Fragmentation", ATC'23): a node's fragmentation for a task type is the free GPU capacity that
task type could not use there; for the recent mix of requests it is the mix-weighted sum. Each
task goes where that measure grows least (ties: the fullest fitting GPU, then the node with the
fewest idle GPUs), which keeps idle GPUs and idle nodes whole for gangs.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import islice
from typing import TYPE_CHECKING, Literal

from core.mig import Geometry, MigInstance, MigModel, geometry_problems, mig_model, pack
from schemas.jobs import JobSpec, SharingMode
from schemas.nodes import MigMode, NodeRegistered

if TYPE_CHECKING:
    from core.sharing_index import SpotIndex

FULL = 1000  # a whole GPU, in thousandths
TaskKind = Literal["whole", "mig", "share", "cpu"]
Packing = Literal["fgd", "best-fit"]


@dataclass(frozen=True, slots=True)
class TaskAsk:
    """What one task asks of one node."""

    team: str
    whole_gpus: int = 0
    mig_profile: str | None = None
    thousandths: int = 0
    gpu_memory_mb: int | None = None
    sharing: SharingMode = "mps"
    cpus: float = 0.0
    memory_mb: int = 0
    # The GPU types it may run on (alternatives); empty: any.
    gpu_types: tuple[str, ...] = ()

    @property
    def kind(self) -> TaskKind:
        if self.mig_profile is not None:
            return "mig"
        if self.thousandths:
            return "share"
        return "whole" if self.whole_gpus else "cpu"

    def mix_key(self) -> TaskAsk:
        """The task type, without whose it is: the unit of the recent mix."""
        return TaskAsk(
            "",
            self.whole_gpus,
            self.mig_profile,
            self.thousandths,
            self.gpu_memory_mb,
            self.sharing,
            self.cpus,
            self.memory_mb,
            self.gpu_types,
        )


def ask_of(spec: JobSpec) -> TaskAsk:
    """One task of the job, as the ledger sees it."""
    return TaskAsk(
        team=spec.team,
        whole_gpus=0 if spec.fractional else spec.gpus_per_task,
        mig_profile=spec.mig_profile,
        thousandths=spec.gpu_thousandths,
        gpu_memory_mb=spec.gpu_memory_mb,
        sharing=spec.sharing or "mps",
        cpus=spec.cpus_per_task or 0.0,
        memory_mb=spec.memory_mb_per_task or 0,
        gpu_types=tuple(spec.gpu_type.split("|")) if spec.gpu_type else (),
    )


# An MPS server serves at most 48 client contexts on a GPU (NVIDIA's MPS documentation, Volta
# and later); the next client's CUDA initialisation fails. Each MPS share is a rank's client, so
# a GPU takes no more MPS shares than that, whatever thousandths are left: 200 shares of 0.001
# went onto one GPU, and every rank past the 48th would have died at its start.
MAX_MPS_CLIENTS_PER_GPU = 48


@dataclass(frozen=True, slots=True)
class Share:
    team: str
    thousandths: int
    memory_mb: int
    sharing: SharingMode


@dataclass(slots=True)
class GpuLedger:
    index: int
    memory_mb: int
    geometry: Geometry = ()
    # MIG instance (by start slot) → (holder, team).
    slices: dict[int, tuple[str, str]] = field(default_factory=dict)
    shares: dict[str, Share] = field(default_factory=dict)
    whole: str | None = None
    # Re-partitioned until then (simulated or recorded time): serves nothing before.
    busy_until: float = 0.0
    geometry_changed_at: float | None = None
    healthy: bool = True

    @property
    def idle(self) -> bool:
        return not self.slices and not self.shares and self.whole is None

    @property
    def share_team(self) -> str | None:
        return next(iter(self.shares.values())).team if self.shares else None

    @property
    def shared_thousandths(self) -> int:
        return sum(share.thousandths for share in self.shares.values())

    @property
    def shared_memory_mb(self) -> int:
        return sum(share.memory_mb for share in self.shares.values())

    def takes_client(self, ask: TaskAsk) -> bool:
        """Whether the GPU's MPS server has room for one more client, if `ask` is an MPS
        share (MAX_MPS_CLIENTS_PER_GPU); any other ask is no client."""
        if ask.sharing != "mps" or len(self.shares) < MAX_MPS_CLIENTS_PER_GPU:
            return True
        return self.mps_clients() < MAX_MPS_CLIENTS_PER_GPU

    def mps_clients(self) -> int:
        """How many of the GPU's shares are MPS shares (its MPS server's clients)."""
        return sum(1 for share in self.shares.values() if share.sharing == "mps")


@dataclass(slots=True)
class NodeLedger:
    node_id: str
    gpu_type: str
    model: MigModel | None
    mig: MigMode
    reconfigure_s: float
    cpus: float | None
    memory_mb: int | None
    gpus: list[GpuLedger]
    cpus_used: float = 0.0
    memory_used: int = 0
    schedulable: bool = True

    def fits_host(self, ask: TaskAsk) -> bool:
        if self.cpus is not None and self.cpus_used + ask.cpus > self.cpus + 1e-9:
            return False
        return self.memory_mb is None or self.memory_used + ask.memory_mb <= self.memory_mb

    def of_type(self, ask: TaskAsk) -> bool:
        if not ask.gpu_types:
            return True
        names = {self.gpu_type, self.model.name if self.model is not None else ""}
        return any(name in names for name in ask.gpu_types)


@dataclass(frozen=True, slots=True)
class Spot:
    """Where one task goes: a node, its GPUs (none for a CPU-only task), and the MIG instance
    or the share it takes on its one GPU."""

    node_id: str
    gpus: tuple[int, ...] = ()
    mig: MigInstance | None = None
    thousandths: int = 0
    gpu_memory_mb: int = 0


def share_memory_mb(ask: TaskAsk, gpu: GpuLedger) -> int:
    """The GPU memory a share holds: what it asked, else its fraction of the GPU's."""
    if ask.gpu_memory_mb is not None:
        return ask.gpu_memory_mb
    return ask.thousandths * gpu.memory_mb // FULL


def free_thousandths(node: NodeLedger, gpu: GpuLedger, now: float) -> int:
    """The GPU capacity not in use, in thousandths (a MIG GPU: compute slices not held)."""
    if not gpu.healthy or not node.schedulable or now < gpu.busy_until:
        return 0
    return structural_free(node, gpu)


def structural_free(node: NodeLedger, gpu: GpuLedger) -> int:
    """`free_thousandths` of a GPU that is healthy, schedulable and not being re-partitioned
    (only such GPUs offer spots)."""
    if gpu.whole is not None:
        return 0
    if gpu.geometry and node.model is not None:
        held = 0
        for instance in gpu.geometry:
            if instance.start in gpu.slices:
                held += node.model.profiles[instance.profile].compute_slices
        return (7 - held) * FULL // 7
    return FULL - gpu.shared_thousandths


def _whole_free(node: NodeLedger, gpu: GpuLedger, now: float) -> bool:
    return (
        gpu.healthy
        and node.schedulable
        and now >= gpu.busy_until
        and gpu.idle
        and not gpu.geometry
        and node.mig != "fixed"
    )


def gpu_spots(node: NodeLedger, ask: TaskAsk, now: float) -> Iterator[Spot]:
    """Every place on the node the task could go now (whole tasks: one, the lowest GPUs)."""
    if not node.schedulable or not node.of_type(ask) or not node.fits_host(ask):
        return
    kind = ask.kind
    if kind == "cpu":
        yield Spot(node.node_id)
        return
    if kind == "whole":
        free = [gpu.index for gpu in node.gpus if _whole_free(node, gpu, now)]
        if len(free) >= ask.whole_gpus:
            yield Spot(node.node_id, tuple(free[: ask.whole_gpus]))
        return
    for gpu in node.gpus:
        if not gpu.healthy or now < gpu.busy_until or gpu.whole is not None:
            continue
        if kind == "mig":
            for instance in gpu.geometry:
                if instance.profile == ask.mig_profile and instance.start not in gpu.slices:
                    yield Spot(node.node_id, (gpu.index,), mig=instance)
            continue
        # A share: a GPU outside MIG, free enough, of no other team.
        if gpu.geometry or node.mig == "fixed":
            continue
        if gpu.shares and gpu.share_team != ask.team:
            continue
        if gpu.shared_thousandths + ask.thousandths > FULL or not gpu.takes_client(ask):
            continue
        memory = share_memory_mb(ask, gpu)
        if gpu.shared_memory_mb + memory > gpu.memory_mb:
            continue
        yield Spot(node.node_id, (gpu.index,), thousandths=ask.thousandths, gpu_memory_mb=memory)


# place()'s best-fit rank of a spot: the fullest GPU first, then the node with the fewest
# idle GPUs, then node id, GPUs and MIG start slot.
CheapKey = tuple[int, int, str, tuple[int, ...], int]


def cheap_key(node: NodeLedger, spot: Spot, now: float) -> CheapKey:
    gpu = node.gpus[spot.gpus[0]] if spot.gpus else None
    gpu_free = free_thousandths(node, gpu, now) if gpu is not None else FULL
    idle = sum(1 for g in node.gpus if g.idle)
    start = spot.mig.start if spot.mig is not None else 0
    return (gpu_free, idle, spot.node_id, spot.gpus, start)


def alike_key(node: NodeLedger, spot: Spot) -> tuple[object, ...] | None:
    """What makes a slice or share spot score the same as another on the node (None: a spot
    on no GPU): place() keeps the first, the lowest GPU, of spots alike."""
    if not spot.gpus:
        return None
    gpu = node.gpus[spot.gpus[0]]
    return (
        spot.node_id,
        spot.mig,
        gpu.geometry,
        frozenset(gpu.slices),
        gpu.shared_thousandths,
        gpu.shared_memory_mb,
        # Whether one more MPS share fills its MPS server (`takes_client`): a GPU so filled
        # loses its free thousandths to MPS shares, one with room for a client does not.
        len(gpu.shares) + 1 >= MAX_MPS_CLIENTS_PER_GPU and gpu.mps_clients(),
    )


def _gpu_usable_by(node: NodeLedger, gpu: GpuLedger, ask: TaskAsk, now: float) -> bool:
    """Whether the GPU's free capacity could serve the task type (teams aside: the measure
    is about shapes)."""
    kind = ask.kind
    if kind == "whole":
        return _whole_free(node, gpu, now)
    if kind == "mig":
        if any(i.profile == ask.mig_profile and i.start not in gpu.slices for i in gpu.geometry):
            return True
        # An idle GPU of a dynamic node can be re-partitioned for it.
        return node.mig == "dynamic" and gpu.idle and now >= gpu.busy_until
    if kind == "share":
        return (
            not gpu.geometry
            and node.mig != "fixed"
            and gpu.whole is None
            and free_thousandths(node, gpu, now) >= ask.thousandths
            and gpu.takes_client(ask)
        )
    return False


def node_fragmentation(node: NodeLedger, mix: Sequence[tuple[TaskAsk, float]], now: float) -> float:
    """FGD: the expected free GPU capacity (thousandths) the mix's task types cannot use."""
    free = [free_thousandths(node, gpu, now) for gpu in node.gpus]
    total_free = sum(free)
    if total_free == 0 or not mix:
        return 0.0
    weight_sum = sum(weight for _, weight in mix)
    expected = 0.0
    for ask, weight in mix:
        if ask.kind == "cpu":
            continue  # a CPU-only task uses no GPU capacity, so leaves none unusable
        if not node.of_type(ask) or not node.fits_host(ask):
            lost = total_free
        elif ask.kind == "whole":
            whole = sum(1 for gpu in node.gpus if _whole_free(node, gpu, now))
            lost = total_free if whole < ask.whole_gpus else total_free - whole * FULL
        else:
            lost = sum(
                f
                for gpu, f in zip(node.gpus, free, strict=True)
                if f and not _gpu_usable_by(node, gpu, ask, now)
            )
        expected += weight * lost
    return expected / weight_sum


def fragmentation_key(node: NodeLedger, now: float) -> tuple[object, ...]:
    """All that `node_fragmentation` reads of a node at `now`: nodes with equal keys measure
    the same for any mix."""
    return (
        node.gpu_type,
        node.model.name if node.model is not None else None,
        node.mig,
        node.schedulable,
        node.cpus,
        node.memory_mb,
        node.cpus_used,
        node.memory_used,
        tuple(
            (
                gpu.healthy,
                now < gpu.busy_until,
                gpu.whole is not None,
                gpu.geometry,
                frozenset(gpu.slices),
                len(gpu.shares),
                # Whether it takes another MPS share (`takes_client`): as many shares, some
                # time-sliced, may leave it room for one.
                len(gpu.shares) >= MAX_MPS_CLIENTS_PER_GPU and gpu.mps_clients(),
                gpu.shared_thousandths,
            )
            for gpu in node.gpus
        ),
    )


class RecentMix:
    """The task types of the last `size` requests, with their frequencies: the workload FGD
    measures fragmentation against."""

    def __init__(self, size: int = 256) -> None:
        self._window: deque[TaskAsk] = deque(maxlen=size)
        self._counts: Counter[TaskAsk] = Counter()

    def note(self, ask: TaskAsk) -> None:
        key = ask.mix_key()
        if len(self._window) == self._window.maxlen:
            old = self._window[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._window.append(key)
        self._counts[key] += 1

    def weights(self) -> list[tuple[TaskAsk, float]]:
        return [(ask, float(count)) for ask, count in self._counts.items()]


class SharingLedger:
    """What every GPU, CPU and MB of the cluster is doing, task by task.

    `indexed=True` keeps a free-capacity index (core/sharing_index.py): placement then reads
    a few nodes instead of every GPU, with the same decisions. The ledger's own changes keep
    it up to date; whoever changes a node's GPUs directly says so with `changed(node_id)`.
    """

    def __init__(self, *, indexed: bool = False) -> None:
        self.nodes: dict[str, NodeLedger] = {}
        # holder → (ask, spot), to release it.
        self.holders: dict[str, tuple[TaskAsk, Spot]] = {}
        # The task types of the slices and shares held now, with their counts: the mix the
        # live cycle measures fragmentation against (folded from the same binds and releases
        # as the ledger, so a restarted scheduler measures the same).
        self.held_mix: Counter[TaskAsk] = Counter()
        self._index: SpotIndex | None = None
        if indexed:
            self.reindex()

    def reindex(self) -> None:
        """Build the free-capacity index whole (after changes it was not told of)."""
        from core.sharing_index import SpotIndex

        self._index = SpotIndex(self.nodes)

    def changed(self, node_id: str) -> None:
        """The node's GPUs changed (a geometry, a slice, a share, a whole task): re-index it."""
        if self._index is not None:
            self._index.refresh(node_id)

    # ------------------------------------------------------------- inventory

    def register(self, event: NodeRegistered) -> None:
        model = mig_model(event.gpu_model or event.gpu_type)
        geometry: Geometry = ()
        if event.mig == "fixed" and model is not None:
            geometry = pack(model, event.mig_profiles) or ()
        self.nodes[event.node_id] = NodeLedger(
            node_id=event.node_id,
            gpu_type=event.gpu_type,
            model=model,
            mig=event.mig,
            reconfigure_s=event.reconfigure_s,
            cpus=event.cpus,
            memory_mb=event.memory_mb,
            gpus=[
                GpuLedger(index=gpu.index, memory_mb=gpu.memory_mb, geometry=geometry)
                for gpu in sorted(event.gpus, key=lambda g: g.index)
            ],
        )
        self.changed(event.node_id)

    def set_geometry(
        self, node_id: str, gpu_index: int, geometry: Iterable[MigInstance], now: float
    ) -> None:
        """A re-partition of an idle GPU: the new geometry serves from now + reconfigure_s."""
        node = self.nodes[node_id]
        gpu = node.gpus[gpu_index]
        gpu.geometry = tuple(sorted(geometry))
        gpu.busy_until = now + node.reconfigure_s
        gpu.geometry_changed_at = now
        self.changed(node_id)

    # ------------------------------------------------------------- placement

    def spots(self, ask: TaskAsk, now: float) -> Iterator[Spot]:
        for node in self.nodes.values():
            yield from gpu_spots(node, ask, now)

    def place(
        self,
        ask: TaskAsk,
        now: float,
        mix: Sequence[tuple[TaskAsk, float]] = (),
        *,
        packing: Packing = "fgd",
        shortlist: int = 64,
    ) -> Spot | None:
        """Where the task goes now, or None if it fits nowhere.

        `best-fit`: the fullest fitting GPU, then the node with the fewest idle GPUs (the
        baseline the FGD paper compares with). `fgd`: among the `shortlist` best-fit spots,
        where the fragmentation of the mix grows least (ties: best-fit order)."""
        weights = list(mix) or [(ask.mix_key(), 1.0)]
        # A cheap best-fit key for every distinct spot; FGD then scores the `shortlist` best
        # (the measure costs a pass over a node's GPUs per task type of the mix).
        cheap = self._ranked(ask, now, 1 if packing != "fgd" else shortlist)
        if not cheap:
            return None
        if packing != "fgd":
            return cheap[0][1]
        return self.least_fragmenting(ask, [spot for _, spot in cheap[:shortlist]], weights, now)

    def least_fragmenting(
        self,
        ask: TaskAsk,
        spots: Sequence[Spot],
        mix: Sequence[tuple[TaskAsk, float]],
        now: float,
    ) -> Spot | None:
        """FGD's choice among `spots` (in best-fit order): where the fragmentation of the mix
        grows least; ties go to the earlier spot."""
        best: tuple[tuple[float, int], Spot] | None = None
        before: dict[str, float] = {}
        # Nodes in the same state fragment alike: with many spots (place's shortlist of 64 on
        # a large cluster, most of its nodes alike) each state is measured once; a short list
        # measures directly (keying a node's state costs about as much as measuring it).
        measured: dict[tuple[object, ...], float] | None = {} if len(spots) > 16 else None

        def fragmentation(node: NodeLedger) -> float:
            if measured is None:
                return node_fragmentation(node, mix, now)
            key = fragmentation_key(node, now)
            value = measured.get(key)
            if value is None:
                value = measured[key] = node_fragmentation(node, mix, now)
            return value

        for order, spot in enumerate(spots):
            node = self.nodes[spot.node_id]
            if len(spot.gpus) == 1:
                # One GPU changes: only its part of the measure (and the node's) is measured.
                growth = self._one_gpu_growth(node, ask, spot, mix, now)
            else:
                if spot.node_id not in before:
                    before[spot.node_id] = fragmentation(node)
                self._take(node, ask, spot, "?")
                growth = fragmentation(node) - before[spot.node_id]
                self._give_back(node, ask, spot, "?")
            if best is None or (growth, order) < best[0]:
                best = ((growth, order), spot)
        return None if best is None else best[1]

    def _one_gpu_growth(
        self,
        node: NodeLedger,
        ask: TaskAsk,
        spot: Spot,
        mix: Sequence[tuple[TaskAsk, float]],
        now: float,
    ) -> float:
        """`node_fragmentation` after taking `spot` less before, for a spot on one GPU: the
        other GPUs' parts of a per-GPU sum do not change, so only this GPU's and the node's
        totals are read (the same value, in a fraction of the time; a test compares them)."""
        gpu = node.gpus[spot.gpus[0]]

        def facts() -> tuple[int, int, int, list[bool], list[bool]]:
            free_here = free_thousandths(node, gpu, now)
            total = sum(free_thousandths(node, g, now) for g in node.gpus)
            whole = sum(1 for g in node.gpus if _whole_free(node, g, now))
            hosts = [node.fits_host(t) for t, _ in mix]
            usable = [
                t.kind in ("mig", "share") and _gpu_usable_by(node, gpu, t, now) for t, _ in mix
            ]
            return free_here, total, whole, hosts, usable

        was = facts()
        self._take(node, ask, spot, "?")
        try:
            now_is = facts()
            # A type whose per-GPU sum must be read whole: its node stops (or starts) hosting it.
            full_after = [
                node_fragmentation(node, [entry], now) if was[3][i] != now_is[3][i] else 0.0
                for i, entry in enumerate(mix)
            ]
        finally:
            self._give_back(node, ask, spot, "?")
        full_before = [
            node_fragmentation(node, [entry], now) if was[3][i] != now_is[3][i] else 0.0
            for i, entry in enumerate(mix)
        ]
        weight_sum = sum(weight for _, weight in mix)
        growth = 0.0
        for i, (task, weight) in enumerate(mix):
            kind = task.kind
            if kind == "cpu":
                continue
            if was[3][i] != now_is[3][i]:
                growth += weight * (full_after[i] - full_before[i])
                continue
            if not node.of_type(task) or not was[3][i]:
                lost_before, lost_after = float(was[1]), float(now_is[1])
            elif kind == "whole":
                lost_before = float(was[1] if was[2] < task.whole_gpus else was[1] - was[2] * FULL)
                lost_after = float(
                    now_is[1] if now_is[2] < task.whole_gpus else now_is[1] - now_is[2] * FULL
                )
            else:
                lost_before = float(was[0] if was[0] and not was[4][i] else 0)
                lost_after = float(now_is[0] if now_is[0] and not now_is[4][i] else 0)
            growth += weight * (lost_after - lost_before)
        return growth / weight_sum if weight_sum else 0.0

    def mix_with(self, ask: TaskAsk, types: int = 16) -> list[tuple[TaskAsk, float]]:
        """The held slices' and shares' mix (its `types` most common task types) with the
        ask's own type: what a live placement measures fragmentation against."""
        key = ask.mix_key()
        weights = [(held, float(count)) for held, count in self.held_mix.most_common(types)]
        if all(held != key for held, _ in weights):
            weights.append((key, 1.0))
        return weights

    def ranked(self, ask: TaskAsk, now: float) -> Iterator[tuple[CheapKey, Spot]]:
        """The ask's spots in `place`'s best-fit order, each with its key, read lazily: with
        the index, a caller that stops early reads only the nodes it needed."""
        if self._index is None:
            yield from self._ranked(ask, now, len(self.nodes) * 64 + 1)
            return
        from core.sharing_index import StaleIndex

        given: set[Spot] = set()
        try:
            for key, spot in self._index.ranked(ask, now):
                given.add(spot)
                yield key, spot
            return
        except StaleIndex:
            self.reindex()
        # A ledger changed behind the index's back: the plain ranking, past what was given.
        index, self._index = self._index, None
        try:
            rest = self._ranked(ask, now, len(self.nodes) * 64 + 1)
        finally:
            self._index = index
        for key, spot in rest:
            if spot not in given:
                yield key, spot

    def _ranked(self, ask: TaskAsk, now: float, first: int) -> list[tuple[CheapKey, Spot]]:
        """The `first` spots of the ask by `cheap_key`, one for GPUs of a node alike."""
        if self._index is not None:
            from core.sharing_index import StaleIndex

            try:
                return list(islice(self._index.ranked(ask, now), first))
            except StaleIndex:
                self.reindex()
        cheap: list[tuple[CheapKey, Spot]] = []
        seen: set[tuple[object, ...]] = set()
        for spot in self.spots(ask, now):
            node = self.nodes[spot.node_id]
            alike = alike_key(node, spot) if ask.kind in ("mig", "share") else None
            if alike is not None:
                # GPUs of one node in the same state score the same: the lowest stands for them.
                if alike in seen:
                    continue
                seen.add(alike)
            cheap.append((cheap_key(node, spot, now), spot))
        cheap.sort(key=lambda item: item[0])
        return cheap[:first]

    def bind(self, holder: str, ask: TaskAsk, spot: Spot) -> None:
        if holder in self.holders:
            raise ValueError(f"{holder} is already placed")
        self._take(self.nodes[spot.node_id], ask, spot, holder)
        self.holders[holder] = (ask, spot)
        if ask.kind in ("mig", "share"):
            self.held_mix[ask.mix_key()] += 1
        self.changed(spot.node_id)

    def release(self, holder: str) -> None:
        """Idempotent: releasing what holds nothing changes nothing."""
        found = self.holders.pop(holder, None)
        if found is not None:
            ask, spot = found
            if ask.kind in ("mig", "share"):
                key = ask.mix_key()
                self.held_mix[key] -= 1
                if self.held_mix[key] <= 0:
                    del self.held_mix[key]
            node = self.nodes.get(spot.node_id)
            if node is not None:
                self._give_back(node, ask, spot, holder)
                self.changed(spot.node_id)

    def _take(self, node: NodeLedger, ask: TaskAsk, spot: Spot, holder: str) -> None:
        node.cpus_used += ask.cpus
        node.memory_used += ask.memory_mb
        kind = ask.kind
        for index in spot.gpus:
            gpu = node.gpus[index]
            if kind == "whole":
                gpu.whole = holder
            elif kind == "mig" and spot.mig is not None:
                gpu.slices[spot.mig.start] = (holder, ask.team)
            elif kind == "share":
                gpu.shares[holder] = Share(
                    ask.team, ask.thousandths, spot.gpu_memory_mb, ask.sharing
                )

    def _give_back(self, node: NodeLedger, ask: TaskAsk, spot: Spot, holder: str) -> None:
        node.cpus_used -= ask.cpus
        node.memory_used -= ask.memory_mb
        if abs(node.cpus_used) < 1e-9:
            node.cpus_used = 0.0
        for index in spot.gpus:
            gpu = node.gpus[index]
            if gpu.whole == holder:
                gpu.whole = None
            if spot.mig is not None and gpu.slices.get(spot.mig.start, ("",))[0] == holder:
                del gpu.slices[spot.mig.start]
            gpu.shares.pop(holder, None)

    # ------------------------------------------------------------- measures

    def fragmentation(self, mix: Sequence[tuple[TaskAsk, float]], now: float) -> float:
        """The cluster's fragmentation: the share of free GPU capacity the mix cannot use."""
        free = 0
        lost = 0.0
        for node in self.nodes.values():
            free += sum(free_thousandths(node, gpu, now) for gpu in node.gpus)
            lost += node_fragmentation(node, mix, now)
        return 0.0 if free == 0 else lost / free

    def allocated_gpus(self) -> Fraction:
        """GPU capacity held by tasks, exactly: a whole GPU 1, a 1g slice of an H100 1/7, a
        quarter share 1/4 (what quotas, fair share and showback count)."""
        total = Fraction(0)
        for ask, spot in self.holders.values():
            total += held_gpus(self.nodes[spot.node_id], ask, spot)
        return total

    def capacity_thousandths(self) -> int:
        return FULL * sum(len(node.gpus) for node in self.nodes.values())

    # ------------------------------------------------------------- invariants

    def problems(self) -> list[str]:
        """Every broken rule of the module docstring, worded for a person (empty: none)."""
        found: list[str] = []
        for node in self.nodes.values():
            where = node.node_id
            if node.cpus is not None and node.cpus_used > node.cpus + 1e-9:
                found.append(f"{where}: {node.cpus_used} CPUs in use of {node.cpus}")
            if node.memory_mb is not None and node.memory_used > node.memory_mb:
                found.append(f"{where}: {node.memory_used} MB in use of {node.memory_mb}")
            for gpu in node.gpus:
                found.extend(gpu_problems(node, gpu))
        return found


def gpu_problems(node: NodeLedger, gpu: GpuLedger) -> list[str]:
    where = f"{node.node_id} GPU {gpu.index}"
    found: list[str] = []
    modes = sum((gpu.whole is not None, bool(gpu.slices), bool(gpu.shares)))
    if modes > 1:
        found.append(f"{where}: is whole, sliced and shared at once ({modes} of them)")
    if gpu.geometry:
        if node.model is None:
            found.append(f"{where}: a MIG geometry on a GPU without MIG")
        else:
            found.extend(f"{where}: {p}" for p in geometry_problems(node.model, gpu.geometry))
        if gpu.shares or gpu.whole is not None:
            found.append(f"{where}: in MIG mode, yet holds a whole task or shares")
    starts = {instance.start for instance in gpu.geometry}
    for start in gpu.slices:
        if start not in starts:
            found.append(f"{where}: a slice at slot {start} outside its geometry")
    if gpu.shared_thousandths > FULL:
        found.append(f"{where}: shares sum to {gpu.shared_thousandths}/1000")
    if gpu.shared_memory_mb > gpu.memory_mb:
        found.append(f"{where}: shares hold {gpu.shared_memory_mb} MB of {gpu.memory_mb}")
    if len(gpu.shares) > MAX_MPS_CLIENTS_PER_GPU and gpu.mps_clients() > MAX_MPS_CLIENTS_PER_GPU:
        found.append(
            f"{where}: {gpu.mps_clients()} MPS shares, past its MPS server's "
            f"{MAX_MPS_CLIENTS_PER_GPU} clients"
        )
    teams = {share.team for share in gpu.shares.values()}
    if len(teams) > 1:
        found.append(f"{where}: soft-shared by teams {', '.join(sorted(teams))}")
    return found


def held_gpus(node: NodeLedger, ask: TaskAsk, spot: Spot) -> Fraction:
    """What one placed task counts of GPUs, exactly."""
    if spot.mig is not None and node.model is not None:
        return Fraction(node.model.profiles[spot.mig.profile].compute_slices, 7)
    if ask.kind == "share":
        return Fraction(ask.thousandths, FULL)
    return Fraction(len(spot.gpus)) if ask.kind == "whole" else Fraction(0)


def slice_fraction(model: MigModel, profile: str) -> tuple[Fraction, Fraction]:
    """(compute, memory) one slice counts of its GPU, exactly: a 1g.10gb of an H100 counts
    1/7 of its compute and 10/80 of its memory (the profile's nominal GB over the model's)."""
    entry = model.profiles[profile]
    nominal_gb = int(profile.split("g.")[1].split("gb")[0])
    total_gb = int(model.name.rsplit("-", 1)[1].removesuffix("GB"))
    return Fraction(entry.compute_slices, 7), Fraction(nominal_gb, total_gb)


def mix_of(asks: Iterable[TaskAsk]) -> list[tuple[TaskAsk, float]]:
    counts = Counter(ask.mix_key() for ask in asks)
    return [(ask, float(count)) for ask, count in counts.items()]
