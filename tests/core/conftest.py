"""Hypothesis profiles for the core's property tests.

- `ci` (the default, and whenever the CI environment variable is set): derandomized, so every
  run tests the same, pinned examples; a failure is reproducible.
- `dev` (`GANGWAY_HYPOTHESIS_PROFILE=dev`): a new random seed every run, to explore. What it
  found is settled in docs/testing.md (property tests, Open); it stays opt-in so that a run
  of `make test` is reproducible.
- `mutation` (`make mutation` sets it): derandomized, fewer examples and no shrinking, so that
  each mutant's run stays short: a mutant needs a verdict, not a minimal example.

`GANGWAY_HYPOTHESIS_PROFILE` names a profile explicitly.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_QUIET = [HealthCheck.too_slow]

settings.register_profile("dev", max_examples=150, deadline=None, suppress_health_check=_QUIET)
settings.register_profile(
    "ci", max_examples=150, derandomize=True, deadline=None, suppress_health_check=_QUIET
)
settings.register_profile(
    "mutation",
    max_examples=15,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    deadline=None,
    suppress_health_check=_QUIET,
)
settings.load_profile(
    os.environ.get("GANGWAY_HYPOTHESIS_PROFILE") or "ci"
)
