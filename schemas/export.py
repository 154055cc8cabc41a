"""Export every event's JSON Schema into schemas/json/ and judge changes against the exported ones.

The exported file of a (type, version) is the contract for payloads of that version. A change to
a model that keeps its version must be additive: no field removed, no field's schema changed, no
new required field. Anything else needs a new schema version and an upcaster from the old one.

    python -m schemas.export           # write the current schemas
    python -m schemas.export --check   # exit 1 when the models and the exported files disagree
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schemas.registry import REGISTRY, EventRegistry

EXPORT_DIR = Path(__file__).parent / "json"

JsonSchema = dict[str, Any]


def schema_path(type_name: str, version: int, directory: Path = EXPORT_DIR) -> Path:
    return directory / f"{type_name}.v{version}.json"


def current_schemas(registry: EventRegistry = REGISTRY) -> dict[tuple[str, int], JsonSchema]:
    schemas: dict[tuple[str, int], JsonSchema] = {}
    for type_name in registry.types:
        model = registry.model(type_name)
        schema = model.model_json_schema(mode="validation")
        schema["x-event-type"] = type_name
        schema["x-schema-version"] = model.schema_version
        schemas[(type_name, model.schema_version)] = schema
    return schemas


def breaking_changes(old: JsonSchema, new: JsonSchema) -> list[str]:
    """What a reader of `old` payloads would trip over if validated by `new`."""
    problems: list[str] = []
    old_props: dict[str, Any] = old.get("properties", {})
    new_props: dict[str, Any] = new.get("properties", {})
    for name, old_prop in old_props.items():
        if name not in new_props:
            problems.append(f"field {name!r} was removed")
        elif _structure(_loosened(old_prop, new_props[name])) != _structure(new_props[name]):
            problems.append(f"field {name!r} changed its schema")
    added_required = set(new.get("required", ())) - set(old.get("required", ()))
    problems.extend(f"field {name!r} became required" for name in sorted(added_required))
    if _structure(old.get("$defs", {})) != _structure(new.get("$defs", {})):
        for name in sorted(set(old.get("$defs", {})) | set(new.get("$defs", {}))):
            if name not in new.get("$defs", {}):
                problems.append(f"definition {name!r} was removed")
            elif name in old.get("$defs", {}):
                problems.extend(
                    f"in {name}: {problem}"
                    for problem in breaking_changes(old["$defs"][name], new["$defs"][name])
                )
    return problems


# Bounds a new schema may widen: every payload the old bound let through still passes.
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems")


def _loosened(old: Any, new: Any) -> Any:
    """`old` with its numeric bounds replaced by `new`'s where `new` only widens them (a
    minimum lowered, a maximum raised): such a change breaks no reader of old payloads."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return old
    out = dict(old)
    before_any, after_any = old.get("anyOf"), new.get("anyOf")
    if isinstance(before_any, list) and isinstance(after_any, list):
        # A union that gained alternatives (a number that may now also be "auto") still lets
        # through every payload one of its old alternatives did.
        kept = [_structure(alternative) for alternative in after_any]
        if all(_structure(alternative) in kept for alternative in before_any):
            out["anyOf"] = after_any
    for key in _LOWER_BOUNDS + _UPPER_BOUNDS:
        before, after = old.get(key), new.get(key)
        if not isinstance(before, int | float) or not isinstance(after, int | float):
            continue
        if (key in _LOWER_BOUNDS and after <= before) or (key in _UPPER_BOUNDS and after >= before):
            out[key] = after
    return out


def _structure(schema: Any) -> Any:
    """The schema less what does not constrain payloads (titles, descriptions)."""
    if isinstance(schema, dict):
        return {
            key: _structure(value)
            for key, value in schema.items()
            if key not in {"title", "description"}
        }
    if isinstance(schema, list):
        return [_structure(item) for item in schema]
    return schema


def compare_with_exported(directory: Path = EXPORT_DIR) -> list[str]:
    """Every disagreement between the models and the exported files, worded for a person."""
    findings: list[str] = []
    for (type_name, version), schema in current_schemas().items():
        path = schema_path(type_name, version, directory)
        if not path.exists():
            findings.append(f"{type_name} v{version} is not exported: run python -m schemas.export")
            continue
        exported: JsonSchema = json.loads(path.read_text())
        if exported == schema:
            continue
        breaking = breaking_changes(exported, schema)
        if breaking:
            findings.append(
                f"{type_name} v{version} changed incompatibly ({'; '.join(breaking)}): "
                "raise its schema_version and register an upcaster instead"
            )
        else:
            findings.append(f"{type_name} v{version} changed: run python -m schemas.export")
    return findings


def export(directory: Path = EXPORT_DIR) -> list[Path]:
    """Write the current schemas, refusing to overwrite a version with a breaking change."""
    findings = compare_with_exported(directory)
    incompatible = [finding for finding in findings if "incompat" in finding]
    if incompatible:
        raise SystemExit("\n".join(incompatible))
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for (type_name, version), schema in current_schemas().items():
        path = schema_path(type_name, version, directory)
        text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schemas.export", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        findings = compare_with_exported()
        for finding in findings:
            print(finding, file=sys.stderr)
        return 1 if findings else 0
    for path in export():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
