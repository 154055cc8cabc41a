"""`gangway submit FILE`: submit a job spec written in YAML or JSON ("-" reads stdin).

A file of several YAML documents (separated by `---`), or a JSON list of specs, is a small
pipeline submitted at once, all or nothing (`POST /v1/jobs:batch`): a document's
`depends_on: [{job: NAME}]` may name another document of the file by its `name` (or an
existing job by its id).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from gangway.client import ApiError
from gangway.commands._common import InputError, client, fail, one_line_errors

HELP = "submit a job spec (YAML or JSON file; several documents: a pipeline)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", help="the job spec, or several (a pipeline); - for stdin"
    )


class _SpecLoader(yaml.SafeLoader):
    """YAML read as JSON can carry it: a date or time (2026-01-01) stays the text written,
    since JSON has no type for it and no field of a spec is one. A key written twice in one
    mapping is refused, as the API refuses it in JSON: PyYAML would keep the last silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[object] = set()
            # Before the merge keys (<<) are folded in: a key that overrides a merged one is
            # YAML's way of changing it, not a second writing.
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class says what is wrong
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} appears twice", key_node.start_mark
                    )
        return super().construct_mapping(node, deep)


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


# A spec file is read no further: the API takes 1 MiB of JSON at most, and YAML's comments
# and indentation do not make a spec eight times that (`/dev/zero` or an endless pipe would
# otherwise be read until memory ran out).
MAX_FILE_BYTES = 8 * 1024 * 1024


def load_specs(file: str) -> list[dict[str, Any]]:
    """The specs of the file: one per YAML document (empty documents skipped), or each item
    of a top-level list."""
    name = "standard input" if file == "-" else file
    try:
        if file == "-":
            data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            with Path(file).open("rb") as opened:
                data = opened.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise InputError(
                f"{name} is larger than {MAX_FILE_BYTES} bytes: more than any request carries"
            )
        text = data.decode("utf-8")
    except OSError as error:
        raise InputError(f"cannot read {name}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise InputError(f"{name} is not UTF-8 text (byte {error.start})") from error
    try:
        # JSON is YAML.
        documents = [doc for doc in yaml.load_all(text, Loader=_SpecLoader) if doc is not None]
    except yaml.YAMLError as error:
        raise InputError(f"{name} is neither YAML nor JSON: {_yaml_problem(error)}") from error
    except RecursionError as error:
        raise InputError(f"{name} nests too deeply to be a job spec") from error
    if len(documents) == 1 and isinstance(documents[0], list):
        documents = documents[0]
    if not documents or not all(isinstance(doc, dict) for doc in documents):
        raise InputError(f"{name} does not hold job specs (mappings of fields)")
    budget = [_MAX_VALUES]
    for index, document in enumerate(documents):
        where = f"document {index + 1}: " if len(documents) > 1 else ""
        problem = _not_json(document, "", (), budget)
        if problem is not None:
            raise InputError(f"{name}: {where}{problem}")
    return documents


# Every value takes two bytes of JSON at least (`1,`): more than this many cannot fit in a
# request the API accepts (1 MiB), and a few lines of nested aliases can name billions.
_MAX_VALUES = 512 * 1024


def _not_json(value: object, path: str, parents: tuple[int, ...], budget: list[int]) -> str | None:
    """Why `value` (at `path`) cannot be sent as JSON, or None: a number that is not finite
    (.nan, .inf), a YAML alias inside its own anchor, a YAML type JSON lacks (!!binary …),
    more values, aliases expanded, than `budget` has left (a one-item list, spent as counted)."""
    budget[0] -= 1
    if budget[0] < 0:
        return (
            f"the file expands to more than {_MAX_VALUES} values (YAML aliases counted as "
            "written out): no request can carry it"
        )
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path or 'the spec'}: {value} is not a number the API accepts"
    if isinstance(value, dict | list):
        if id(value) in parents:
            return f"{path or 'the spec'} refers to itself (a YAML alias inside its own anchor)"
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            found = _not_json(
                item, f"{path}.{key}" if path else str(key), (*parents, id(value)), budget
            )
            if found is not None:
                return found
        return None
    if value is None or isinstance(value, str | int | float):
        return None
    return f"{path or 'the spec'}: a YAML {type(value).__name__} is not JSON"


@one_line_errors
def run(args: argparse.Namespace) -> int:
    specs = load_specs(args.file)
    with client() as api:
        try:
            created = [api.submit(specs[0])] if len(specs) == 1 else api.submit_batch(specs)["jobs"]
        except ApiError as error:
            if error.status in (400, 422):
                return fail(f"invalid job spec: {_field_errors(error)}", 2)
            raise
    for spec, job in zip(specs, created, strict=True):
        named = f" {spec.get('name')}" if len(specs) > 1 else ""
        print(f"submitted job {job['id']}{named} ({job['state']})")
        elements = job.get("array")
        if elements:
            shown = ", ".join(elements[:3]) + (" …" if len(elements) > 3 else "")
            print(f"  array of {len(elements)}: {shown}")
    return 0


def _field_errors(error: ApiError) -> str:
    found = error.problem.get("errors") or []
    parts = []
    for item in found[:5]:
        loc = [str(part) for part in item.get("loc", []) if part != "body"]
        if loc[:1] == ["jobs"] and len(loc) > 1:
            loc = [f"document {int(loc[1]) + 1}", *loc[2:]]
        parts.append(f"{'.'.join(loc) or 'spec'}: {item.get('msg')}")
    return "; ".join(parts) or error.problem.get("detail") or str(error)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """The parser's problem and where it is, in one line. The message's first line alone was
    often only its context ("while scanning for the next token"), never the tab it found nor
    the line."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        mark = error.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{error.problem}{where}"
    return str(error).splitlines()[0]
