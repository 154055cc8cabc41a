"""Who may do what on the bus: one broker principal per role, and the ACLs of a topic prefix.

The local stack's broker (scripts/stack.sh) authenticates every client with SASL/SCRAM and
authorizes it with the StandardAuthorizer, denying whatever no ACL allows. Its super user, the
admin, creates the topics of a prefix and grants, per prefix (tests and installations each have
their own prefix; Kafka's patterns match names by their beginning only, so the write rights are
literal topic names):

| principal | may |
|---|---|
| `gangway_relay`   | write the log's topics and the dead letters, see the prefix's topics |
| `gangway_service` | read the prefix's topics, use its consumer groups, write dead letters |
| `gangway_agent`   | what a service may, and write the telemetry topic (heartbeats, steps) |

So only the relay may produce onto an event topic; a rank, which holds no credential, may do
nothing at all. aiokafka has no ACL calls, so the two requests are written here over its
protocol structs (CreateAcls v1, DeleteAcls v1: Kafka 2.0 and later).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import (
    CreateAclsRequest_v1,
    DeleteAclsRequest_v1,
    DescribeAclsRequest,
)
from aiokafka.protocol.api import Request

from services.runtime.kafka import make_admin
from services.runtime.settings import Settings
from services.runtime.topics import Topics

ADMIN = "gangway_admin"
RELAY = "gangway_relay"
SERVICE = "gangway_service"
AGENT = "gangway_agent"
# The launcher's name for each role, and the variable holding its password (.gangway/env).
ROLES: dict[str, str] = {"relay": RELAY, "service": SERVICE, "agent": AGENT}


def password_variable(role: str) -> str:
    return f"GANGWAY_KAFKA_{role.upper()}_PASSWORD"


class _Resource(IntEnum):
    TOPIC = 2
    GROUP = 3


class _Pattern(IntEnum):
    LITERAL = 3
    PREFIXED = 4


_ANY_RESOURCE = 1
_ANY_PATTERN = 1


class _Operation(IntEnum):
    ANY = 1
    READ = 3
    WRITE = 4
    DESCRIBE = 8


_ALLOW = 3
_ANY_PERMISSION = 1


class Acl(NamedTuple):
    resource: _Resource
    name: str
    pattern: _Pattern
    principal: str
    operation: _Operation


def prefix_acls(topics: Topics) -> list[Acl]:
    """The rights of each role on the topics and consumer groups of one prefix."""
    every_topic = f"{topics.prefix}."
    acls = [
        Acl(_Resource.TOPIC, topic, _Pattern.LITERAL, RELAY, _Operation.WRITE)
        for topic in (*topics.log_topics, topics.deadletter)
    ]
    # Seeing every topic of the prefix: the relay checks that they all exist before it starts.
    acls.append(Acl(_Resource.TOPIC, every_topic, _Pattern.PREFIXED, RELAY, _Operation.DESCRIBE))
    for consumer in (SERVICE, AGENT):
        acls += [
            Acl(_Resource.TOPIC, every_topic, _Pattern.PREFIXED, consumer, _Operation.READ),
            # Every consumer group is named `<prefix>.<consumer>` (runtime/consumer.py).
            Acl(_Resource.GROUP, every_topic, _Pattern.PREFIXED, consumer, _Operation.READ),
            # The consumer loop sends what it cannot process to the dead letters.
            Acl(_Resource.TOPIC, topics.deadletter, _Pattern.LITERAL, consumer, _Operation.WRITE),
        ]
    acls.append(Acl(_Resource.TOPIC, topics.telemetry, _Pattern.LITERAL, AGENT, _Operation.WRITE))
    return acls


class _CreateAcls(Request[CreateAclsRequest_v1]):  # type: ignore[misc]  # untyped base
    API_KEY = 30

    def __init__(self, acls: Sequence[Acl]) -> None:
        self.acls = acls

    def build(self, request_struct_class: type[CreateAclsRequest_v1]) -> CreateAclsRequest_v1:
        return request_struct_class(
            [
                (a.resource, a.name, a.pattern, f"User:{a.principal}", "*", a.operation, _ALLOW)
                for a in self.acls
            ]
        )


class _DeleteAcls(Request[DeleteAclsRequest_v1]):  # type: ignore[misc]  # untyped base
    API_KEY = 31

    def __init__(self, filters: Sequence[tuple[_Resource, str, _Pattern]]) -> None:
        self.filters = filters

    def build(self, request_struct_class: type[DeleteAclsRequest_v1]) -> DeleteAclsRequest_v1:
        # None: any principal, any host; every operation and permission.
        return request_struct_class(
            [(r, n, p, None, None, _Operation.ANY, _ANY_PERMISSION) for r, n, p in self.filters]
        )


def is_admin(settings: Settings) -> bool:
    """Whether this process is the broker's super user of an authenticating broker: only it
    grants (a broker without authentication has no ACLs to grant)."""
    return settings.kafka_username == ADMIN


async def grant_prefix(settings: Settings, topics: Topics) -> None:
    """Allow each role what it needs on `topics`' prefix (idempotent: the broker keeps one
    copy of an ACL). As the admin."""
    acls = prefix_acls(topics)
    admin = make_admin(settings, client_id=f"{settings.service_name}-acl")
    await admin.start()
    try:
        response = await admin._send_request(_CreateAcls(acls))
        refused = [(code, text) for code, text in response.creation_responses if code != 0]
        if refused:
            raise RuntimeError(f"the broker refused ACLs of prefix {topics.prefix}: {refused}")
        # The broker applies new ACLs a moment after answering (they travel through its
        # metadata log): a producer started at once could still be refused.
        for _ in range(200):
            if set(acls) <= await _described(admin):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the ACLs of prefix {topics.prefix} did not take effect in 10 s")
    finally:
        await admin.close()


async def _described(admin: AIOKafkaAdminClient) -> set[Acl]:
    """The ALLOW ACLs the broker applies now."""
    request = DescribeAclsRequest(
        _ANY_RESOURCE, None, _ANY_PATTERN, None, None, _Operation.ANY, _ANY_PERMISSION
    )
    response = await admin._send_request(request)
    found: set[Acl] = set()
    for resource, name, pattern, entries in response.resources:
        for principal, _host, operation, permission in entries:
            if permission == _ALLOW and principal.startswith("User:"):
                found.add(
                    Acl(
                        _Resource(resource),
                        name,
                        _Pattern(pattern),
                        principal.removeprefix("User:"),
                        _Operation(operation),
                    )
                )
    return found


async def revoke_prefix(settings: Settings, topics: Topics) -> None:
    """Delete every ACL `grant_prefix` made for `topics`' prefix (the tests' scratch prefixes
    would otherwise pile up in the broker's metadata)."""
    filters = sorted({(a.resource, a.name, a.pattern) for a in prefix_acls(topics)})
    admin = make_admin(settings, client_id=f"{settings.service_name}-acl")
    await admin.start()
    try:
        await admin._send_request(_DeleteAcls(filters))
    finally:
        await admin.close()
