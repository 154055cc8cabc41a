"""core/queue_rules: what a queue configuration must satisfy before it is written."""

from __future__ import annotations

from core.queue_rules import Quota, quota_problem

# A tree whose top-level guarantees already pass a 128-GPU cluster (as two team creations
# checked at once wrote it before the API serialised them: attack9).
OVER = {
    "red": Quota(None, 32, 96),
    "blue": Quota(None, 32, 96),
    "g1": Quota(None, 48, 64),
    "g2": Quota(None, 48, 64),
}


def others(name: str) -> dict[str, Quota]:
    return {queue: quota for queue, quota in OVER.items() if queue != name}


def test_a_change_that_lowers_guarantees_past_the_cluster_is_allowed() -> None:
    assert quota_problem("g1", Quota(None, 0, 64), others("g1"), 128, OVER["g1"]) is None


def test_a_change_that_leaves_them_as_they_are_is_allowed() -> None:
    assert quota_problem("red", Quota(None, 32, 128), others("red"), 128, OVER["red"]) is None


def test_a_change_that_adds_to_them_is_refused() -> None:
    problem = quota_problem("g1", Quota(None, 49, 64), others("g1"), 128, OVER["g1"])
    assert problem is not None and "the cluster has 128" in problem
    new = quota_problem("g3", Quota(None, 1, 8), OVER, 128)
    assert new is not None and "the cluster has 128" in new


def test_a_tree_within_the_cluster_still_may_not_pass_it() -> None:
    fits = {"red": Quota(None, 64, 96)}
    assert quota_problem("blue", Quota(None, 64, 96), fits, 128) is None
    problem = quota_problem("blue", Quota(None, 65, 96), fits, 128)
    assert problem is not None and "guaranteed 129 GPUs" in problem
    moved = quota_problem("red", Quota(None, 65, 96), {}, 64, Quota(None, 64, 96))
    assert moved is not None and "the cluster has 64" in moved


def test_a_queue_moved_under_a_parent_lowers_them() -> None:
    # The walk up the proposed parent's chain names queues too: the current configuration is
    # still the one compared with.
    moved = Quota("red", 0, 64)
    assert quota_problem("g1", moved, others("g1"), 128, OVER["g1"]) is None
    raised = quota_problem("g1", Quota(None, 48, 64), others("g1"), 128, Quota("red", 0, 64))
    assert raised is not None and "the cluster has 128" in raised


# A subtree whose children are guaranteed more than their parent (two children's raises checked
# at once, before the API serialised changes of the tree: attack9's race, one level down).
UNDER = {
    "org": Quota(None, 4, 8),
    "a": Quota("org", 3, 8),
    "b": Quota("org", 3, 8),
}


def under(name: str) -> dict[str, Quota]:
    return {queue: quota for queue, quota in UNDER.items() if queue != name}


def test_an_oversubscribed_subtree_takes_a_change_that_lowers_or_keeps_its_guarantees() -> None:
    # Lowering a child's guarantee part of the way, or changing only its max, leaves the
    # subtree no worse: refusing them left the admin one way out, the whole repair at once.
    assert quota_problem("a", Quota("org", 2, 8), under("a"), 128, UNDER["a"]) is None
    assert quota_problem("a", Quota("org", 3, 6), under("a"), 128, UNDER["a"]) is None
    # A new queue (a team) guaranteed nothing under it adds nothing.
    assert quota_problem("c", Quota("org", 0, 8), UNDER, 128) is None


def test_an_oversubscribed_subtree_still_refuses_a_change_that_adds_to_it() -> None:
    raised = quota_problem("a", Quota("org", 4, 8), under("a"), 128, UNDER["a"])
    assert raised is not None and "would be guaranteed 7 GPUs" in raised
    new = quota_problem("c", Quota("org", 1, 8), UNDER, 128)
    assert new is not None and "would be guaranteed 7 GPUs" in new
    lowered = quota_problem("org", Quota(None, 3, 8), under("org"), 128, UNDER["org"])
    assert lowered is not None and "org itself is guaranteed 3" in lowered
    # A child moved in from elsewhere adds to it too.
    moved = quota_problem("x", Quota("org", 1, 8), UNDER, 128, Quota(None, 1, 8))
    assert moved is not None and "would be guaranteed 7 GPUs" in moved


def test_a_child_past_its_parents_max_may_lower_and_not_raise() -> None:
    tree = {"org": Quota(None, 4, 4), "a": Quota("org", 6, 8)}  # kept by the same race
    assert quota_problem("a", Quota("org", 5, 8), {"org": tree["org"]}, 128, tree["a"]) is None
    raised = quota_problem("a", Quota("org", 7, 8), {"org": tree["org"]}, 128, tree["a"])
    assert raised is not None and "would be guaranteed 7 GPUs" in raised
    tighter = quota_problem("org", Quota(None, 4, 3), {"a": tree["a"]}, 128, tree["org"])
    assert tighter is not None
