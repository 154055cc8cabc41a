"""Size bounds, one chain from the HTTP request to the Kafka fetch, each above the one before.

A request body (API) < an event's payload (event store) < a record on the bus (producer request,
broker and topic `max.message.bytes`) < a consumer's fetch. Whatever the API accepts is
therefore appendable, and whatever is appended is publishable and readable; the relay still
dead-letters what the bus refuses (a bug, or a broker configured by someone else), so that no
single event can stop the log from flowing. scripts/stack.sh configures the broker with the
same figure (tests/integration/test_bounds.py checks that they agree).
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB

# The API's cap on a request body (services/api/limits.py): 413 above it.
MAX_REQUEST_BODY_BYTES = 1 * MIB

# The largest event payload (its JSON, UTF-8) the store appends: a request's body plus what
# the API adds to it (defaults, ids, the submitter), with room to spare.
MAX_EVENT_BYTES = MAX_REQUEST_BODY_BYTES + 256 * KIB

# The largest record on the bus: an event's payload plus its envelope and headers. The broker's
# `message.max.bytes`, every topic's `max.message.bytes` and the producers' `max_request_size`.
MAX_MESSAGE_BYTES = 2 * MIB

# What a consumer fetches from one partition at a time: a whole record at the least.
MAX_FETCH_BYTES = 2 * MAX_MESSAGE_BYTES
