"""Whom failed token look-ups count against: remembered per host, read from the ASGI scope."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.api.auth_guard import client_key
from services.api.deps import client_of

HOSTS = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=4).map(lambda address: f"::ffff:{address}"),
    st.text(max_size=12),
    st.none(),
)


@settings(deadline=None)
@given(st.lists(HOSTS, max_size=20))
def test_a_remembered_client_key_is_the_key_computed_afresh(hosts: list[str | None]) -> None:
    for host in hosts + hosts:  # every host asked twice: the second answer is the memo's
        assert client_key(host) == client_key.__wrapped__(host)


def test_the_client_is_read_from_the_scope_as_a_request_reads_it() -> None:
    assert client_of({"type": "http", "client": ("2001:db8:1:2::7", 5000)}) == "2001:db8:1:2::/64"
    assert client_of({"type": "http", "client": ("::ffff:203.0.113.7", 1)}) == "203.0.113.7"
    assert client_of({"type": "http", "client": None}) == "unknown"
    assert client_of({"type": "http"}) == "unknown"
