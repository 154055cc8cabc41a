"""The queue-wait histogram counts each wait under the first bound at or above it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.api.projections.usage import WAIT_BUCKETS, WaitHistogram

WAITS = st.one_of(
    st.floats(min_value=-10, max_value=30 * 86400, allow_nan=False),
    st.sampled_from(WAIT_BUCKETS),  # exactly on a bound: counted under it
    st.integers(min_value=0, max_value=10 * 86400).map(float),
)


@settings(deadline=None)
@given(st.lists(WAITS, max_size=30))
def test_each_wait_lands_under_the_first_bound_at_or_above_it(waits: list[float]) -> None:
    histogram = WaitHistogram()
    expected = [0] * (len(WAIT_BUCKETS) + 1)
    for seconds in waits:
        histogram.observe(seconds)
        bounds = [i for i, bound in enumerate(WAIT_BUCKETS) if seconds <= bound]
        expected[bounds[0] if bounds else len(WAIT_BUCKETS)] += 1
    assert histogram.counts == expected
    assert histogram.count == len(waits)
