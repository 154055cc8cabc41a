"""The quota book's arithmetic, over plain queue records: a queue's chain of ancestors, what a
gang would take past a ceiling, and who is within a guarantee or borrowing."""

from __future__ import annotations

from core.quota import MAX_DEPTH, HostRoom, QuotaBook
from core.state import QueueRecord


def record(
    name: str,
    parent: str | None = None,
    guaranteed: int = 0,
    max_gpus: int | None = None,
    allocated: int = 0,
    configured: bool = True,
) -> QueueRecord:
    return QueueRecord(
        name=name,
        parent=parent,
        guaranteed_gpus=guaranteed,
        max_gpus=max_gpus,
        allocated=allocated,
        configured=configured,
    )


def book(*records: QueueRecord) -> QuotaBook:
    return QuotaBook({r.name: r for r in records})


def test_a_queues_chain_is_itself_then_its_ancestors_leaf_first() -> None:
    quota = book(record("org"), record("team", "org"), record("sub", "team"))

    assert quota.chain("sub") == ("sub", "team", "org")
    assert quota.chain("org") == ("org",)
    assert quota.chain("nobody") == ("nobody",)  # an unknown queue is its own chain


def test_a_parent_loop_ends_the_chain_where_it_closes() -> None:
    quota = book(record("a", "b"), record("b", "c"), record("c", "a"))

    assert quota.chain("a") == ("a", "b", "c")


def test_a_chain_is_cut_at_the_maximum_depth() -> None:
    deep = [record(f"q{i}", f"q{i + 1}") for i in range(MAX_DEPTH + 4)]

    chain = book(*deep).chain("q0")

    assert MAX_DEPTH == 16
    assert chain == tuple(f"q{i}" for i in range(MAX_DEPTH))


def test_usage_is_charged_to_the_queue_and_every_ancestor() -> None:
    quota = book(
        record("org"),
        record("a", "org", allocated=3),
        record("b", "org", allocated=5),
        record("c"),
    )

    assert quota.usage == {"a": 3, "org": 8, "b": 5}
    quota.charge("a", -3)
    assert quota.usage == {"a": 0, "org": 5, "b": 5}


def test_the_first_ceiling_on_the_chain_that_a_gang_would_exceed_is_named() -> None:
    quota = book(
        record("org", max_gpus=10, allocated=4),
        record("mid", "org"),  # no ceiling of its own: passed over
        record("team", "mid", max_gpus=8, allocated=2),
    )

    assert quota.ceiling_hit("team", 4) is None  # team 6 of 8, org 10 of 10
    assert quota.ceiling_hit("team", 5) == ("org", 10)  # team 7 of 8, org 11 of 10
    assert quota.ceiling_hit("team", 7) == ("team", 8)  # the leaf's ceiling comes first


def test_excess_says_by_how_much_each_queue_on_the_chain_would_pass_its_max() -> None:
    quota = book(
        record("org", max_gpus=10, allocated=4),
        record("mid", "org"),
        record("team", "mid", max_gpus=8, allocated=2),
    )

    assert quota.excess("team", 4) == {}  # exactly at both maxes
    assert quota.excess("team", 5) == {"org": 1}
    assert quota.excess("team", 7) == {"team": 1, "org": 3}


def test_within_guarantee_counts_the_gang_and_needs_a_configured_guarantee() -> None:
    quota = book(
        record("team", guaranteed=8, allocated=5),
        record("none", guaranteed=0),
        record("implicit", configured=False),
    )

    assert quota.within_guarantee("team", 3)  # 8 of 8
    assert not quota.within_guarantee("team", 4)  # 9 of 8
    assert not quota.within_guarantee("none", 0)
    assert not quota.within_guarantee("implicit", 1)
    assert not quota.within_guarantee("unknown", 1)
    assert quota.guarantee("team") == 8
    assert quota.guarantee("unknown") == 0


def test_borrowing_is_what_a_queue_uses_beyond_its_guarantee() -> None:
    quota = book(
        record("lender", guaranteed=8, allocated=5),
        record("borrower", guaranteed=4, allocated=7),
        record("free", allocated=2),
        record("unused"),
    )

    assert quota.borrowing("lender") == 0
    assert quota.borrowing("borrower") == 3
    assert quota.borrowing("free") == 2
    assert quota.borrowing("unused") == 0
    assert quota.borrowing("unknown") == 0


def test_a_queue_with_a_ceiling_and_nothing_running_may_fill_it_exactly() -> None:
    quota = book(record("idle", max_gpus=8))

    assert quota.ceiling_hit("idle", 8) is None
    assert quota.excess("idle", 8) == {}
    assert quota.ceiling_hit("idle", 9) == ("idle", 8)
    assert quota.excess("idle", 9) == {"idle": 1}


def test_a_guarantee_of_one_gpu_is_a_guarantee() -> None:
    quota = book(record("small", guaranteed=1))

    assert quota.within_guarantee("small", 1)
    assert not quota.within_guarantee("small", 2)


def test_the_guaranteed_queues_are_those_configured_with_at_least_one_gpu() -> None:
    quota = book(
        record("one", guaranteed=1),
        record("many", guaranteed=64),
        record("none"),
        record("unconfigured", guaranteed=8, configured=False),
    )

    assert quota.guaranteed() == {"one", "many"}


def test_host_room_names_the_queue_resource_and_ceiling_that_bound_it() -> None:
    parent = record("org")
    parent.max_memory_mb = 10_000
    child = record("team", parent="org")
    child.max_cpus_milli = 8_000
    quota = book(child, parent)

    # 4 CPUs and 1,000 MB a task: the team's 8 CPUs allow 2, the org's 10,000 MB allow 10.
    assert quota.host_room("team", 4_000, 1_000) == HostRoom(2, "team", "cpus", 8_000)
    # 4,000 MB a task: the org's memory allows 2, the team's CPUs 8; memory bounds first.
    assert quota.host_room("team", 1_000, 4_000) == HostRoom(2, "org", "memory", 10_000)
    # A task asking no memory is bounded by CPUs alone.
    assert quota.host_room("team", 1_000, 0) == HostRoom(8, "team", "cpus", 8_000)
    assert quota.host_room("org", 1_000, 0) == HostRoom(None, None, None, None)
