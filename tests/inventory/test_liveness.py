"""Liveness: given heartbeats at times, who is lost and who recovered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.inventory.liveness import Liveness

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def tracker(*nodes: str, grace_s: float = 0.0) -> Liveness:
    liveness = Liveness(10.0, not_before=at(grace_s))
    for node in nodes:
        liveness.track(node, lost=False, since=T0)
    return liveness


def changes(liveness: Liveness, now: float) -> list[tuple[str, str]]:
    return [(t.node_id, t.change) for t in liveness.transitions(at(now))]


def test_a_node_heard_within_the_timeout_stays_alive() -> None:
    liveness = tracker("a")
    for second in range(0, 60, 5):
        liveness.heard("a", at(second), at(second))
        assert changes(liveness, second + 1) == []


def test_a_silent_node_is_lost_once_the_timeout_has_passed() -> None:
    liveness = tracker("a", "b")
    liveness.heard("a", at(5), at(5))
    liveness.heard("b", at(5), at(5))
    liveness.heard("b", at(14), at(14))
    assert changes(liveness, 16) == [("a", "lost")]
    assert changes(liveness, 17) == []  # declared once


def test_the_loss_carries_the_last_heartbeat_time() -> None:
    liveness = tracker("a")
    liveness.heard("a", at(3), at(3))
    [transition] = liveness.transitions(at(20))
    assert transition.last_heartbeat_at == at(3)


def test_a_lost_node_that_heartbeats_again_recovers() -> None:
    liveness = tracker("a")
    assert changes(liveness, 11) == [("a", "lost")]
    liveness.heard("a", at(12), at(12))
    assert changes(liveness, 13) == [("a", "recovered")]
    assert liveness.lost == set()


def test_a_heartbeat_older_than_the_loss_does_not_revive_the_node() -> None:
    liveness = tracker("a")
    assert changes(liveness, 11) == [("a", "lost")]
    # Replayed from the topic after a restart: sent before the node was declared lost.
    liveness.heard("a", at(9), at(30))
    assert changes(liveness, 31) == []


def test_a_heartbeat_dated_in_the_future_counts_from_its_receipt() -> None:
    liveness = tracker("a")
    liveness.heard("a", at(500), at(5))
    assert changes(liveness, 16) == [("a", "lost")]


def test_no_node_is_lost_during_the_startup_grace() -> None:
    liveness = tracker("a", grace_s=30)
    assert changes(liveness, 25) == []
    assert changes(liveness, 31) == [("a", "lost")]


def test_a_node_heard_during_the_grace_is_not_lost_after_it() -> None:
    liveness = tracker("a", grace_s=30)
    liveness.heard("a", at(28), at(28))
    assert changes(liveness, 31) == []


def test_a_node_lost_before_a_restart_stays_lost_until_heard() -> None:
    liveness = Liveness(10.0, not_before=at(10))
    liveness.track("a", lost=True, since=at(-100))
    assert changes(liveness, 50) == []
    liveness.heard("a", at(51), at(51))
    assert changes(liveness, 52) == [("a", "recovered")]


def test_a_heartbeat_from_an_unregistered_node_is_refused() -> None:
    assert tracker("a").heard("zz", at(1), at(1)) is False


# ---------------------------------------------------------------------- blindness


def fleet(count: int) -> Liveness:
    return tracker(*(f"n{i}" for i in range(count)))


def hear_all(
    liveness: Liveness, count: int, second: float, *, but: frozenset[str] | set[str] = frozenset()
) -> None:
    for i in range(count):
        if f"n{i}" not in but:
            liveness.heard(f"n{i}", at(second), at(second))


def test_no_node_is_lost_while_the_observers_own_bus_connection_is_down() -> None:
    liveness = fleet(2)
    hear_all(liveness, 2, 1)
    assert liveness.transitions(at(30), bus_connected=False) == []
    assert liveness.sight(at(30)) == "bus-down"


def test_after_the_bus_returns_a_grace_passes_before_a_silent_node_is_lost() -> None:
    liveness = fleet(2)
    hear_all(liveness, 2, 1)
    assert liveness.transitions(at(30), bus_connected=False) == []
    hear_all(liveness, 2, 31, but={"n1"})
    assert changes(liveness, 32) == []  # the bus is back; the grace starts
    assert liveness.sight(at(32)) == "grace"
    hear_all(liveness, 2, 40, but={"n1"})
    assert changes(liveness, 41) == []
    assert changes(liveness, 43) == [("n1", "lost")]  # still silent after the grace
    assert liveness.sight(at(43)) == "clear"


def test_most_of_the_fleet_silent_at_once_is_a_blind_observer_not_dead_nodes() -> None:
    liveness = fleet(10)
    hear_all(liveness, 10, 1)
    hear_all(liveness, 10, 5, but={f"n{i}" for i in range(6)})
    assert changes(liveness, 14) == []  # six of ten overdue at once
    assert liveness.sight(at(14)) == "mass-silence"
    assert liveness.silent == 6


def test_nodes_heard_again_after_a_mass_silence_are_never_lost() -> None:
    liveness = fleet(10)
    hear_all(liveness, 10, 1)
    assert changes(liveness, 20) == []
    hear_all(liveness, 10, 21)
    for second in range(21, 60, 2):
        hear_all(liveness, 10, second)
        assert changes(liveness, second + 1) == []
    assert liveness.lost == set()


def test_a_node_that_died_during_a_mass_silence_is_lost_once_the_grace_has_passed() -> None:
    liveness = fleet(10)
    hear_all(liveness, 10, 1)
    assert changes(liveness, 20) == []
    hear_all(liveness, 10, 21, but={"n9"})
    assert changes(liveness, 22) == []
    hear_all(liveness, 10, 30, but={"n9"})
    assert changes(liveness, 31) == []
    assert changes(liveness, 33) == [("n9", "lost")]


def test_a_few_silent_nodes_of_a_large_fleet_are_lost_as_usual() -> None:
    liveness = fleet(10)
    hear_all(liveness, 10, 1)
    hear_all(liveness, 10, 5, but={"n0", "n1", "n2", "n3"})
    assert sorted(changes(liveness, 14)) == [(f"n{i}", "lost") for i in range(4)]


def test_one_or_two_silent_nodes_are_lost_even_when_they_are_the_whole_fleet() -> None:
    liveness = fleet(2)
    assert sorted(changes(liveness, 11)) == [("n0", "lost"), ("n1", "lost")]
