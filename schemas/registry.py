"""The one registry from type name to event model, with upcasting of old payloads on read."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from schemas.base import Event
from schemas.checkpoints import CHECKPOINT_EVENTS
from schemas.jobs import JOB_EVENTS
from schemas.leadership import LEADERSHIP_EVENTS
from schemas.nodes import NODE_EVENTS
from schemas.teams import TEAM_EVENTS

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]


class EventDecodeError(ValueError):
    """A stored or received payload cannot become an event (unknown type, bad version, invalid)."""


class EventRegistry:
    def __init__(self, models: Iterable[type[Event]]) -> None:
        self._models: dict[str, type[Event]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        for model in models:
            if model.type in self._models:
                raise ValueError(f"event type {model.type!r} is registered twice")
            self._models[model.type] = model

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self._models)

    def model(self, type_name: str) -> type[Event]:
        try:
            return self._models[type_name]
        except KeyError:
            raise EventDecodeError(f"unknown event type {type_name!r}") from None

    def register_upcaster(self, type_name: str, from_version: int, upcast: Upcaster) -> None:
        """Teach the registry to read `type_name` payloads of `from_version` as version + 1."""
        model = self.model(type_name)
        if from_version >= model.schema_version:
            raise ValueError(f"{type_name} v{from_version} is not older than the current version")
        self._upcasters[(type_name, from_version)] = upcast

    def upcast(self, type_name: str, schema_version: int, payload: Payload) -> Payload:
        current = self.model(type_name).schema_version
        if schema_version > current:
            raise EventDecodeError(
                f"{type_name} v{schema_version} is newer than this code (v{current})"
            )
        for version in range(schema_version, current):
            try:
                step = self._upcasters[(type_name, version)]
            except KeyError:
                raise EventDecodeError(f"no upcaster for {type_name} v{version}") from None
            payload = step(payload)
        return payload

    def decode(self, type_name: str, schema_version: int, payload: Payload | str | bytes) -> Event:
        model = self.model(type_name)
        try:
            if schema_version == model.schema_version:
                if isinstance(payload, str | bytes):
                    return model.model_validate_json(payload)
                # model_validate's own call, without its wrapper (every consumed event).
                event: Event = model.__pydantic_validator__.validate_python(payload)
                return event
            data = json.loads(payload) if isinstance(payload, str | bytes) else payload
            if not isinstance(data, dict):
                raise EventDecodeError(f"{type_name} payload is not an object")
            return model.model_validate(self.upcast(type_name, schema_version, data))
        except ValidationError as error:
            raise EventDecodeError(f"invalid {type_name} payload: {error}") from error
        except json.JSONDecodeError as error:
            raise EventDecodeError(f"{type_name} payload is not JSON: {error}") from error


ALL_EVENTS: tuple[type[Event], ...] = (
    *JOB_EVENTS,
    *NODE_EVENTS,
    *TEAM_EVENTS,
    *CHECKPOINT_EVENTS,
    *LEADERSHIP_EVENTS,
)

REGISTRY = EventRegistry(ALL_EVENTS)
