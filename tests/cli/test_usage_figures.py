"""How `gangway usage` prints GPU-hours: small figures stay visible, large ones stay short."""

from __future__ import annotations

import pytest

from gangway.commands.usage import _hours


@pytest.mark.parametrize(
    ("hours", "printed"),
    [
        (0.0, "0.00"),
        (0.004, "<0.01"),
        (0.0328, "0.03"),
        (9.994, "9.99"),
        (12.34, "12.3"),
        (1234.5, "1,234.5"),
    ],
)
def test_gpu_hours_are_printed_so_a_short_job_is_not_a_zero(hours: float, printed: str) -> None:
    assert _hours(hours) == printed
