"""What keeps a bearer token that does not authenticate cheap to refuse.

Authenticating a team token costs one look-up in the log (services/api/auth.py): that is what
makes a revocation hold at once in every API process, and no token is ever accepted from
memory. Refusing one need not cost as much, and a client presenting random tokens must not
turn each request into a query of the database every team shares:

- a token the log did not know, or knew as revoked, is remembered (by its sha256, for
  `ttl_s`, at most `capacity` of them) and refused again from memory. Refusing from memory
  never accepts anything late; and a token nobody was issued cannot become valid, since the
  API draws every token itself (`new_token`), hands it out only once its grant is committed,
  and never revives a revoked one;
- a token this process's read models know as revoked is refused without a look-up at all;
- each look-up of a token the read models do not know spends one from a bucket per client
  address (`rate` a second, a second's worth of burst; an IPv6 client's whole /64, which one
  host usually holds), given back when the token turned out good. An address whose bucket is
  empty gets 429 with Retry-After, without a look-up, for every token the read models do not
  know; a token they know as issued is still looked up, so a team's client behind the same
  address as a flood keeps working.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Callable, Mapping

from services.api.projections.tenancy import TokenRecord
from services.api.ratelimit import ReadLimiter

# How many client addresses' buckets, and how many refused tokens, one process remembers.
MAX_ADDRESSES = 10_000
MAX_REFUSED = 10_000


@functools.lru_cache(maxsize=MAX_ADDRESSES)
def client_key(host: str | None) -> str:
    """Whom a request's failed look-ups are counted against: its address, or an IPv6
    address's /64. Remembered per host (every request asks; parsing the address was 2% of
    the API's CPU under single submissions)."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class AuthGuard:
    """One API process's memory of refused tokens and each address's failed look-ups."""

    def __init__(
        self,
        tokens: Callable[[], Mapping[str, TokenRecord]],
        *,
        rate: float | None,
        ttl_s: float,
        capacity: int = MAX_REFUSED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The tokens the read models know, by token id (what `token_id_of` makes of a hash).
        self._tokens = tokens
        self.rate = rate
        self.ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        # sha256 -> (why it was refused, until when that is remembered), oldest first
        self._refused: dict[str, tuple[str, float]] = {}
        self._lookups = ReadLimiter(clock, max_callers=MAX_ADDRESSES)

    def known(self, token_id: str) -> TokenRecord | None:
        return self._tokens().get(token_id)

    def refused(self, digest: str) -> str | None:
        """Why the token of this hash was refused lately; None when it was not."""
        found = self._refused.get(digest)
        if found is None:
            return None
        detail, until = found
        if self._clock() >= until:
            del self._refused[digest]
            return None
        return detail

    def refuse(self, digest: str, detail: str) -> None:
        self._refused.pop(digest, None)
        self._refused[digest] = (detail, self._clock() + self.ttl_s)
        if len(self._refused) > self._capacity:
            del self._refused[next(iter(self._refused))]

    def spend(self, client: str) -> float | None:
        """One look-up for `client`: None when its bucket allows it, else the seconds to wait."""
        return self._lookups.take(client, self.rate)

    def give_back(self, client: str) -> None:
        """The look-up found a good token: it costs the address nothing."""
        self._lookups.give_back(client, self.rate)
