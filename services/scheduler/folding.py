"""The scheduler's memory as folded from the log, and the one way events enter it.

`Folded` is the core state plus what the service needs besides: the log position it covers and
each stream's version as last folded (the expected versions of the scheduler's appends). Events
enter only through `fold_raw` / `fold_envelopes`, strictly one position after another, so that
live state, a replay and snapshot + tail all fold the same events in the same order.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from core.policy import SchedulingPolicy
from core.state import SchedulerState
from schemas import REGISTRY, Event, EventEnvelope, EventRegistry
from services.runtime.records import RawEvent


class LogGap(RuntimeError):
    """An event arrived that does not follow the last folded position: folding it would make
    this state differ from a replay's, so the follower must re-read from its position."""


_DECODERS: weakref.WeakKeyDictionary[EventRegistry, dict[tuple[str, int], Callable[[str], Event]]]
_DECODERS = weakref.WeakKeyDictionary()


def _decoders(registry: EventRegistry) -> dict[tuple[str, int], Callable[[str], Event]]:
    """Per (type, current schema version), the model's JSON validator itself: the registry's
    decode does the same, plus a lookup and checks that cost more than the validation of the
    small events that make up most of a log (measured: a tenth of a 1M-event replay)."""
    found = _DECODERS.get(registry)
    if found is None:
        found = {}
        for type_name in registry.types:
            model = registry.model(type_name)
            found[(type_name, model.schema_version)] = model.__pydantic_validator__.validate_json
        _DECODERS[registry] = found
    return found


@dataclass
class Folded:
    state: SchedulerState
    position: int = 0
    versions: dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, policy: SchedulingPolicy) -> Folded:
        return cls(SchedulerState(policy))

    def fold_raw(
        self,
        batch: Sequence[RawEvent],
        registry: EventRegistry = REGISTRY,
        decoded: Mapping[int, EventEnvelope] | None = None,
    ) -> int:
        """Fold stored events (payload still JSON), the hot path of replay; returns the count.

        Only the payload is validated (`model_validate_json`); the envelope is never built.
        An event found in `decoded` (by position, with the same event id: the scheduler's own
        decisions, just appended) is folded as the event it holds, not decoded again, as
        `fold_envelopes` folds it when nothing came between.
        """
        apply = self.state.apply
        versions = self.versions
        position = self.position
        decoders = _decoders(registry)
        try:
            for raw in batch:
                if raw.position != position + 1:
                    raise LogGap(f"expected position {position + 1}, got {raw.position}")
                known = None if decoded is None else decoded.get(raw.position)
                if known is not None and known.event_id == raw.event_id:
                    event = known.payload
                else:
                    decoder = decoders.get((raw.type, raw.schema_version))
                    try:
                        if decoder is None:
                            raise LookupError(raw.type)
                        event = decoder(raw.payload)
                    except (LookupError, ValueError):
                        # Old schema versions (upcast first), unknown types, invalid payloads:
                        # the registry's own path, which raises the precise EventDecodeError.
                        event = registry.decode(raw.type, raw.schema_version, raw.payload)
                apply(event, raw.recorded_at.timestamp())
                versions[raw.stream] = raw.version
                position = raw.position
        finally:
            # Whatever stops the batch (an event this code cannot decode), the position
            # names exactly what has been folded.
            self.position = position
        return len(batch)

    def fold_envelopes(self, envelopes: Iterable[EventEnvelope]) -> int:
        """Fold events already decoded (those the scheduler has just appended)."""
        count = 0
        for envelope in envelopes:
            if envelope.position != self.position + 1:
                raise LogGap(f"expected position {self.position + 1}, got {envelope.position}")
            self.state.apply(envelope.payload, envelope.recorded_at.timestamp())
            self.versions[envelope.stream] = envelope.version
            self.position = envelope.position
            count += 1
        return count

    def stream_version(self, stream: str) -> int:
        return self.versions.get(stream, 0)
