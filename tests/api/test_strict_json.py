"""The strict JSON reader of the API's routes (services/api/strict.py) against hostile bodies."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _old_reader(body: bytes) -> object:
    """parse_strict_json as it was when it called json.loads with its hooks on every body."""
    from services.api import strict

    try:
        data = json.loads(
            body.decode("utf-8"),
            object_pairs_hook=strict._no_duplicates,
            parse_constant=strict._no_constants,
            parse_float=strict._finite,
        )
    except strict._Duplicate as duplicate:
        raise ProblemError(400, "duplicate-key", f"the key {duplicate} appears twice") from None
    except strict._NotFinite as constant:
        raise ProblemError(
            400, "malformed-json", f"{constant} is not a JSON number (numbers must be finite)"
        ) from None
    except UnicodeDecodeError:
        raise ProblemError(400, "malformed-json", "the request body is not UTF-8") from None
    strict._check_strings(data)
    return data


def _outcome(read: Callable[[bytes], object], body: bytes) -> object:
    try:
        return ("read", read(body))
    except ProblemError as problem:
        return ("problem", problem.status_code, problem.detail)
    except Exception as error:
        return ("raised", type(error), str(error))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)
BODIES = st.one_of(
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    JSON_VALUES.map(lambda value: ("\ufeff" + json.dumps(value)).encode()),
    # Raw characters rather than \u escapes: NUL, control characters, encoded surrogates.
    JSON_VALUES.map(
        lambda value: json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    ),
    st.binary(max_size=12),
    st.sampled_from(
        [
            b'{"a": 1, "a": 2}',
            b'{"a": {"b": 1, "c": 2, "b": 3}, "a": 4}',
            b'{"x": 1, "y": 2, "x": 3, "y": 4}',
            b"[NaN]",
            b'"\\u0000"',
            b'{"a\\u0000": 1}',
            b'["\\ud800"]',
            b'["\\\\u0000"]',
            b'"\x00"',
            b"\xef\xbb\xbf{}",
            b"",
            b" 1 ",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(BODIES)
def test_the_reader_built_once_reads_every_body_as_json_loads_with_the_hooks_did(
    body: bytes,
) -> None:
    assert _outcome(parse_strict_json, body) == _outcome(_old_reader, body)


def _old_no_duplicates(pairs: list[tuple[str, object]]) -> object:
    """strict._no_duplicates as it was: a dict filled key by key."""
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            return ("duplicate", key)
        found[key] = value
    return found


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3)), max_size=6))
def test_an_object_s_pairs_become_the_same_dict_or_name_the_same_first_duplicate(
    pairs: list[tuple[str, object]],
) -> None:
    from services.api import strict

    try:
        outcome: object = strict._no_duplicates(pairs)
    except strict._Duplicate as duplicate:
        outcome = ("duplicate", str(duplicate))
    assert outcome == _old_no_duplicates(pairs)


@pytest.mark.parametrize("digits", [4_301, 100_000])
def test_an_integer_past_pythons_digit_limit_is_a_400_that_says_so(digits: int) -> None:
    """Python's reader refuses such a literal with a bare ValueError (int()'s digit limit),
    which left the route's generic 'There was an error parsing the body' (attack16)."""
    with pytest.raises(ProblemError) as refused:
        parse_strict_json(b'{"tasks": ' + b"7" * digits + b"}")
    assert refused.value.status_code == 400
    assert "more than 4300 digits" in str(refused.value.detail)
