"""Schema evolution: upcasting old payloads, and catching breaking changes before they ship."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import Field

from schemas.base import Event
from schemas.export import breaking_changes, compare_with_exported
from schemas.registry import EventDecodeError, EventRegistry


class RackMoved(Event):
    """A v3 event whose v1 said `rack_name` and whose v2 lacked `block`."""

    type = "RackMoved"
    schema_version = 3
    rack: str
    block: str = Field(default="b00")

    @property
    def stream(self) -> str:
        return f"rack-{self.rack}"


def _registry_with_upcasters() -> EventRegistry:
    registry = EventRegistry([RackMoved])
    registry.register_upcaster("RackMoved", 1, lambda p: {"rack": p["rack_name"]})
    registry.register_upcaster("RackMoved", 2, lambda p: {**p, "block": "b-legacy"})
    return registry


def test_an_old_payload_is_upcast_through_every_version() -> None:
    event = _registry_with_upcasters().decode("RackMoved", 1, {"rack_name": "r7"})
    assert event == RackMoved(rack="r7", block="b-legacy")


def test_a_missing_upcaster_is_a_decode_error() -> None:
    registry = EventRegistry([RackMoved])
    with pytest.raises(EventDecodeError, match="no upcaster for RackMoved v1"):
        registry.decode("RackMoved", 1, {"rack_name": "r7"})


def test_a_type_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        EventRegistry([RackMoved, RackMoved])


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def test_removing_a_field_is_breaking() -> None:
    old = _schema({"a": {"type": "string"}, "b": {"type": "integer"}}, ["a"])
    new = _schema({"a": {"type": "string"}}, ["a"])
    assert breaking_changes(old, new) == ["field 'b' was removed"]


def test_changing_a_fields_type_is_breaking() -> None:
    old = _schema({"a": {"type": "string"}}, ["a"])
    new = _schema({"a": {"type": "integer"}}, ["a"])
    assert breaking_changes(old, new) == ["field 'a' changed its schema"]


def test_a_new_required_field_is_breaking() -> None:
    old = _schema({"a": {"type": "string"}}, ["a"])
    new = _schema({"a": {"type": "string"}, "b": {"type": "string"}}, ["a", "b"])
    assert breaking_changes(old, new) == ["field 'b' became required"]


def test_a_new_optional_field_is_not_breaking() -> None:
    old = _schema({"a": {"type": "string"}}, ["a"])
    new = _schema({"a": {"type": "string"}, "b": {"type": "string", "default": ""}}, ["a"])
    assert breaking_changes(old, new) == []


def test_a_new_description_is_not_breaking() -> None:
    old = _schema({"a": {"type": "string"}}, ["a"])
    new = _schema({"a": {"type": "string", "description": "why"}}, ["a"])
    assert breaking_changes(old, new) == []


def test_widening_a_bound_is_not_breaking() -> None:
    old = _schema({"a": {"type": "integer", "minimum": 1, "maximum": 64}}, ["a"])
    new = _schema({"a": {"type": "integer", "minimum": 0, "maximum": 128}}, ["a"])
    assert breaking_changes(old, new) == []


def test_narrowing_a_bound_is_breaking() -> None:
    old = _schema({"a": {"type": "integer", "minimum": 0}}, ["a"])
    new = _schema({"a": {"type": "integer", "minimum": 1}}, ["a"])
    assert breaking_changes(old, new) == ["field 'a' changed its schema"]


def test_the_exported_json_schemas_match_the_models() -> None:
    assert compare_with_exported() == []


def test_a_union_that_gains_an_alternative_is_not_breaking() -> None:
    """`checkpoint.interval_s` took a number or null; it may now also be "auto"."""
    number = {"type": "number", "exclusiveMinimum": 0}
    old = _schema({"a": {"anyOf": [number, {"type": "null"}]}}, [])
    new = _schema({"a": {"anyOf": [number, {"const": "auto"}, {"type": "null"}]}}, [])
    assert breaking_changes(old, new) == []


def test_a_union_that_loses_an_alternative_is_breaking() -> None:
    number = {"type": "number", "exclusiveMinimum": 0}
    old = _schema({"a": {"anyOf": [number, {"const": "auto"}, {"type": "null"}]}}, [])
    new = _schema({"a": {"anyOf": [number, {"type": "null"}]}}, [])
    assert breaking_changes(old, new) == ["field 'a' changed its schema"]
