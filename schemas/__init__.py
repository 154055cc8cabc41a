"""Gangway's event contracts: every event type, defined once, shared by all services."""

from schemas.base import Event, Message
from schemas.envelope import EventEnvelope
from schemas.registry import REGISTRY, EventDecodeError, EventRegistry

__all__ = ["REGISTRY", "Event", "EventDecodeError", "EventEnvelope", "EventRegistry", "Message"]
