"""The gathering policy: no wait after a quiet round, a bounded one after a busy round."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.runtime.gather import GatherPolicy
from services.runtime.settings import Settings

policies = st.builds(
    GatherPolicy,
    busy_records=st.integers(min_value=1, max_value=1000),
    max_wait_s=st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)


@given(policies, st.integers(min_value=0, max_value=100_000))
def test_no_wait_after_a_quiet_round(policy: GatherPolicy, records: int) -> None:
    if records < policy.busy_records:
        assert policy.wait_after(records) == 0.0


@given(policies, st.integers(min_value=0, max_value=100_000))
def test_the_wait_is_bounded(policy: GatherPolicy, records: int) -> None:
    assert 0.0 <= policy.wait_after(records) <= policy.max_wait_s


@given(policies, st.integers(min_value=0, max_value=100_000), st.integers(0, 100_000))
def test_a_larger_round_waits_no_less(policy: GatherPolicy, records: int, more: int) -> None:
    assert policy.wait_after(records + more) >= policy.wait_after(records)


def test_the_wait_grows_from_a_quarter_to_the_bound() -> None:
    policy = GatherPolicy(busy_records=8, max_wait_s=0.004)
    assert policy.wait_after(0) == 0.0
    assert policy.wait_after(1) == 0.0
    assert policy.wait_after(7) == 0.0
    assert policy.wait_after(8) == pytest.approx(0.001)
    assert policy.wait_after(16) == pytest.approx(0.002)
    assert policy.wait_after(32) == pytest.approx(0.004)
    assert policy.wait_after(5000) == pytest.approx(0.004)


def test_a_zero_bound_never_waits() -> None:
    assert GatherPolicy(busy_records=1, max_wait_s=0.0).wait_after(10_000) == 0.0


@pytest.mark.parametrize("busy, wait", [(0, 0.004), (8, -0.001)])
def test_a_meaningless_policy_is_refused(busy: int, wait: float) -> None:
    with pytest.raises(ValueError):
        GatherPolicy(busy_records=busy, max_wait_s=wait)


def test_settings_name_the_policy() -> None:
    settings = Settings(gather_busy_records=3, gather_max_wait_s=0.01)
    assert settings.gather_policy == GatherPolicy(busy_records=3, max_wait_s=0.01)
