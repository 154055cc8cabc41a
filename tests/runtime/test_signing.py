"""The bus's signature is the HMAC-SHA256 of the record under the services' key, whichever key
was signed with before (services/runtime/signing.py keeps each key's HMAC keyed once)."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime import signing


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=80), st.binary(max_size=600)), min_size=1, max_size=40)
)
def test_each_signature_is_the_hmac_of_its_record_under_its_own_key(
    signed: list[tuple[bytes, bytes]],
) -> None:
    # Up to 40 keys in a row: past the bound of keys kept, and back to earlier ones.
    for key, value in [*signed, *signed]:
        expected = hmac.new(key, value, hashlib.sha256).hexdigest().encode()
        assert signing.signature(key, value) == expected
        assert signing.verify([("signature", expected)], value, key) is None
    assert len(signing._KEYED) <= signing._KEYED_AT_MOST
