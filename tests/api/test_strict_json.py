"""The strict JSON reader of the API's routes (services/api/strict.py) against hostile bodies."""

from __future__ import annotations

import pytest

from services.api.problems import ProblemError
from services.api.strict import parse_strict_json


@pytest.mark.parametrize("depth", [5_000, 200_000])
def test_json_nested_past_the_readers_depth_is_a_400_not_a_500(depth: int) -> None:
    for opening, closing in ((b"[", b"]"), (b'{"a":', b"}")):
        with pytest.raises(ProblemError) as refused:
            parse_strict_json(opening * depth + b"1" + closing * depth)
        assert refused.value.status_code == 400
        assert "nested too deeply" in str(refused.value.detail)


def test_json_nested_within_reason_is_read() -> None:
    value = parse_strict_json(b"[" * 200 + b"]" * 200)
    for _ in range(199):
        [value] = value
    assert value == []


@pytest.mark.parametrize("literal", [b"1e999", b"-1E400", b"Infinity", b"NaN"])
def test_a_number_that_is_not_finite_is_a_400(literal: bytes) -> None:
    """1e999 is valid JSON that no double holds: read as infinity, it was recorded as null."""
    with pytest.raises(ProblemError) as refused:
        parse_strict_json(b'{"interval_s": ' + literal + b"}")
    assert refused.value.status_code == 400


def test_large_finite_numbers_are_read() -> None:
    assert parse_strict_json(b"[1e308, 123456789012345678901234567890, 1e-320]") == [
        1e308,
        123456789012345678901234567890,
        1e-320,
    ]
