"""Topology-aware, best-fit gang placement on a cycle's snapshot of free GPUs.

The topology is node (one NVLink domain) ⊂ rack ⊂ block ⊂ cluster. A gang is cut into *units*:
the GPUs that must share a node (one task, or one tensor-parallel group of consecutive ranks).
Placement searches the narrowest domain first — one node, one rack, one block, then the
cluster — and inside a domain takes the fullest pieces first with a best-fit last piece, so a
gang lands on few nodes and racks while whole nodes stay free for large gangs.

`require` (node, rack, block) stops the widening at that level: the gang waits rather than
spread. `prefer` needs no code of its own: the narrowest-first search is the preference, and
without `require` the gang still widens when it must.

`find_placement` only reads; `Snapshot.commit` binds a found placement. A placement is thus a
tentative allocation that is committed whole or simply dropped.

CPUs and memory (core/host.py): a task's host ask bounds how many units a node can take, read
from the node's record less what this snapshot's trials took or gave back; a CPU-only gang is
placed on hosts alone.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager

from core.host import place_on_hosts
from core.shape import Shape, shape_of, shape_pools
from core.state import FreeCapacityWatch, NodeRecord, popcount
from core.surface import PlanningSurface

__all__ = ["Allocation", "FreeIndex", "Shape", "Snapshot", "find_placement", "shape_of"]

# (node index, units placed there)
Allocation = list[tuple[int, int]]
_NO_NODES: frozenset[int] = frozenset()


class Snapshot:
    """Free GPUs of the schedulable nodes with per-rack, per-block and per-pool aggregates.

    Only nodes with free GPUs are indexed, so building it costs what is free, not the cluster.
    `levels[pool][c]` holds the nodes with exactly `c` free GPUs: best-fit on one node is a
    walk up from the needed count. `reserved` nodes are those a head gang's reservation pins.
    """

    __slots__ = (
        "_avoid_for",
        "_avoid_units",
        "_host_journals",
        "_journals",
        "_rack_units",
        "block_free",
        "block_racks",
        "changes",
        "count",
        "free",
        "host_taken",
        "levels",
        "nodes",
        "pool_blocks",
        "pool_free",
        "rack_free",
        "rack_nodes",
        "reserved",
        "total_free",
        "unit_host",
    )

    def __init__(self, nodes: Sequence[NodeRecord], free: Mapping[int, int]) -> None:
        self.nodes = nodes
        self.free: dict[int, int] = {}
        self.count: dict[int, int] = {}
        self.levels: dict[str, list[set[int]]] = {}
        self.rack_nodes: dict[int, set[int]] = {}
        self.rack_free: dict[int, int] = {}
        self.block_racks: dict[int, set[int]] = {}
        self.block_free: dict[int, int] = {}
        self.pool_blocks: dict[str, set[int]] = {}
        self.pool_free: dict[str, int] = {}
        self.reserved: frozenset[int] = frozenset()
        self.total_free = 0
        # Counts every change of a node's free GPUs: an answer computed at the same count is
        # still true.
        self.changes = 0
        # One undo record per open trial: node index → its free mask before the trial.
        self._journals: list[dict[int, int]] = []
        # Host resources (thousandths of a CPU, MB) this snapshot's trials took from a node
        # (negative: gave back) beyond what the node's record says is bound, and their undo.
        self.host_taken: dict[int, tuple[int, int]] = {}
        self._host_journals: list[dict[int, tuple[int, int]]] = []
        # The host ask of one unit of the gang being placed (set by find_placement).
        self.unit_host: tuple[int, int] = (0, 0)
        # `rack_units` answers kept per rack (rack -> unit GPUs -> units) until a node of the
        # rack changes its free count (`_add`, `_remove`, `_set` drop the rack's entry): a
        # multi-node gang's search reads every rack with room, and a busy cycle binds hundreds
        # of gangs, each changing a few racks. `_avoid_units` holds the answers outside the
        # reserved nodes `_avoid_for` (the object itself: a new reservation starts afresh).
        self._rack_units: dict[int, dict[int, int]] = {}
        self._avoid_units: dict[int, dict[int, int]] = {}
        self._avoid_for: frozenset[int] = frozenset()
        for index in sorted(free):
            self._add(index, free[index])

    @contextmanager
    def trial(self) -> Iterator[Snapshot]:
        """Plan on this snapshot; every change made inside is undone on leaving.

        A what-if (a placement, a reservation, a set of victims) thus costs the nodes it
        touches, not a copy of the whole index. Trials nest.
        """
        undo: dict[int, int] = {}
        host_undo: dict[int, tuple[int, int]] = {}
        reserved = self.reserved
        self._journals.append(undo)
        self._host_journals.append(host_undo)
        try:
            yield self
        finally:
            self._journals.pop()
            self._host_journals.pop()
            free = self.free
            for index, mask in undo.items():
                self._set(index, mask, free.get(index, 0))
            for index, taken in host_undo.items():
                self.host_taken[index] = taken
            self.reserved = reserved

    @contextmanager
    def lasting_trial(self) -> Iterator[dict[int, int]]:
        """A trial whose changes of free GPUs outlive it: on leaving, host resources and the
        reservation are put back, free GPUs are not. It yields its journal (node index → its
        free GPUs before the trial first changed them), for the caller to bring those nodes
        back itself (`FreeIndex`: from the state, at its next snapshot)."""
        undo: dict[int, int] = {}
        host_undo: dict[int, tuple[int, int]] = {}
        reserved = self.reserved
        self._journals.append(undo)
        self._host_journals.append(host_undo)
        try:
            yield undo
        finally:
            self._journals.pop()
            self._host_journals.pop()
            for index, taken in host_undo.items():
                self.host_taken[index] = taken
            self.reserved = reserved

    @contextmanager
    def wide_trial(self) -> Iterator[Snapshot]:
        """A trial expected to touch far more nodes than the index holds: the index is copied
        on entering and put back whole on leaving, instead of undone node by node.

        The head's reservation plan releases thousands of running ranks (a 4,096-GPU head:
        ~8,400 in one cycle), each entering the index and leaving it again on undo, while a
        busy cluster's index holds a few hundred free nodes: copying those (in C) costs less
        than the undo alone. Whatever is asked inside is answered as in `trial`; nothing
        changed inside is journaled for an enclosing trial, since everything is put back.
        """
        saved = (
            dict(self.free),
            dict(self.count),
            {pool: [set(nodes) for nodes in levels] for pool, levels in self.levels.items()},
            {rack: set(nodes) for rack, nodes in self.rack_nodes.items()},
            dict(self.rack_free),
            {block: set(racks) for block, racks in self.block_racks.items()},
            dict(self.block_free),
            {pool: set(blocks) for pool, blocks in self.pool_blocks.items()},
            dict(self.pool_free),
            self.total_free,
            dict(self.host_taken),
            self.reserved,
        )
        journals, host_journals = self._journals, self._host_journals
        # Trials opened inside journal into these; the enclosing ones see no change at all.
        self._journals, self._host_journals = [], []
        # The kept rack answers hold for the index as it is now, which is put back on leaving:
        # set aside untouched, and fresh ones (emptied by the changes inside) used meanwhile.
        kept = (self._rack_units, self._avoid_units, self._avoid_for)
        self._rack_units, self._avoid_units = {}, {}
        changes = self.changes
        try:
            yield self
        finally:
            self._journals, self._host_journals = journals, host_journals
            self._rack_units, self._avoid_units, self._avoid_for = kept
            (
                self.free,
                self.count,
                self.levels,
                self.rack_nodes,
                self.rack_free,
                self.block_racks,
                self.block_free,
                self.pool_blocks,
                self.pool_free,
                self.total_free,
                self.host_taken,
                self.reserved,
            ) = saved
            if self.changes != changes:
                # Putting it back is a change too: an answer computed inside no longer holds.
                self.changes += 1

    def trial_releasing(self, ranks: int) -> AbstractContextManager[Snapshot]:
        """The cheaper trial for releasing `ranks` ranks into: undone node by node, each
        released node costs leaving the index again; a wide trial costs a copy of the nodes
        indexed, a few times cheaper per node. The answers are the same either way."""
        return self.wide_trial() if ranks > len(self.free) else self.trial()

    def _add(self, index: int, mask: int) -> None:
        if not mask:
            return
        node = self.nodes[index]
        pool = node.pool
        count = popcount(mask)
        self.free[index] = mask
        self.count[index] = count
        levels = self.levels.get(pool)
        if levels is None:
            levels = [set() for _ in range(65)]
            self.levels[pool] = levels
        levels[count].add(index)
        # A node usually joins a rack, block and pool already indexed: look before building a
        # set (`setdefault(key, set())` built and dropped three at every call, and a busy
        # cycle's trials add over 10,000 nodes).
        rack, block = node.rack_id, node.block_id
        self._rack_units.pop(rack, None)
        self._avoid_units.pop(rack, None)
        nodes = self.rack_nodes.get(rack)
        if nodes is not None:
            # Its rack is indexed, so its block and pool are too (`_remove` takes a rack out of
            # its block only with its last node, and a block out of its pool with its last
            # rack): only counts move. Most nodes a reservation plan releases join such a rack.
            nodes.add(index)
            self.rack_free[rack] += count
            self.block_free[block] += count
            self.pool_free[pool] += count
            self.total_free += count
            return
        self.rack_nodes[rack] = {index}
        self.rack_free[rack] = count
        racks = self.block_racks.get(block)
        if racks is None:
            self.block_racks[block] = {rack}
        else:
            racks.add(rack)
        self.block_free[block] = self.block_free.get(block, 0) + count
        blocks = self.pool_blocks.get(pool)
        if blocks is None:
            self.pool_blocks[pool] = {block}
        else:
            blocks.add(block)
        self.pool_free[pool] = self.pool_free.get(pool, 0) + count
        self.total_free += count

    def _remove(self, index: int) -> None:
        mask = self.free.pop(index, 0)
        if not mask:
            return
        node = self.nodes[index]
        pool = node.pool
        count = self.count.pop(index)
        self.levels[pool][count].discard(index)
        self._rack_units.pop(node.rack_id, None)
        self._avoid_units.pop(node.rack_id, None)
        rack_nodes = self.rack_nodes[node.rack_id]
        rack_nodes.discard(index)
        self.rack_free[node.rack_id] -= count
        self.block_free[node.block_id] -= count
        self.pool_free[pool] -= count
        self.total_free -= count
        if not rack_nodes:
            del self.rack_nodes[node.rack_id]
            del self.rack_free[node.rack_id]
            racks = self.block_racks[node.block_id]
            racks.discard(node.rack_id)
            if not racks:
                del self.block_racks[node.block_id]
                del self.block_free[node.block_id]
                self.pool_blocks[pool].discard(node.block_id)

    def set_free(self, index: int, mask: int) -> None:
        before = self.free.get(index, 0)
        for undo in self._journals:
            if index not in undo:
                undo[index] = before
        self._set(index, mask, before)

    def _set(self, index: int, mask: int, before: int) -> None:
        """`before`: the node's free GPUs now (the callers have read them already)."""
        self.changes += 1
        if not (before and mask):
            # A node comes into the index or leaves it (neither, when both are empty).
            if before:
                self._remove(index)
            if mask:
                self._add(index, mask)
            return
        # Free GPUs before and after: the node stays in its rack, block and pool, and only
        # its counts move (most changes in a busy cycle: a gang taking or giving back part
        # of a node; taking it out of every level and putting it back cost twice as much).
        self.free[index] = mask
        old, new = self.count[index], popcount(mask)
        if old == new:
            return
        node = self.nodes[index]
        levels = self.levels[node.pool]
        levels[old].discard(index)
        levels[new].add(index)
        self.count[index] = new
        self._rack_units.pop(node.rack_id, None)
        self._avoid_units.pop(node.rack_id, None)
        moved = new - old
        self.rack_free[node.rack_id] += moved
        self.block_free[node.block_id] += moved
        self.pool_free[node.pool] += moved
        self.total_free += moved

    def release(self, index: int, mask: int) -> None:
        """Give GPUs back (a gang leaving, for planning); only bits of a schedulable node count."""
        node = self.nodes[index]
        usable = mask & node.all_mask & ~node.unhealthy_mask
        if not node.schedulable or not usable:
            return
        # set_free inlined: a head's reservation plan releases thousands of ranks per cycle.
        before = self.free.get(index, 0)
        for undo in self._journals:
            if index not in undo:
                undo[index] = before
        self._set(index, before | usable, before)

    def usable(self, index: int, mask: int) -> int:
        """The GPUs of `mask` that `release` would give back: healthy ones of a schedulable
        node (0: none)."""
        node = self.nodes[index]
        if not node.schedulable:
            return 0
        return mask & node.all_mask & ~node.unhealthy_mask

    def release_gathered(self, gathered: dict[int, int]) -> None:
        """Give back GPUs gathered per node (node index -> GPUs, `usable` ones only, OR'ed
        into those free): the snapshot is left as by `release` of each. A reservation plan
        releases thousands of ranks, several to a node, between two tries of the head."""
        free, journals = self.free, self._journals
        # `_set` and `_add` inlined for a node of a rack already indexed (nearly all: a plan's
        # released ranks land on racks with free GPUs): the plan of a head that waits for
        # every overrunning gang releases ~8,000 nodes in one try, and the calls and attribute
        # reads cost more than the index updates themselves.
        nodes, count, levels_of = self.nodes, self.count, self.levels
        rack_nodes, rack_free, block_free = self.rack_nodes, self.rack_free, self.block_free
        pool_free, rack_units, avoid_units = self.pool_free, self._rack_units, self._avoid_units
        changes = added = 0
        for index, mask in gathered.items():
            before = free.get(index, 0)
            after = before | mask
            if after == before:
                continue
            for undo in journals:
                if index not in undo:
                    undo[index] = before
            changes += 1
            node = nodes[index]
            rack = node.rack_id
            in_rack = rack_nodes.get(rack)
            if in_rack is None:
                self._add(index, after)  # a rack (maybe block and pool) enters the index
                continue
            pool = node.pool
            new = after.bit_count()
            levels = levels_of[pool]
            if before:
                old = count[index]
                levels[old].discard(index)
                moved = new - old
            else:
                in_rack.add(index)
                moved = new
            levels[new].add(index)
            free[index] = after
            count[index] = new
            rack_units.pop(rack, None)
            avoid_units.pop(rack, None)
            rack_free[rack] += moved
            block_free[node.block_id] += moved
            pool_free[pool] += moved
            added += moved
        self.total_free += added
        self.changes += changes

    def commit(self, shape: Shape, allocation: Allocation) -> list[tuple[int, int]]:
        """Bind the allocation: one (node index, GPU mask) per rank, ranks in topology order.

        Consecutive ranks of one unit share a node, and nodes are visited rack by rack, so that
        neighbouring ranks (pipeline stages, tp groups) sit close together.
        """
        ranks: list[tuple[int, int]] = []
        ordered = sorted(
            allocation,
            key=lambda item: (self.nodes[item[0]].block_id, self.nodes[item[0]].rack_id, item[0]),
        )
        per_task = shape.gpus_per_task
        for index, units in ordered:
            mask = self.free.get(index, 0)  # a CPU-only gang may land where no GPU is free
            if shape.asks_host:
                tasks = units * shape.tasks_per_unit
                self.shift_host(index, shape.cpus_milli * tasks, shape.memory_mb * tasks)
            for _ in range(units * shape.tasks_per_unit):
                taken = take_lowest(mask, per_task)
                mask ^= taken
                ranks.append((index, taken))
            self.set_free(index, mask)
        return ranks

    # ---------------------------------------------------------------- capacity

    def node_units(self, index: int, unit_gpus: int, avoid_reserved: bool) -> int:
        if avoid_reserved and index in self.reserved:
            return 0
        units = self.count.get(index, 0) // unit_gpus
        if units and self.unit_host != (0, 0):
            units = min(units, self.host_units(index, *self.unit_host, cap=units))
        return units

    # ---------------------------------------------------------------- host resources

    def host_free(self, index: int) -> tuple[int | None, int | None]:
        """The node's free CPUs (thousandths) and memory (MB); None: not declared, not limited."""
        node = self.nodes[index]
        cpus_taken, memory_taken = self.host_taken.get(index, (0, 0))
        cpus = node.cpus_milli
        memory = node.memory_mb
        return (
            None if cpus is None else cpus - node.cpus_bound_milli - cpus_taken,
            None if memory is None else memory - node.memory_bound_mb - memory_taken,
        )

    def host_units(self, index: int, cpus_milli: int, memory_mb: int, cap: int) -> int:
        """How many asks of (CPUs, memory) the node's free host holds, at most `cap`."""
        free_cpus, free_memory = self.host_free(index)
        units = cap
        if cpus_milli and free_cpus is not None:
            units = min(units, max(0, free_cpus) // cpus_milli)
        if memory_mb and free_memory is not None:
            units = min(units, max(0, free_memory) // memory_mb)
        return units

    def shift_host(self, index: int, cpus_milli: int, memory_mb: int) -> None:
        """Take (positive) or give back (negative) host resources on a node, for planning."""
        self.changes += 1  # an answer computed before may no longer hold
        before = self.host_taken.get(index, (0, 0))
        for undo in self._host_journals:
            if index not in undo:
                undo[index] = before
        self.host_taken[index] = (before[0] + cpus_milli, before[1] + memory_mb)

    def rack_units(self, rack: int, unit_gpus: int, avoid_reserved: bool) -> int:
        """`node_units` summed over the rack's free nodes."""
        if self.unit_host != (0, 0):
            nodes = self.rack_nodes[rack]
            return sum(self.node_units(i, unit_gpus, avoid_reserved) for i in nodes)
        # No host ask: a node's units are its free count's, so the rack's answer holds until
        # one of its nodes changes count (or the reservation changes); kept till then.
        reserved = self.reserved
        if avoid_reserved and reserved:
            if self._avoid_for is not reserved:
                self._avoid_units = {}
                self._avoid_for = reserved
            memo = self._avoid_units
        else:
            memo = self._rack_units
        kept = memo.get(rack)
        if kept is None:
            kept = memo[rack] = {}
        else:
            units = kept.get(unit_gpus)
            if units is not None:
                return units
        units = kept[unit_gpus] = self.rack_units_counted(rack, unit_gpus, avoid_reserved)
        return units

    def rack_units_counted(self, rack: int, unit_gpus: int, avoid_reserved: bool) -> int:
        """`rack_units` read from the rack's nodes, none kept (the reference the kept answers
        are tested against). Read inline, not by `node_units`: a multi-node gang's search sums
        every rack with room, and a call per node was most of that search."""
        nodes = self.rack_nodes[rack]
        if self.unit_host != (0, 0):
            return sum(self.node_units(i, unit_gpus, avoid_reserved) for i in nodes)
        count = self.count
        reserved = self.reserved
        if avoid_reserved and reserved:
            return sum(count[i] // unit_gpus for i in nodes if i not in reserved)
        return sum(count[i] // unit_gpus for i in nodes)


class FreeIndex:
    """The placement index of one state's free GPUs, kept between cycles by its planner.

    Building a snapshot whole costs a Python call per node with free GPUs (about 38 ms at
    12,500 nodes), so the index is kept and only the nodes whose free GPUs changed since (the
    state tells its watchers) are brought up to date. Placement picks nodes by content, never
    by set order, so an index with a history decides as a fresh one would.

    What a cycle changes in the index (the gangs it binds, the GPUs it releases) is not undone
    when it ends: the nodes it left changed are noted and read again from the state at the
    next snapshot, with those the state says changed. A cycle that binds ~3,600 ranks changed
    ~3,600 nodes, each undone on leaving and set again from the state (which by then holds the
    binding) at the next cycle's start: two index updates per node where one comparison now
    does. `undo`: every change undone on leaving (the reference this is tested against).
    """

    __slots__ = ("_index", "_stale", "_state", "_undo", "_watch")

    def __init__(self, *, undo: bool = False) -> None:
        # The state it indexes, weakly: an index never keeps a state alive.
        self._state: weakref.ref[PlanningSurface] | None = None
        self._watch: FreeCapacityWatch | None = None
        self._index: Snapshot | None = None
        self._undo = undo
        # The nodes the last snapshot's user left changed: the index may differ from the
        # state there.
        self._stale: set[int] = set()

    @contextmanager
    def snapshot(self, state: PlanningSurface) -> Iterator[Snapshot]:
        """The state's free GPUs as a snapshot to plan on; what the caller changes is undone
        after (by the next snapshot: see the class). An error inside leaves the index to be
        rebuilt."""
        watch = self._watch
        indexed = self._state() if self._state is not None else None
        if indexed is not state or watch is None:
            if indexed is not None and watch is not None:
                indexed.unwatch_free_capacity(watch)
            self._state = weakref.ref(state)
            self._watch = watch = state.watch_free_capacity()
            self._index = None
        index = self._index
        changed = watch.changed
        if index is None or changed is None:
            index = Snapshot(state.node_records, state.free_masks)
        else:
            free, indexed_free, stale = state.free_masks, index.free, self._stale
            for node in sorted(changed | stale if stale else changed):
                mask = free.get(node, 0)
                if indexed_free.get(node, 0) != mask:
                    index.set_free(node, mask)
        self._index = None
        self._stale = set()
        watch.changed = set()
        if self._undo:
            with index.trial():
                yield index
        else:
            with index.lasting_trial() as journal:
                yield index
            # (Nodes changed only inside a nested trial were put back by it.)
            indexed_free = index.free
            self._stale = {
                node for node, before in journal.items() if indexed_free.get(node, 0) != before
            }
        self._index = index


def find_placement(snap: Snapshot, shape: Shape, avoid_reserved: bool) -> Allocation | None:
    """Where the gang fits now, as (node, units) pairs, or None. Never places a part below min."""
    if shape.cpu_only:
        return place_on_hosts(snap, shape, avoid_reserved)
    if not shape.asks_host:
        return _find(snap, shape, avoid_reserved)
    per_unit = shape.tasks_per_unit
    snap.unit_host = (shape.cpus_milli * per_unit, shape.memory_mb * per_unit)
    try:
        return _find(snap, shape, avoid_reserved)
    finally:
        snap.unit_host = (0, 0)


def _find(snap: Snapshot, shape: Shape, avoid_reserved: bool) -> Allocation | None:
    pools = shape_pools(shape, snap.pool_free)
    for pool in pools:
        if snap.pool_free.get(pool, 0) < shape.min_gpus:
            continue
        found = _place_in_pool(snap, pool, shape, shape.units, avoid_reserved)
        if found is None and shape.min_units < shape.units:
            best = _best_units(snap, pool, shape, avoid_reserved)
            if best >= shape.min_units:
                found = _place_in_pool(snap, pool, shape, min(best, shape.units), avoid_reserved)
        if found is not None:
            return found
    return None


def _best_units(snap: Snapshot, pool: str, shape: Shape, avoid: bool) -> int:
    """The most units one placement could get in the pool under the shape's locality."""
    u = shape.unit_gpus
    best = 0
    for block in sorted(snap.pool_blocks.get(pool, ())):
        block_units = 0
        for rack in snap.block_racks[block]:
            if shape.require == "node":
                for index in snap.rack_nodes[rack]:
                    best = max(best, snap.node_units(index, u, avoid))
                continue
            rack_units = snap.rack_units(rack, u, avoid)
            block_units += rack_units
            if shape.require == "rack":
                best = max(best, rack_units)
        if shape.require == "block":
            best = max(best, block_units)
        elif shape.require == "none":
            best += block_units
    return best


def _place_in_pool(
    snap: Snapshot, pool: str, shape: Shape, units: int, avoid: bool
) -> Allocation | None:
    u = shape.unit_gpus
    need = units * u
    if snap.pool_free.get(pool, 0) < need:
        return None
    levels = snap.levels.get(pool)
    if levels is None:
        return None
    # One node, best fit: the fullest node that still has room, the lowest index among equals
    # (a choice by content: a set's iteration order depends on its history).
    if need < len(levels):
        reserved = snap.reserved if avoid else _NO_NODES
        for count in range(need, len(levels)):
            level = levels[count]
            if not level:
                continue
            found = _lowest_outside(level, reserved)
            if found is None:
                continue
            best = found
            if snap.unit_host != (0, 0) and snap.node_units(best, u, False) < units:
                if reserved:
                    level = level - reserved
                # Free GPUs are not enough: the node's CPUs and memory must hold the tasks too.
                fitting = [i for i in level if snap.node_units(i, u, False) >= units]
                if not fitting:
                    continue
                best = min(fitting)
            return [(best, units)]
    if shape.require == "node" or units == 1:
        return None
    blocks = [b for b in snap.pool_blocks.get(pool, ()) if snap.block_free[b] >= u]
    # One rack, best fit among racks.
    rack_units: dict[int, int] = {}
    best_rack: tuple[int, int] | None = None
    for block in blocks:
        for rack in snap.block_racks[block]:
            if snap.rack_free[rack] < u:
                continue
            capacity = snap.rack_units(rack, u, avoid)
            rack_units[rack] = capacity
            if snap.rack_free[rack] >= need and capacity >= units:
                candidate = (capacity, rack)
                if best_rack is None or candidate < best_rack:
                    best_rack = candidate
    if best_rack is not None:
        return _fill_rack(snap, best_rack[1], units, u, avoid)
    if shape.require == "rack":
        return None
    # One block, best fit among blocks; inside it, the fullest racks first.
    block_units: dict[int, int] = {}
    best_block: tuple[int, int] | None = None
    for block in blocks:
        capacity = sum(rack_units.get(rack, 0) for rack in snap.block_racks[block])
        block_units[block] = capacity
        if capacity >= units:
            candidate = (capacity, block)
            if best_block is None or candidate < best_block:
                best_block = candidate
    if best_block is not None:
        return _fill_block(snap, best_block[1], units, u, avoid, rack_units)
    if shape.require == "block":
        return None
    # The cluster: the fullest blocks first, a best-fit last block.
    chosen = _greedy(sorted(((c, b) for b, c in block_units.items() if c), key=_fullest), units)
    if chosen is None:
        return None
    allocation: Allocation = []
    for block, take in chosen:
        part = _fill_block(snap, block, take, u, avoid, rack_units)
        if part is None:  # cannot happen: block_units counted exactly these units
            return None
        allocation.extend(part)
    return allocation


def take_lowest(mask: int, count: int) -> int:
    """The `count` lowest GPUs of `mask` (all of them when it holds fewer): what a rank bound
    there takes. Most often they lie side by side from the lowest (a whole node, or the rest
    of one): read at once then, instead of one by one (a busy cycle binds thousands of ranks
    of up to 8 GPUs each)."""
    low = mask & -mask
    run = low * ((1 << count) - 1)
    if mask & run == run:
        return run
    return take_lowest_one_by_one(mask, count)


def take_lowest_one_by_one(mask: int, count: int) -> int:
    """`take_lowest` bit by bit (the reference it is tested against)."""
    taken = 0
    for _ in range(count):
        low = mask & -mask
        taken |= low
        mask ^= low
    return taken


def _lowest_outside(level: set[int], reserved: frozenset[int]) -> int | None:
    """`min(level - reserved)`, None when that is empty. Without building the difference when
    the lowest node of the level is not reserved: a level can hold a thousand nodes (a wide
    gang's nodes freed at once), and each job placed behind the head asked for it again."""
    best = min(level)
    if best not in reserved:
        return best
    return min(level - reserved, default=None)


def _fullest(item: tuple[int, int]) -> tuple[int, int]:
    return (-item[0], item[1])


def _greedy(items: list[tuple[int, int]], need: int) -> list[tuple[int, int]] | None:
    """Take (capacity, id) pieces fullest first; the last piece is the smallest that suffices."""
    chosen: list[tuple[int, int]] = []
    remaining = need
    for position, (capacity, ident) in enumerate(items):
        if capacity >= remaining:
            last = position
            for later in range(position + 1, len(items)):
                if items[later][0] >= remaining:
                    last = later
                else:
                    break
            chosen.append((items[last][1], remaining))
            return chosen
        chosen.append((ident, capacity))
        remaining -= capacity
    return None


def _fill_block(
    snap: Snapshot, block: int, units: int, u: int, avoid: bool, rack_units: dict[int, int]
) -> Allocation | None:
    racks = sorted(
        ((rack_units.get(r, 0), r) for r in snap.block_racks[block] if rack_units.get(r, 0)),
        key=_fullest,
    )
    chosen = _greedy(racks, units)
    if chosen is None:
        return None
    allocation: Allocation = []
    for rack, take in chosen:
        part = _fill_rack(snap, rack, take, u, avoid)
        if part is None:
            return None
        allocation.extend(part)
    return allocation


def _fill_rack(snap: Snapshot, rack: int, units: int, u: int, avoid: bool) -> Allocation | None:
    nodes = sorted(
        ((c, i) for i in snap.rack_nodes[rack] if (c := snap.node_units(i, u, avoid))),
        key=_fullest,
    )
    return _greedy(nodes, units)
