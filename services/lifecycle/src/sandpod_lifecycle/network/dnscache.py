"""The resolver's two bounded memories: upstream answers, and what each sandbox was told.

:class:`AnswerCache` keeps the upstream's *unscreened* answers (the screening depends on the
asking sandbox's policy, so it runs on every reply, cached or not) for their TTL: the smallest
TTL of the answer, or the SOA's negative TTL for NXDOMAIN/NODATA (RFC 2308), capped. It holds
at most ``max_entries`` (least recently used evicted).

:class:`ResolvedNames` records, per sandbox, which names it was told resolve to an address,
until the firewall's set entry for that address expires: the egress proxy asks
``names(sandbox_id, address)`` to check that a TLS SNI / HTTP Host really resolved, for that
sandbox, to the address the connection goes to. Bounded per sandbox and in sandboxes.

Both take ``now`` from the caller (the resolver's injected clock), so expiry is testable
without waiting.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
from collections.abc import Iterable

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

__all__ = ["AnswerCache", "CacheKey", "CachedAnswer", "ResolvedNames"]

CacheKey = tuple[str, int, int]  # (lower-case name, rdtype, rdclass)


@dataclasses.dataclass(frozen=True, slots=True)
class CachedAnswer:
    rcode: dns.rcode.Rcode
    answer: list[dns.rrset.RRset]
    authority: list[dns.rrset.RRset]
    expires: float

    def remaining(self, now: float) -> int:
        return max(int(self.expires - now), 0)


def _answer_ttl(response: dns.message.Message) -> int | None:
    rcode = response.rcode()
    if rcode == dns.rcode.NOERROR and response.answer:
        return min(rrset.ttl for rrset in response.answer)
    if rcode in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        soa = next((r for r in response.authority if r.rdtype == dns.rdatatype.SOA), None)
        if soa is not None and len(soa):
            return int(min(soa.ttl, soa[0].minimum))
    return None  # SERVFAIL, REFUSED, a negative answer without SOA: not cached


class AnswerCache:
    def __init__(self, max_entries: int, max_ttl: int) -> None:
        self._entries: collections.OrderedDict[CacheKey, CachedAnswer] = collections.OrderedDict()
        self._max_entries = max_entries
        self._max_ttl = max_ttl

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey, now: float) -> CachedAnswer | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: CacheKey, response: dns.message.Message, now: float) -> CachedAnswer:
        """Remember ``response`` for its TTL (if it is cacheable); returns it as cached."""
        ttl = _answer_ttl(response)
        entry = CachedAnswer(
            dns.rcode.Rcode(response.rcode()),
            list(response.answer),
            list(response.authority),
            now + min(ttl or 0, self._max_ttl),
        )
        if ttl:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return entry

    def clear(self) -> None:
        self._entries.clear()


class ResolvedNames:
    def __init__(self, max_addresses_per_sandbox: int, max_sandboxes: int) -> None:
        # sandbox id -> address -> name -> expiry
        self._by_sandbox: collections.OrderedDict[
            str, collections.OrderedDict[str, dict[str, float]]
        ] = collections.OrderedDict()
        self._per_sandbox = max_addresses_per_sandbox
        self._max_sandboxes = max_sandboxes

    def record(
        self,
        sandbox_id: str,
        names: Iterable[str],
        addresses: Iterable[tuple[str, int]],
        now: float,
    ) -> None:
        """``names`` resolved to each address for ``sandbox_id``, for that address's seconds."""
        table = self._by_sandbox.pop(sandbox_id, None) or collections.OrderedDict()
        self._by_sandbox[sandbox_id] = table
        names = tuple(names)
        for address, seconds in addresses:
            known = table.pop(address, {})
            known = {n: t for n, t in known.items() if t > now}
            for name in names:
                known[name] = max(known.get(name, 0.0), now + seconds)
            table[address] = known
        while len(table) > self._per_sandbox:
            table.popitem(last=False)
        while len(self._by_sandbox) > self._max_sandboxes:
            self._by_sandbox.popitem(last=False)

    def names(self, sandbox_id: str, address: str, now: float) -> set[str]:
        """The names ``sandbox_id`` was told resolve to ``address`` and whose time is not up."""
        table = self._by_sandbox.get(sandbox_id)
        if table is None:
            return set()
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return set()
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        key = str(mapped or ip)
        return {name for name, expiry in table.get(key, {}).items() if expiry > now}

    def forget(self, sandbox_id: str) -> None:
        self._by_sandbox.pop(sandbox_id, None)
