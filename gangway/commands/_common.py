"""What the API-facing commands share: the client, one-line errors, rich output helpers."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from rich.console import Console

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
