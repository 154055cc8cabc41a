"""What the API-facing commands share: the client, one-line errors, rich output helpers."""

from __future__ import annotations

import argparse
import codecs
import functools
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from gangway.client import ClientConfig, ClientError, GangwayClient

Run = Callable[[argparse.Namespace], int]


class InputError(Exception):
    """Bad input from the user (a missing file, an unparsable spec): exit status 2."""


def client() -> GangwayClient:
    return GangwayClient(ClientConfig.load())


# Piped output is read by scripts and people alike: wide enough that ids are never cut.
PIPE_WIDTH = 200


def console() -> Console:
    out = Console(highlight=False, soft_wrap=False)
    if not out.is_terminal:
        out = Console(highlight=False, soft_wrap=False, width=PIPE_WIDTH)
    return out


def fail(message: str, status: int = 1) -> int:
    print(f"gangway: {message}", file=sys.stderr)
    return status


def one_line_errors(run: Run) -> Run:
    """Errors become one line on stderr and a non-zero status, never a traceback."""

    @functools.wraps(run)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except InputError as error:
            return fail(str(error), 2)
        except ClientError as error:
            return fail(str(error))

    return wrapped


def when(value: str | None) -> str:
    """An ISO time from the API, shown as local wall-clock time to the second."""
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def placement(value: Mapping[str, Any]) -> str:
    if not value:
        return "-"
    return " ".join(f"{node}:{','.join(str(g) for g in gpus)}" for node, gpus in value.items())


def literal(text: str) -> Text:
    """`text` as written, for a terminal: never rich markup, and each control character (an
    escape sequence's ESC, BEL, CR…) spelled out as \\xNN. A team's command is any text but NUL,
    and whoever looks at its job (an admin looks at every team's) must not have their screen
    cleared or their terminal retitled by it."""
    return Text(_CONTROL.sub(_spelled, text))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A rank's output keeps its lines and tabs; every other control character is spelled out.
_OUTPUT_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class TerminalOutput:
    """A rank's output on its way to a terminal, chunk by chunk: UTF-8 as written, lines and
    tabs kept, every other control character (an escape sequence's ESC, BEL, CR…) and each
    byte that is not UTF-8 spelled out as \\xNN. A rank writes any bytes, and whoever reads its
    output (an admin reads every team's) must not have their screen rewritten, a line hidden
    by a carriage return, or their terminal retitled. A character split between two chunks
    is held until its end arrives."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def write(self, chunk: bytes, *, final: bool = False) -> bytes:
        text = self._decoder.decode(chunk, final)
        return _OUTPUT_CONTROL.sub(_spelled, text).encode("utf-8")


def _spelled(found: re.Match[str]) -> str:
    return f"\\x{ord(found.group()):02x}"


def at_least_one(text: str) -> int:
    """An argparse type: a count of things (a limit, redraws), 1 or more. A negative one read
    as a slice's end kept all but that many; 0 was read as 1 by paging."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a count: at least 1")
    return value


def iso_time(text: str) -> str:
    """An argparse type: an ISO date or time (`2026-11-01`, `2026-11-01T09:00Z`), passed on as
    written. `--from yesterday` read "query.from: Input should be a valid datetime or date,
    input is too short", the API's words for its query string."""
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO date or time (2026-11-01, 2026-11-01T09:00Z)"
        ) from None
    return text


def seconds_between(text: str) -> float:
    """An argparse type: a redraw's pause, positive and finite (time.sleep raises on a
    negative, NaN or infinite one after the first drawing; 0 asks the API without pause)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a pause: a positive number of seconds")
    return value


def add_redraw_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=seconds_between, default=2.0, help="seconds between redraws"
    )
    parser.add_argument(
        "-n",
        "--iterations",
        type=at_least_one,
        default=None,
        metavar="N",
        help="stop after N redraws (default: until interrupted)",
    )


def redraw(
    render: Callable[[], RenderableType],
    *,
    interval: float,
    iterations: int | None = None,
    screen: bool = False,
) -> int:
    """Draw `render()` every `interval` seconds until interrupted (or `iterations` times).

    On a terminal it is redrawn in place; piped or redirected (no terminal to redraw on, where
    rich's live view would print nothing at all), each drawing is printed as a plain snapshot
    after the last, a blank line between them, like `top -b`.
    """
    out = console()
    drawn = 0
    try:
        if not out.is_terminal:
            while True:
                out.print(render())
                out.print()
                sys.stdout.flush()
                drawn += 1
                if iterations is not None and drawn >= iterations:
                    return 0
                time.sleep(interval)
        with Live(console=out, auto_refresh=False, screen=screen) as live:
            while True:
                live.update(render(), refresh=True)
                drawn += 1
                if iterations is not None and drawn >= iterations:
                    return 0
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0
