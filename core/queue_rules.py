"""What a queue configuration must satisfy before it is written.

The log is append-only: a quota tree with a cycle, a parent nobody configured or guarantees
the cluster cannot honour would stay in it forever (and every audit of invariant 4 would fail),
so the API refuses them up front. Pure: the current queues and the cluster's size come in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

MAX_DEPTH = 16


@dataclass(frozen=True, slots=True)
class Quota:
    parent: str | None
    guaranteed_gpus: int
    max_gpus: int | None


def quota_problem(
    name: str,
    proposed: Quota,
    queues: Mapping[str, Quota],
    cluster_gpus: int,
    was: Quota | None = None,
) -> str | None:
    """Why `proposed` may not become queue `name`'s configuration (None: it may).

    `queues` are the other queues; `was` is `name`'s configuration now (None: a new queue).
    `cluster_gpus` 0 means no node is known yet: guarantees are then not held to the cluster.
    Top-level guarantees already past the cluster (a log written before this rule held) refuse
    only a change that adds to them: one that lowers them must stay possible, or no queue
    could ever be configured again.
    """
    if proposed.max_gpus is not None and proposed.max_gpus < proposed.guaranteed_gpus:
        return "max_gpus must be at least guaranteed_gpus"
    after = {**queues, name: proposed}
    parent = proposed.parent
    if parent is not None:
        if parent == name:
            return f"queue {name} cannot be its own parent"
        if parent not in queues:
            return f"parent queue {parent} does not exist; configure it first"
        seen = [name]
        current: str | None = parent
        while current is not None and len(seen) <= MAX_DEPTH:
            if current in seen:
                return f"parent {parent} would make a cycle: {' -> '.join([*seen, current])}"
            seen.append(current)
            record = after.get(current)
            current = record.parent if record is not None else None
        if len(seen) > MAX_DEPTH:
            return f"queues may nest at most {MAX_DEPTH} deep"
    before = {**queues, name: was} if was is not None else dict(queues)
    for holder in (parent, name):
        problem = _children_fit(holder, after, before)
        if problem is not None:
            return problem
    if cluster_gpus > 0:
        top = sum(q.guaranteed_gpus for q in after.values() if q.parent is None)
        top_before = sum(q.guaranteed_gpus for q in before.values() if q.parent is None)
        if top > cluster_gpus and top > top_before:
            return (
                f"the top-level queues would be guaranteed {top} GPUs; "
                f"the cluster has {cluster_gpus}"
            )
    return None


def _children_fit(
    holder: str | None, queues: Mapping[str, Quota], before: Mapping[str, Quota]
) -> str | None:
    """The children of `holder` are guaranteed no more than it is, and none more than its max;
    a subtree already past either in `before` (a log written before changes of the tree were
    serialised) refuses only a change that takes it further past, as the top level does."""
    if holder is None:
        return None
    record = queues.get(holder)
    if record is None:
        return None
    children = sorted(n for n, q in queues.items() if q.parent == holder)
    if not children:
        return None
    total, over_max = _children_excess(holder, queues)
    was_total, was_over_max = _children_excess(holder, before)
    if total > 0 and total > was_total:
        return (
            f"the children of queue {holder} ({', '.join(children)}) would be guaranteed "
            f"{total + record.guaranteed_gpus} GPUs; {holder} itself is guaranteed "
            f"{record.guaranteed_gpus}"
        )
    if over_max > 0 and over_max > was_over_max:
        assert record.max_gpus is not None
        child = max(children, key=lambda c: queues[c].guaranteed_gpus)
        return (
            f"queue {child} would be guaranteed {queues[child].guaranteed_gpus} GPUs, "
            f"over the max of its parent {holder} ({record.max_gpus})"
        )
    return None


def _children_excess(holder: str, queues: Mapping[str, Quota]) -> tuple[int, int]:
    """By how many GPUs `holder`'s children's guarantees pass its own, and the most any
    child's passes its max (each <= 0: within; a holder not in `queues`: none)."""
    record = queues.get(holder)
    if record is None:
        return 0, 0
    guarantees = [q.guaranteed_gpus for q in queues.values() if q.parent == holder]
    if not guarantees:
        return 0, 0
    over_max = 0 if record.max_gpus is None else max(guarantees) - record.max_gpus
    return sum(guarantees) - record.guaranteed_gpus, over_max


def queue_owner(chain: Sequence[str], teams: Collection[str]) -> str | None:
    """The team a queue belongs to: the nearest team queue on its chain (`chain`: the queue
    and its ancestors, leaf first), None when none is. A team submits only into queues it
    owns: the admin may place a team's queue under another team's, and the parent team then
    used the child team's queue, and its guarantee, as its own."""
    return next((name for name in chain if name in teams), None)
