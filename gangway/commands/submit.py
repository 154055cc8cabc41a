"""`gangway submit FILE`: submit a job spec written in YAML or JSON ("-" reads stdin)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from gangway.client import ApiError
from gangway.commands._common import InputError, client, fail, one_line_errors

HELP = "submit a job spec (YAML or JSON file)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the job spec; - for stdin")


def load_spec(file: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as error:
        raise InputError(f"cannot read {file}: {error.strerror or error}") from error
    try:
        spec = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as error:
        raise InputError(f"{file} is neither YAML nor JSON: {error}".splitlines()[0]) from error
    if not isinstance(spec, dict):
        raise InputError(f"{file} does not hold a job spec (a mapping of fields)")
    return spec


@one_line_errors
def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.file)
    with client() as api:
        try:
            created = api.submit(spec)
        except ApiError as error:
            if error.status in (400, 422):
                return fail(f"invalid job spec: {_field_errors(error)}", 2)
            raise
    print(f"submitted job {created['id']} ({created['state']})")
    return 0


def _field_errors(error: ApiError) -> str:
    found = error.problem.get("errors") or []
    parts = []
    for item in found[:5]:
        loc = [str(part) for part in item.get("loc", []) if part != "body"]
        parts.append(f"{'.'.join(loc) or 'spec'}: {item.get('msg')}")
    return "; ".join(parts) or str(error)
