"""Violations of the scheduling rules reach the reports as readably as the invariants do."""

from __future__ import annotations

from core import Violation
from core.audit import RULES
from gangway.commands.audit import describe


def test_a_rule_violation_names_its_rule_in_one_line() -> None:
    violation = Violation(0, "node n0001 reported drained while job a holds it", (4, 9), "drain")

    assert str(violation) == (
        "rule drain: node n0001 reported drained while job a holds it (log positions 4, 9)"
    )


def test_an_invariant_violation_names_its_number_in_one_line() -> None:
    assert str(Violation(1, "GPU 3 bound twice", (7,))) == (
        "invariant 1: GPU 3 bound twice (log positions 7)"
    )


def test_gangway_audit_describes_rules_and_invariants() -> None:
    assert describe(Violation(0, "m", (1,), "backfill")) == ("backfill", RULES["backfill"])
    assert describe(Violation(3, "m", (1,))) == (
        "3",
        "nothing placed on a drained, lost or unhealthy node or GPU",
    )
