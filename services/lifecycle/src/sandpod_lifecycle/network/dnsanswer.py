"""One query from a sandbox, start to reply: the node resolver's policy pipeline.

    bytes --parse_query--> query --lookup(source)--> sandbox --name_verdict--> allowed?
      --cache or upstream--> answer --screen (dnspolicy)--> kept records
      --allowlist: sink.add_resolved(...), an inject domain: sink.add_injected(...),
        awaited--> reply bytes

Refusals, and why each answer is what it is:

- **A denied name gets REFUSED** (configurable: NXDOMAIN) with an Extended DNS Error (RFC 8914)
  code 15 "Blocked" and the rule in its text. REFUSED is the truth (the policy, not the DNS,
  says no) and is not negatively cached by stubs the way NXDOMAIN is (RFC 2308), so a policy
  update that allows the name works on the very next lookup; `dig` shows the EDE text, so an
  agent can tell a policy refusal from a typo.
- **Unknown sources get REFUSED** (EDE 18 "Prohibited"): the resolver answers sandboxes only.
- **ANY, zone transfers, non-IN classes get REFUSED** (EDE 21 "Not Supported"), see
  ``dnswire.REFUSED_TYPES``.
- **An answer whose every address the policy removes** (DNS rebinding: a public name answering
  127.0.0.1, 10.x or 169.254.169.254) gets REFUSED + EDE "Blocked" too, not an empty NOERROR:
  an empty answer is NODATA, cached as "this name has no address", a lie a client acts on
  silently. A partly removed answer is sent with what remains.
- **Allowlist mode**: the kept addresses go to the firewall's sets (``sink.add_resolved``,
  once per allow rule naming the query, so each rule's ports are known) and the reply is sent
  only after that returned: a connect right after the answer finds the address open.
- **A name an ``inject`` entry covers** (any mode; ``public`` is where it matters): the kept
  addresses also go to the sandbox's injection set (``sink.add_injected``) before the reply,
  so its connections there on 80/443 reach the egress proxy, which adds the header. Only the
  query name counts (a CNAME chain through an injected name does not), and nothing else of a
  ``public`` sandbox goes to the proxy. Each
  set entry lives ``clamp(ttl, min_ttl, max_ttl)`` seconds while the client is told at most
  the TTL, so the client's cache never outlives the set entry. A sink failure is SERVFAIL.
- The upstream failing or timing out is SERVFAIL (EDE 22 "No Reachable Authority").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import dns.edns
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import structlog

from sandpod_contract.network import NetworkMode, Rule
from sandpod_lifecycle.events import RateLimiter
from sandpod_lifecycle.network.dnscache import AnswerCache, CachedAnswer, CacheKey, ResolvedNames
from sandpod_lifecycle.network.dnspolicy import Screened, allowing_rules, screen
from sandpod_lifecycle.network.dnswire import (
    REFUSED_TYPES,
    DnsWireError,
    formerr_from_header,
    parse_query,
    reply,
    to_wire,
)
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.sandboxnet import Denial, DenialKind, SandboxLookup, SandboxNet
from sandpod_lifecycle.network.upstream import Upstream, UpstreamError

__all__ = ["AnswerLimits", "Answerer", "ResolvedSink"]

log = structlog.get_logger("sandpod.lifecycle.network.dns")


class ResolvedSink(Protocol):
    """Where resolved addresses go (the firewall's timed sets): an allowlisted sandbox's, and
    those of a sandbox's ``inject`` domains (in any mode)."""

    async def add_resolved(
        self, sandbox_id: str, rule: Rule, addresses: Sequence[tuple[str, int]]
    ) -> None:
        """Open ``addresses`` ((address text, seconds) pairs) for ``sandbox_id`` on the ports of
        ``rule``, each for its seconds (a later call with the same address extends it)."""

    async def add_injected(self, sandbox_id: str, addresses: Sequence[tuple[str, int]]) -> None:
        """Send ``sandbox_id``'s connections to ``addresses`` on 80/443 through the egress
        proxy (which adds the header), each for its seconds."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AnswerLimits:
    max_query_bytes: int
    min_ttl: int
    max_ttl: int
    sink_timeout: float
    denied_rcode: dns.rcode.Rcode
    sandbox_inflight: int  # upstream lookups one sandbox may have at once


class _Busy(Exception):
    """The asking sandbox has its share of upstream lookups under way already."""


def _source(address: str) -> str:
    """The canonical text of a socket's peer address (scope and v4-mapping removed)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


class Answerer:
    def __init__(
        self,
        *,
        limits: AnswerLimits,
        lookup: SandboxLookup,
        upstream: Upstream,
        sink: ResolvedSink,
        cache: AnswerCache,
        names: ResolvedNames,
        metrics: NetworkMetrics,
        on_denied: Callable[[Denial], None],
        events: RateLimiter,
        clock: Callable[[], float],
    ) -> None:
        self._limits = limits
        self._lookup = lookup
        self._upstream = upstream
        self._sink = sink
        self._cache = cache
        self._names = names
        self._metrics = metrics
        self._on_denied = on_denied
        self._events = events
        self._clock = clock
        self._inflight: dict[str, int] = {}  # sandbox id -> its upstream lookups now
        self._pending: dict[CacheKey, asyncio.Future[CachedAnswer]] = {}  # lookups under way

    async def answer(self, wire: bytes, peer: str, transport: str) -> bytes | None:
        """The reply to ``wire`` from ``peer`` (None: drop it). Never raises for bad input."""
        tcp = transport == "tcp"
        try:
            query = parse_query(wire, self._limits.max_query_bytes)
        except DnsWireError as exc:
            self._metrics.dns_malformed.labels(exc.reason).inc()
            self._metrics.dns_queries.labels(transport, "malformed").inc()
            rcode = dns.rcode.NOTIMP if exc.reason == "opcode" else dns.rcode.FORMERR
            return formerr_from_header(wire, rcode)
        response, outcome = await self._respond(query, _source(peer))
        self._metrics.dns_queries.labels(transport, outcome).inc()
        return to_wire(response, query, tcp)

    async def _respond(
        self, query: dns.message.Message, source: str
    ) -> tuple[dns.message.Message, str]:
        question = query.question[0]
        if question.rdclass != dns.rdataclass.IN or question.rdtype in REFUSED_TYPES:
            return reply(query, dns.rcode.REFUSED, dns.edns.EDECode.NOT_SUPPORTED), "refused_type"
        qname = question.name.to_text(omit_final_dot=True).lower()
        sandbox = self._admit(query, source, qname)
        if not isinstance(sandbox, SandboxNet):
            return sandbox
        key = (qname, int(question.rdtype), int(question.rdclass))
        now = self._clock()
        entry = self._cache.get(key, now)
        self._metrics.dns_cache.labels("miss" if entry is None else "hit").inc()
        remaining = None if entry is None else entry.remaining(now)
        if entry is None:
            fetched = await self._fetch(query, sandbox, key)
            if not isinstance(fetched, CachedAnswer):
                return fetched
            entry = fetched
            # the policy may have changed while the upstream answered: screen under the new one
            sandbox = self._admit(query, source, qname)
            if not isinstance(sandbox, SandboxNet):
                return sandbox
        return await self._screened(query, sandbox, qname, entry, remaining)

    def _admit(
        self, query: dns.message.Message, source: str, qname: str
    ) -> SandboxNet | tuple[dns.message.Message, str]:
        """The sandbox behind ``source`` if its policy (now) lets it look ``qname`` up; else
        the refusal to send."""
        sandbox = self._lookup(source)
        if sandbox is None:
            return reply(query, dns.rcode.REFUSED, dns.edns.EDECode.PROHIBITED), "unknown_source"
        verdict = sandbox.policy.name_verdict(qname)
        if not verdict.allowed:
            self._deny(sandbox, DenialKind.DNS, qname, verdict.reason)
            return self._blocked(query, verdict.reason, self._limits.denied_rcode), "denied"
        return sandbox

    async def _fetch(
        self, query: dns.message.Message, sandbox: SandboxNet, key: CacheKey
    ) -> CachedAnswer | tuple[dns.message.Message, str]:
        """The upstream's answer, cached; or the SERVFAIL reply to send instead. A question
        already on its way upstream (another sandbox, the same name) is waited for, not asked
        twice."""
        try:
            shared = self._pending.get(key)
            if shared is None:
                return await self._ask_upstream(query, sandbox.sandbox_id, key)
            try:
                return await asyncio.shield(shared)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not shared.cancelled() or (task is not None and task.cancelling()):
                    raise  # this task itself is being cancelled
                raise UpstreamError("unreachable", "the lookup it waited for ended") from None
        except _Busy:
            busy = reply(query, dns.rcode.SERVFAIL, dns.edns.EDECode.OTHER, "too many lookups")
            return busy, "busy"
        except UpstreamError as exc:
            log.warning("dns_upstream_failed", reason=exc.reason, name=key[0])
            failed = reply(query, dns.rcode.SERVFAIL, dns.edns.EDECode.NO_REACHABLE_AUTHORITY)
            return failed, "upstream_failed"

    async def _ask_upstream(
        self, query: dns.message.Message, sandbox_id: str, key: CacheKey
    ) -> CachedAnswer:
        """Ask the upstreams, as the one lookup of ``key`` others may wait for. One sandbox has
        at most ``sandbox_inflight`` of these at once (past it: _Busy), so a sandbox asking
        random names cannot take every upstream slot from the others. Raises UpstreamError."""
        if self._inflight.get(sandbox_id, 0) >= self._limits.sandbox_inflight:
            self._metrics.dns_dropped.labels("sandbox_inflight").inc()
            raise _Busy
        future: asyncio.Future[CachedAnswer] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        self._inflight[sandbox_id] = self._inflight.get(sandbox_id, 0) + 1
        question = query.question[0]
        started = time.perf_counter()
        try:
            upstream = await self._upstream.resolve(
                question.name, question.rdtype, question.rdclass
            )
            entry = self._cache.put(key, upstream, self._clock())
            future.set_result(entry)
            return entry
        except UpstreamError as exc:
            future.set_exception(exc)
            future.exception()  # marked retrieved: the waiters still get it raised
            raise
        finally:
            self._metrics.dns_upstream_seconds.observe(time.perf_counter() - started)
            left = self._inflight.pop(sandbox_id) - 1
            if left:
                self._inflight[sandbox_id] = left
            del self._pending[key]
            if not future.done():
                future.cancel()

    async def _screened(
        self,
        query: dns.message.Message,
        sandbox: SandboxNet,
        qname: str,
        entry: CachedAnswer,
        remaining: int | None,
    ) -> tuple[dns.message.Message, str]:
        policy = sandbox.policy
        screened = screen(policy, entry.answer, self._limits.max_ttl, remaining)
        if screened.denied_by is not None:
            name, rule = screened.denied_by
            self._deny(sandbox, DenialKind.DNS, name, rule)
            return self._blocked(query, rule, self._limits.denied_rcode), "denied"
        for address, reason in screened.removed:
            self._deny(sandbox, DenialKind.REBINDING, f"{qname} {address}", reason)
        if screened.removed and not screened.addresses:
            reason = screened.removed[0][1]
            return self._blocked(query, reason, dns.rcode.REFUSED), "rebinding"
        # the set entry lives at least min_ttl: never shorter than the client caches the answer
        lo, hi = self._limits.min_ttl, self._limits.max_ttl
        opened = [(address, max(lo, min(ttl, hi))) for address, ttl in screened.addresses]
        if opened and await self._push(sandbox, qname, opened):
            return reply(query, dns.rcode.SERVFAIL, dns.edns.EDECode.OTHER), "sink_failed"
        if opened:
            self._names.record(sandbox.sandbox_id, {qname, *screened.names}, opened, self._clock())
        return self._reply(query, entry, screened, remaining), "answered"

    async def _push(self, sandbox: SandboxNet, qname: str, opened: list[tuple[str, int]]) -> bool:
        """Hand ``opened`` to the sink: for every allow rule naming ``qname`` (allowlist mode),
        and to the injection set when an ``inject`` entry names it; True if it failed."""
        policy, sid = sandbox.policy, sandbox.sandbox_id
        calls: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if policy.mode is NetworkMode.ALLOWLIST:
            calls += [
                (rule.text, functools.partial(self._sink.add_resolved, sid, rule, opened))
                for rule in allowing_rules(policy, qname)
            ]
        if any(entry.domain.covers_name(qname) for entry in policy.inject):
            calls.append(("inject", functools.partial(self._sink.add_injected, sid, opened)))
        for rule, call in calls:
            try:
                async with asyncio.timeout(self._limits.sink_timeout):
                    await call()
            except Exception as exc:  # any sink failure is SERVFAIL, logged
                log.error("dns_sink_failed", sandbox_id=sid, rule=rule, error=repr(exc))
                return True
        return False

    def _reply(
        self,
        query: dns.message.Message,
        entry: CachedAnswer,
        screened: Screened,
        remaining: int | None,
    ) -> dns.message.Message:
        response = reply(query, entry.rcode)
        response.answer = screened.answer
        if not screened.answer:  # a negative answer: its SOA tells the client how long
            cap = min(self._limits.max_ttl, remaining if remaining is not None else 1 << 31)
            response.authority = [
                dns.rrset.from_rdata_list(r.name, min(r.ttl, cap), list(r))
                for r in entry.authority
                if r.rdtype == dns.rdatatype.SOA
            ]
        return response

    def _blocked(
        self, query: dns.message.Message, reason: str, rcode: dns.rcode.Rcode
    ) -> dns.message.Message:
        text = f"sandpod network policy: {reason}"
        return reply(query, rcode, dns.edns.EDECode.BLOCKED, text)

    def _deny(self, sandbox: SandboxNet, kind: DenialKind, destination: str, rule: str) -> None:
        self._metrics.denied.labels(kind.value).inc()
        allowed, _ = self._events.allow(sandbox.sandbox_id)
        if not allowed:
            return
        log.info(
            "network_denied",
            sandbox_id=sandbox.sandbox_id,
            kind=kind.value,
            destination=destination,
            rule=rule,
        )
        try:
            self._on_denied(Denial(sandbox.sandbox_id, kind, destination, rule))
        except Exception as exc:  # a broken callback must not fail the lookup
            log.error("network_denied_callback_failed", error=repr(exc))
