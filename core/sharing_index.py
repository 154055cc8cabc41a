"""An index of a sharing ledger's free capacity, so that placement reads a few nodes instead of
every GPU of the cluster (core/sharing.py `SharingLedger.place`).

`place` ranks every spot of the cluster by a best-fit key, (free thousandths of the spot's GPU,
idle GPUs of its node, node id, GPUs, MIG start slot), drops spots that score the same as a
lower GPU of the same node, and takes the first (best fit) or scores the first `shortlist`
(FGD). The index keeps the ledger's GPUs and nodes in buckets by the first parts of that key,
computed from what changes only through the ledger (a GPU's geometry, its slices and shares, its
whole task; a node's idle GPUs):

- nodes by (GPUs idle outside MIG, idle GPUs): whole-GPU and CPU-only tasks, whose key is
  (1000, idle GPUs, node);
- GPUs outside MIG by (1000 - shared thousandths, idle GPUs of the node): shares;
- free MIG instances by (profile, free compute thousandths, idle GPUs of the node): slices.

It never decides on its own: walking the buckets in key order, it asks the ledger's own
`gpu_spots` what each node offers now (health, re-partitions under way, teams, memory, CPUs,
GPU types) and yields those spots with the very key `place` computes, in the same order and
with the same spots dropped. A key that differs from its bucket's (a ledger changed behind the
index's back) raises `StaleIndex`; the ledger then rebuilds the index and ranks without it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from core.sharing import (
    FULL,
    CheapKey,
    NodeLedger,
    Spot,
    TaskAsk,
    alike_key,
    cheap_key,
    gpu_spots,
    structural_free,
)

__all__ = ["SpotIndex", "StaleIndex"]

_NodeBucket = tuple[int, int]  # (GPUs idle outside MIG, idle GPUs)
_ShareBucket = tuple[int, int]  # (free thousandths, idle GPUs)
_MigBucket = tuple[str, int, int]  # (profile, free thousandths, idle GPUs)


class StaleIndex(Exception):
    """A spot's key is not its bucket's: the ledger changed without telling the index."""


class SpotIndex:
    """Free capacity of one ledger's nodes in buckets by the first parts of `place`'s key."""

    def __init__(self, nodes: Mapping[str, NodeLedger]) -> None:
        self._ledger_nodes = nodes
        self._nodes: dict[_NodeBucket, list[str]] = {}
        self._shares: dict[_ShareBucket, list[tuple[str, int]]] = {}
        self._migs: dict[_MigBucket, list[tuple[str, int, int]]] = {}
        # What each node put where, to take it out again when the node changes.
        self._placed: dict[
            str,
            tuple[
                _NodeBucket,
                list[tuple[_ShareBucket, tuple[str, int]]],
                list[tuple[_MigBucket, tuple[str, int, int]]],
            ],
        ] = {}
        self._share_keys: list[_ShareBucket] | None = None
        self._mig_keys: list[_MigBucket] | None = None
        # Nodes changed since the index was last read: re-bucketed when it is read next. A
        # cycle marks a released gang's GPUs in the ledger and restores them when it ends, and
        # most cycles place no slice or share: re-bucketing on every change did that work
        # twice per node for nothing (and every folded whole-GPU task did it once).
        self._dirty: set[str] = set()
        for node_id in nodes:
            self._refresh_now(node_id)

    # ------------------------------------------------------------ upkeep

    def refresh(self, node_id: str) -> None:
        """The node changed in the ledger (registered, changed or gone): it is brought up to
        date before the index is read next."""
        self._dirty.add(node_id)

    def _catch_up(self) -> None:
        dirty = self._dirty
        while dirty:
            self._refresh_now(dirty.pop())

    def _refresh_now(self, node_id: str) -> None:
        """Bring one node up to date with the ledger."""
        old = self._placed.pop(node_id, None)
        if old is not None:
            old_node, old_shares, old_migs = old
            _remove(self._nodes, old_node, node_id)
            for old_share, old_item in old_shares:
                if _remove(self._shares, old_share, old_item):
                    self._share_keys = None
            for old_mig, old_entry in old_migs:
                if _remove(self._migs, old_mig, old_entry):
                    self._mig_keys = None
        node = self._ledger_nodes.get(node_id)
        if node is None:
            return
        idle = sum(1 for gpu in node.gpus if gpu.idle)
        outside_mig = node.mig != "fixed"
        whole_free = sum(1 for gpu in node.gpus if outside_mig and gpu.idle and not gpu.geometry)
        node_bucket = (whole_free, idle)
        insort(self._nodes.setdefault(node_bucket, []), node_id)
        shares: list[tuple[_ShareBucket, tuple[str, int]]] = []
        migs: list[tuple[_MigBucket, tuple[str, int, int]]] = []
        for gpu in node.gpus:
            if gpu.whole is not None:
                continue
            free = structural_free(node, gpu)
            if gpu.geometry:
                for instance in gpu.geometry:
                    if instance.start in gpu.slices:
                        continue
                    mig_bucket = (instance.profile, free, idle)
                    entry = (node_id, gpu.index, instance.start)
                    if mig_bucket not in self._migs:
                        self._mig_keys = None
                    insort(self._migs.setdefault(mig_bucket, []), entry)
                    migs.append((mig_bucket, entry))
            elif outside_mig:
                share_bucket = (free, idle)
                item = (node_id, gpu.index)
                if share_bucket not in self._shares:
                    self._share_keys = None
                insort(self._shares.setdefault(share_bucket, []), item)
                shares.append((share_bucket, item))
        self._placed[node_id] = (node_bucket, shares, migs)

    # ------------------------------------------------------------ reading

    def ranked(self, ask: TaskAsk, now: float) -> Iterator[tuple[CheapKey, Spot]]:
        """The ask's spots in `place`'s order, without those it drops, each with its key."""
        self._catch_up()
        offers: dict[str, dict[tuple[tuple[int, ...], int], Spot]] = {}

        def offered(node_id: str) -> dict[tuple[tuple[int, ...], int], Spot]:
            found = offers.get(node_id)
            if found is None:
                node = self._ledger_nodes[node_id]
                found = offers[node_id] = {
                    (spot.gpus, spot.mig.start if spot.mig is not None else 0): spot
                    for spot in gpu_spots(node, ask, now)
                }
            return found

        kind = ask.kind
        if kind in ("whole", "cpu"):
            for idle, node_id in self._nodes_in_order(ask.whole_gpus if kind == "whole" else 0):
                for whole in offered(node_id).values():
                    yield self._checked(whole, now, (FULL, idle, node_id))
            return
        seen: set[tuple[object, ...]] = set()
        if kind == "share":
            if self._share_keys is None:
                self._share_keys = sorted(self._shares)
            for free, idle in self._share_keys:
                if free < ask.thousandths:
                    continue
                for node_id, gpu_index in self._shares[(free, idle)]:
                    share = offered(node_id).get(((gpu_index,), 0))
                    if share is not None and _first_alike(self._ledger_nodes, share, seen):
                        yield self._checked(share, now, (free, idle, node_id))
            return
        if self._mig_keys is None:
            self._mig_keys = sorted(self._migs)
        keys = self._mig_keys
        at = bisect_left(keys, (ask.mig_profile or "", -1, -1))
        while at < len(keys) and keys[at][0] == ask.mig_profile:
            profile, free, idle = keys[at]
            at += 1
            for node_id, gpu_index, start in self._migs[(profile, free, idle)]:
                spot = offered(node_id).get(((gpu_index,), start))
                if spot is not None and _first_alike(self._ledger_nodes, spot, seen):
                    yield self._checked(spot, now, (free, idle, node_id))

    def _nodes_in_order(self, at_least: int) -> Iterator[tuple[int, str]]:
        """(idle GPUs, node) of the nodes with at least `at_least` GPUs idle outside MIG, by
        idle GPUs, then node id."""
        by_idle: dict[int, list[list[str]]] = {}
        for (whole_free, idle), node_ids in self._nodes.items():
            if whole_free >= at_least:
                by_idle.setdefault(idle, []).append(node_ids)
        for idle in sorted(by_idle):
            lists = by_idle[idle]
            merged: Iterable[str] = lists[0] if len(lists) == 1 else heapq.merge(*lists)
            for node_id in merged:
                yield idle, node_id

    def _checked(
        self, spot: Spot, now: float, bucket: tuple[int, int, str]
    ) -> tuple[CheapKey, Spot]:
        key = cheap_key(self._ledger_nodes[spot.node_id], spot, now)
        if key[:3] != bucket:
            raise StaleIndex(f"{spot} ranks {key[:3]}, indexed as {bucket}")
        return key, spot


def _first_alike(
    nodes: Mapping[str, NodeLedger], spot: Spot, seen: set[tuple[object, ...]]
) -> bool:
    """Whether no lower GPU of the node scored the same (`place` keeps only the first)."""
    alike = alike_key(nodes[spot.node_id], spot)
    if alike is None:
        return True
    if alike in seen:
        return False
    seen.add(alike)
    return True


_K = TypeVar("_K")
_T = TypeVar("_T", str, tuple[str, int], tuple[str, int, int])


def _remove(buckets: dict[_K, list[_T]], bucket: _K, item: _T) -> bool:
    """Take the item out of its bucket; True when the bucket went away."""
    items = buckets[bucket]
    del items[bisect_left(items, item)]
    if items:
        return False
    del buckets[bucket]
    return True
