"""The gathering policy: no wait after a quiet round or a large one, a bounded one after a busy
round that grows with its size."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.runtime.gather import GatherPolicy
from services.runtime.settings import Settings


@st.composite
def policies(draw: st.DrawFn) -> GatherPolicy:
    busy = draw(st.integers(min_value=1, max_value=1000))
    enough = draw(st.integers(min_value=busy + 1, max_value=100_000))
    wait = draw(st.floats(min_value=0.0, max_value=1.0, allow_nan=False))
    return GatherPolicy(busy_records=busy, enough_records=enough, max_wait_s=wait)


counts = st.integers(min_value=0, max_value=200_000)


@given(policies(), counts)
def test_no_wait_after_a_quiet_round_or_a_large_one(policy: GatherPolicy, records: int) -> None:
    if records < policy.busy_records or records >= policy.enough_records:
        assert policy.wait_after(records) == 0.0


@given(policies(), counts)
def test_a_busy_round_waits_a_bounded_time(policy: GatherPolicy, records: int) -> None:
    wait = policy.wait_after(records)
    assert 0.0 <= wait <= policy.max_wait_s
    if policy.busy_records <= records < policy.enough_records and policy.max_wait_s > 0:
        assert wait >= policy.max_wait_s / 4


@given(policies(), counts, counts)
def test_a_larger_busy_round_waits_no_less(policy: GatherPolicy, records: int, more: int) -> None:
    if policy.busy_records <= records and records + more < policy.enough_records:
        assert policy.wait_after(records + more) >= policy.wait_after(records)


def test_the_wait_grows_from_a_quarter_to_the_bound() -> None:
    policy = GatherPolicy(busy_records=8, enough_records=500, max_wait_s=0.004)
    assert policy.wait_after(0) == 0.0
    assert policy.wait_after(1) == 0.0
    assert policy.wait_after(7) == 0.0
    assert policy.wait_after(8) == pytest.approx(0.001)
    assert policy.wait_after(16) == pytest.approx(0.002)
    assert policy.wait_after(32) == pytest.approx(0.004)
    assert policy.wait_after(499) == pytest.approx(0.004)
    assert policy.wait_after(500) == 0.0
    assert policy.wait_after(5000) == 0.0


def test_a_zero_bound_never_waits() -> None:
    assert GatherPolicy(busy_records=1, max_wait_s=0.0).wait_after(100) == 0.0


@pytest.mark.parametrize(
    "busy, enough, wait", [(0, 500, 0.004), (8, 500, -0.001), (8, 8, 0.004), (8, 3, 0.004)]
)
def test_a_meaningless_policy_is_refused(busy: int, enough: int, wait: float) -> None:
    with pytest.raises(ValueError):
        GatherPolicy(busy_records=busy, enough_records=enough, max_wait_s=wait)


def test_settings_name_the_policy() -> None:
    settings = Settings(gather_busy_records=3, gather_enough_records=40, gather_max_wait_s=0.01)
    assert settings.gather_policy == GatherPolicy(
        busy_records=3, enough_records=40, max_wait_s=0.01
    )
