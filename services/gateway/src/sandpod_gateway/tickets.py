"""Short-lived, single-use WebSocket tickets, so a browser never puts its API key in a URL.

A browser cannot set headers on a WebSocket, and a query string ends up in access logs, proxy
logs and the browser's history. So the page trades its key (sent in the ``Authorization`` header
of ``POST /v1/ws-tickets``) for a ticket ``spt_<secret>`` that opens one WebSocket of the same
key and tenant within ``ttl`` seconds, then is gone: a ticket found in a log is already spent or
expired. Tickets live in this replica's memory (bounded; the oldest is dropped when full), so
the WebSocket must reach the replica that issued its ticket (one replica, or sticky routing by
client address); clients that can set headers use the key or the ``Sec-WebSocket-Protocol``
form instead (see the README).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable

from sandpod_gateway.keys import ApiKey

__all__ = ["TICKET_PREFIX", "TicketStore"]

TICKET_PREFIX = "spt_"


@dataclasses.dataclass(frozen=True, slots=True)
class _Ticket:
    key: ApiKey
    expires: float


class TicketStore:
    """Issue and redeem tickets; at most ``capacity`` outstanding (oldest evicted), and at most
    ``per_tenant`` of one tenant (its oldest evicted: one tenant cannot push out the others')."""

    def __init__(
        self,
        ttl: float = 30.0,
        capacity: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        per_tenant: int = 64,
    ) -> None:
        self.ttl = ttl
        self._capacity = capacity
        self._per_tenant = per_tenant
        self._clock = clock
        self._by_tenant: collections.Counter[str] = collections.Counter()
        self._tickets: collections.OrderedDict[str, _Ticket] = collections.OrderedDict()

    def issue(self, key: ApiKey) -> str:
        """A new ticket for ``key`` (shown once; only its digest is kept)."""
        self._expire()
        if self._by_tenant[key.tenant] >= self._per_tenant:
            oldest = next(d for d, t in self._tickets.items() if t.key.tenant == key.tenant)
            self._drop(oldest)
        ticket = TICKET_PREFIX + secrets.token_hex(24)
        self._tickets[_digest(ticket)] = _Ticket(key, self._clock() + self.ttl)
        self._by_tenant[key.tenant] += 1
        while len(self._tickets) > self._capacity:
            self._drop(next(iter(self._tickets)))
        return ticket

    def redeem(self, ticket: str) -> ApiKey | None:
        """The key ``ticket`` was issued for, once; None if unknown, spent or expired."""
        entry = self._drop(_digest(ticket))
        if entry is None or entry.expires < self._clock():
            return None
        return entry.key

    def _drop(self, digest: str) -> _Ticket | None:
        entry = self._tickets.pop(digest, None)
        if entry is not None:
            self._by_tenant[entry.key.tenant] -= 1
            if self._by_tenant[entry.key.tenant] <= 0:
                del self._by_tenant[entry.key.tenant]
        return entry

    def _expire(self) -> None:
        now = self._clock()
        while self._tickets:
            digest, first = next(iter(self._tickets.items()))
            if first.expires >= now:
                return
            self._drop(digest)

    def __len__(self) -> int:
        return len(self._tickets)


def _digest(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()
