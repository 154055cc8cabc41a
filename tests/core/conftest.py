"""Hypothesis profiles for the core's property tests.

- `ci` (the default, and whenever the CI environment variable is set): derandomized, so every
  run tests the same, pinned examples; a failure is reproducible.
- `dev` (`GANGWAY_HYPOTHESIS_PROFILE=dev`): a new random seed every run, to explore. What it
  found is settled in docs/testing.md (property tests, Open); it stays opt-in so that a run
  of `make test` is reproducible.
- `mutation` (`make mutation` sets it): derandomized, fewer examples and no shrinking, so that
  each mutant's run stays short: a mutant needs a verdict, not a minimal example.

`GANGWAY_HYPOTHESIS_PROFILE` names a profile explicitly.

Under `make mutation`, mutmut runs each mutant against the tests that reach the mutated
function, fastest first, and stops at the first failure; `pytest_collection_modifyitems` puts
the rule tests of the mutated module first, so that a killed mutant costs a few tests.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

_QUIET = [HealthCheck.too_slow]

settings.register_profile("dev", max_examples=150, deadline=None, suppress_health_check=_QUIET)
settings.register_profile(
    "ci", max_examples=150, derandomize=True, deadline=None, suppress_health_check=_QUIET
)
settings.register_profile(
    "mutation",
    max_examples=10,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    deadline=None,
    suppress_health_check=_QUIET,
)
settings.load_profile(os.environ.get("GANGWAY_HYPOTHESIS_PROFILE") or "ci")

# The test modules written rule by rule for each policy module of the core (docs/testing.md).
_RULE_TESTS = {
    "ordering": {"test_ordering_rules", "test_ordering", "test_fifo", "test_policy_rules"},
    "quota": {"test_quota_book", "test_quota", "test_policy_rules"},
    "reservation": {"test_reservation_rules", "test_backfill", "test_backfill_head"},
    "preemption": {"test_victim_rules", "test_preemption", "test_quota", "test_policy_rules"},
    "shape": {"test_shape_rules", "test_gang", "test_topology_placement"},
    "policy": {"test_policy_config", "test_policy_rules"},
}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under `make mutation`, which test killed each mutant (the first to fail: mutmut stops
    there), appended to the file GANGWAY_MUTATION_KILLS names: it shows which tests do the
    killing, and so which a mutant's run must keep."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    kills = os.environ.get("GANGWAY_MUTATION_KILLS")
    if report.failed and kills and mutant.startswith("core."):
        with open(kills, "a", encoding="utf-8") as out:
            out.write(f"{mutant} {report.nodeid}\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """While mutmut runs a mutant (`core.<module>.<function>__mutmut_<n>` in
    MUTANT_UNDER_TEST), the rule tests of its module first, each group in the order given."""
    parts = os.environ.get("MUTANT_UNDER_TEST", "").split(".")
    first = _RULE_TESTS.get(parts[1]) if len(parts) > 2 and parts[0] == "core" else None
    if first:
        items.sort(key=lambda item: item.path.stem not in first)
