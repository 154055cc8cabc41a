"""How `gangway usage` prints GPU-hours: small figures stay visible, large ones stay short."""

from __future__ import annotations

import argparse

import pytest

from gangway.commands.usage import _hours, add_arguments


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


@pytest.mark.parametrize("window", [["--from", "yesterday"], ["--to", "11/25/2026"]])
def test_a_window_bound_that_is_no_iso_time_is_refused_before_any_request(
    window: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # `--from yesterday` read "query.from: Input should be a valid datetime or date, input is
    # too short", the API's words for its query string.
    parser = argparse.ArgumentParser(prog="gangway usage")
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(window)
    err = capsys.readouterr().err
    assert f"argument {window[0]}: {window[1]!r} is not an ISO date or time" in err


def test_iso_dates_and_times_are_passed_on_as_written() -> None:
    parser = argparse.ArgumentParser(prog="gangway usage")
    add_arguments(parser)
    args = parser.parse_args(["--from", "2026-11-01", "--to", "2026-11-25T09:00:00Z"])
    assert (args.start, args.end) == ("2026-11-01", "2026-11-25T09:00:00Z")
