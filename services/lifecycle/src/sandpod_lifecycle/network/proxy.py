"""The egress proxy: name rules checked against what a connection really asks for, and secrets
added on the way out.

nftables DNATs a sandbox's TCP connections on the proxied ports (80/443 to name-rule
addresses, and in any mode to the addresses the resolver answered for a name the policy
injects a header into: its injection set, see ``firewall.py``) to this proxy on the
installation's gateway address. A ``public`` sandbox's other traffic never comes here. For
each:

    accept -> sandbox by source address (``lookup``) -> original destination (SO_ORIGINAL_DST)
    -> read the first bytes, bounded (``sniff_max_bytes``) and timed (``sniff_timeout``), in a
       bounded number of slots (``max_sniffing``: a client that never speaks holds one slot
       until its timeout, then is closed)
    -> ``verdict.decide`` -> refused: TLS alert / HTTP 403 naming the rule, an event and a metric
                          -> plain HTTP: every request's Host checked (``http1``), the response
                             spliced back
                          -> TLS to an ``inject`` domain: terminated with the installation's
                             authority for it (``ca``), header added, re-encrypted to the real
                             server (its certificate verified)
                          -> anything else allowed: the first bytes sent on and the rest spliced
                             in the kernel (``splice``), never decrypted.

Why this on top of DNS-fed nftables sets (OpenSandbox's ``dns+nft`` alone): a set of resolved
addresses allows *addresses*, and one CDN address serves thousands of names, so allowing
``api.example.com`` there opens every other tenant of that CDN edge (a sandbox resolves nothing
else, it just sends ``Host: denied.example`` or that SNI to the address it was given). Checking
the name the client sends closes that. Why the resolver's record as well, where an SNI/Host
check alone (as in E2B's egress proxy, which intercepts SNI/Host for its domain rules) accepts
an allowed name on *any* address: a sandbox that pins ``api.example.com`` to a server of its
own in ``/etc/hosts`` (or learns the address over DoH) sends a perfectly allowed SNI to an
address the rule never meant, and exfiltrates through it; here the address must be one our
resolver answered that sandbox for that name (its TTL still running), and the name must be
allowed. Where an address is allowed on its own (a CIDR rule, ``public`` mode) only the name's
own verdict applies. What no SNI check sees: a server that routes on the Host *inside* TLS
regardless of SNI (domain fronting, which the major CDNs refuse); for intercepted domains the
proxy checks that Host too.

Process/thread model: the proxy runs on its own asyncio loop in a dedicated thread
(:class:`ProxyThread`), not on the lifecycle's loop. Spliced bytes never enter Python (one
wake-up per MiB), but TLS handshakes, certificate minting and intercepted traffic cost CPU
(mostly in OpenSSL, which releases the GIL) that must not delay the lifecycle's reconciles and
NATS heartbeats; a separate process would need IPC for the per-connection lookups (policy,
resolved names). Those lookups run on the lifecycle's loop when it is passed as
``owner_loop`` (one cross-thread hop per connection, so they read the resolver's and the
firewall's state without locks), or on the proxy's thread when they are thread-safe
(:class:`SandboxDirectory`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from sandpod_contract.network import HeaderInjection
from sandpod_lifecycle.events import RateLimiter
from sandpod_lifecycle.network import splice
from sandpod_lifecycle.network.ca import InterceptionCA
from sandpod_lifecycle.network.http1 import HttpSession, Reader, refusal_bytes
from sandpod_lifecycle.network.intercept import (
    InterceptFailed,
    answer,
    copy_back,
    rewriter,
    terminate,
)
from sandpod_lifecycle.network.origdst import IPAddress, NoOriginalDst, OriginalDst, original_dst
from sandpod_lifecycle.network.proxyconfig import ProxySettings, ResolvedNames, plain_address
from sandpod_lifecycle.network.proxymetrics import ProxyMetrics
from sandpod_lifecycle.network.sandboxnet import Denial, DenialKind, SandboxLookup, SandboxNet
from sandpod_lifecycle.network.secretstore import SecretError, SecretSource
from sandpod_lifecycle.network.sniff import Incomplete, Malformed, Sniffed, sniff
from sandpod_lifecycle.network.streams import SocketStream, TlsStream
from sandpod_lifecycle.network.verdict import Decision, decide

__all__ = ["EgressProxy"]

log = structlog.get_logger("sandpod.lifecycle.egress")
_T = TypeVar("_T")

ACCEPT_BACKOFF = 0.1  # seconds between accept attempts when the process is out of descriptors
_ALERT_ACCESS_DENIED = bytes([21, 3, 3, 0, 2, 2, 49])  # TLS fatal alert access_denied(49)
_ALERT_DECODE_ERROR = bytes([21, 3, 3, 0, 2, 2, 50])


@dataclasses.dataclass(slots=True)
class _Flow:
    """One sandbox connection after its first bytes were read."""

    conn: socket.socket
    net: SandboxNet
    seen: Sniffed
    prefix: bytes
    dst: IPAddress
    port: int
    owned: list[socket.socket]  # upstream sockets, closed with the connection

    @property
    def destination(self) -> str:
        return f"{self.seen.name or self.dst}:{self.port}"


class EgressProxy:
    """Serve DNAT'ed sandbox connections on the given listening sockets (see the module)."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        lookup: SandboxLookup,
        resolved_names: ResolvedNames,
        original_dst: OriginalDst = original_dst,
        ca: InterceptionCA | None = None,
        secrets: SecretSource | None = None,
        on_denied: Callable[[Denial], None] | None = None,
        forbidden: Callable[[IPAddress, int], str | None] | None = None,
        metrics: ProxyMetrics | None = None,
        owner_loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """``owner_loop``: the loop that owns the state ``lookup``, ``resolved_names`` and
        ``on_denied`` read (the lifecycle's): they are then called there, one cross-thread hop
        per connection, so they need no locks. None: called on the proxy's own thread (they
        must be thread-safe, e.g. :class:`SandboxDirectory`)."""
        self.settings = settings
        self._lookup = lookup
        self._resolved = resolved_names
        self._original_dst = original_dst
        self._ca = ca
        self._secrets = secrets
        self._on_denied = on_denied
        self._forbidden = forbidden
        self.metrics = metrics
        self._owner = owner_loop
        self._limiter = RateLimiter(settings.denial_burst, settings.denial_rate)
        self._upstream_tls = ssl.create_default_context(
            cafile=str(settings.upstream_ca_file) if settings.upstream_ca_file else None
        )
        self._upstream_tls.set_alpn_protocols(["http/1.1"])
        self._sniff_slots = asyncio.Semaphore(settings.max_sniffing)
        self._own: set[tuple[IPAddress, int]] = set()
        self._per_sandbox: dict[str, int] = {}  # connections open per sandbox
        self.active = 0  # connections being handled
        self.sniffing = 0  # of which waiting for their first bytes

    async def serve(self, listeners: list[socket.socket]) -> None:
        """Accept on ``listeners`` until cancelled; every connection's task is owned here."""
        for listener in listeners:
            listener.setblocking(False)
            host, port = listener.getsockname()[:2]
            self._own.add((plain_address(ipaddress.ip_address(host)), port))
        async with asyncio.TaskGroup() as tg:
            for listener in listeners:
                tg.create_task(self._accept(listener, tg))

    async def _accept(self, listener: socket.socket, tg: asyncio.TaskGroup) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: wait for connections to end
                log.warning("egress_accept_failed", error=repr(exc))
                self._count("accept-failed")
                await asyncio.sleep(ACCEPT_BACKOFF)
                continue
            if self.active >= self.settings.max_connections:
                conn.close()
                self._count("overloaded")
                continue
            self.active += 1
            # A relay must not add Nagle's wait to a small write it passes on.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tg.create_task(self._handle(conn, peer))

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.connections.labels(outcome).inc()

    async def _handle(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        owned: list[socket.socket] = []
        try:
            source = str(plain_address(ipaddress.ip_address(peer[0])))
            net = await self._on_owner(self._lookup, source)
            if net is None:
                self._count("unknown-source")
                return
            limit = net.policy.limits.max_connections
            if limit is not None and self._per_sandbox.get(net.sandbox_id, 0) >= limit:
                self._deny(net, DenialKind.CONNECT, "*", "limits.maxConnections")
                return
            self._per_sandbox[net.sandbox_id] = self._per_sandbox.get(net.sandbox_id, 0) + 1
            try:
                await self._serve_one(conn, net, owned)
            finally:
                if (left := self._per_sandbox.pop(net.sandbox_id) - 1) > 0:
                    self._per_sandbox[net.sandbox_id] = left
        except Exception as exc:  # one connection's failure never ends the proxy
            log.warning("egress_connection_failed", error=repr(exc))
            self._count("error")
        finally:
            self.active -= 1
            conn.close()
            for sock in owned:
                sock.close()

    async def _serve_one(
        self, conn: socket.socket, net: SandboxNet, owned: list[socket.socket]
    ) -> None:
        try:
            dst, port = self._original_dst(conn)
        except NoOriginalDst:
            self._count("not-redirected")
            return
        dst = plain_address(dst)
        why = "proxy-loop" if (dst, port) in self._own else None
        if why is None and self._forbidden is not None:
            why = self._forbidden(dst, port)
        if why is not None:
            self._deny(net, DenialKind.CONNECT, f"{dst}:{port}", why)
            return
        sniffed = await self._sniff(conn, net, f"{dst}:{port}")
        if sniffed is None:
            return
        prefix, seen = sniffed
        names = await self._on_owner(self._resolved, net.sandbox_id, str(dst))
        resolved = {n.lower().rstrip(".") for n in names}
        decision = decide(net.policy, dst, port, seen, resolved)
        flow = _Flow(conn, net, seen, prefix, dst, port, owned)
        if not decision.allowed:
            await self._refuse(flow, decision)
            return
        await self._forward(flow, decision)

    async def _sniff(
        self, conn: socket.socket, net: SandboxNet, destination: str
    ) -> tuple[bytes, Sniffed] | None:
        """The first bytes and what they say; None when the client timed out or sent garbage
        (the connection is answered and counted here)."""
        buf = bytearray()
        async with self._sniff_slots:
            self.sniffing += 1
            try:
                async with asyncio.timeout(self.settings.sniff_timeout):
                    while True:
                        with contextlib.suppress(Incomplete):
                            return bytes(buf), sniff(bytes(buf))
                        if len(buf) >= self.settings.sniff_max_bytes:
                            raise Malformed("tls" if buf[:1] == b"\x16" else "http", "too long")
                        data = await _recv(conn, self.settings.sniff_max_bytes - len(buf))
                        if not data:
                            self._count("closed-early")
                            return None
                        buf += data
            except TimeoutError:
                self._count("sniff-timeout")
                return None
            except Malformed as exc:
                self._deny(net, DenialKind.SNI, destination, f"malformed-{exc.kind}")
                with contextlib.suppress(OSError):
                    conn.send(_ALERT_DECODE_ERROR if exc.kind == "tls" else _bad_request(exc))
                return None
            finally:
                self.sniffing -= 1

    async def _refuse(self, flow: _Flow, decision: Decision) -> None:
        kind = DenialKind.SNI if flow.seen.name else DenialKind.CONNECT
        self._deny(flow.net, kind, flow.destination, decision.rule)
        with contextlib.suppress(OSError):
            if flow.seen.kind == "tls":
                await splice.send_all(flow.conn, _ALERT_ACCESS_DENIED)
            elif flow.seen.kind == "http":
                detail = f"{flow.destination} refused by rule {decision.rule}"
                await splice.send_all(flow.conn, refusal_bytes(403, "Forbidden", detail))

    def _deny(self, net: SandboxNet, kind: DenialKind, destination: str, rule: str) -> None:
        self._count("denied")
        if self.metrics is not None:
            self.metrics.denied.labels(kind).inc()
        allowed, refused = self._limiter.allow(net.sandbox_id)
        if not allowed:
            if refused == 1:
                log.warning("egress_denials_rate_limited", sandbox_id=net.sandbox_id)
            return
        log.info(
            "egress_denied",
            sandbox_id=net.sandbox_id,
            kind=kind,
            destination=destination,
            rule=rule,
        )
        if self._on_denied is not None:
            denial = Denial(net.sandbox_id, kind, destination, rule)
            if self._owner is None:
                self._on_denied(denial)
            else:
                self._owner.call_soon_threadsafe(self._on_denied, denial)

    async def _on_owner(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` on the owner loop (see ``__init__``), or here when there is none."""
        if self._owner is None:
            return fn(*args)

        async def call() -> _T:
            return fn(*args)

        future = asyncio.run_coroutine_threadsafe(call(), self._owner)
        return await asyncio.wrap_future(future)

    async def _connect(self, flow: _Flow) -> socket.socket:
        dst, port = flow.dst, flow.port
        sock = socket.socket(socket.AF_INET6 if dst.version == 6 else socket.AF_INET)
        flow.owned.append(sock)
        sock.setblocking(False)
        async with asyncio.timeout(self.settings.connect_timeout):
            await asyncio.get_running_loop().sock_connect(sock, (str(dst), port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    async def _forward(self, flow: _Flow, decision: Decision) -> None:
        name, conn = flow.seen.name, flow.conn
        if flow.seen.kind == "tls" and decision.inject is not None and name is not None:
            await self._intercept(flow, name, decision.inject)
            return
        try:
            upstream = await self._connect(flow)
        except (OSError, TimeoutError):
            self._count("upstream-unreachable")
            if flow.seen.kind == "http":
                with contextlib.suppress(OSError):
                    detail = f"{flow.destination} unreachable"
                    await splice.send_all(conn, refusal_bytes(502, "Bad Gateway", detail))
            return
        if flow.seen.kind == "http" and name is not None:
            try:
                rewrite = rewriter(decision.inject, self._secrets) if decision.inject else None
            except SecretError as exc:
                await self._secret_unavailable(flow, decision.inject, exc)
                return
            client = SocketStream(conn)
            session = HttpSession(
                client, Reader(client, flow.prefix), name, SocketStream(upstream), rewrite
            )
            await self._run_session(flow, session, lambda: self._splice_back(upstream, conn))
            return
        conn.setblocking(False)
        await splice.send_all(upstream, flow.prefix)
        up, down = await splice.relay(conn, upstream)
        self._bytes(len(flow.prefix) + up, down)
        self._count("spliced")

    async def _secret_unavailable(
        self, flow: _Flow, inject: HeaderInjection | None, exc: SecretError
    ) -> None:
        secret = inject.secret if inject is not None else "?"
        self._deny(flow.net, DenialKind.SNI, flow.destination, f"secret-unavailable:{secret}")
        log.warning("egress_secret_unavailable", secret=secret, error=str(exc))
        with contextlib.suppress(OSError):
            if flow.seen.kind == "tls":
                await splice.send_all(flow.conn, _ALERT_ACCESS_DENIED)
            else:
                detail = f"{flow.destination}: secret {secret} unavailable"
                await splice.send_all(flow.conn, refusal_bytes(502, "Bad Gateway", detail))

    async def _splice_back(self, upstream: socket.socket, conn: socket.socket) -> None:
        counter = [0]
        try:
            await splice.pump(upstream, conn, counter, half_close=False)
        finally:
            self._bytes(0, counter[0])

    def _bytes(self, up: int, down: int) -> None:
        if self.metrics is not None:
            self.metrics.bytes.labels("up").inc(up)
            self.metrics.bytes.labels("down").inc(down)

    async def _run_session(
        self, flow: _Flow, session: HttpSession, responses: Callable[[], Awaitable[None]]
    ) -> None:
        refusal = await session.run(responses, self.settings.response_grace)
        if refusal is None:
            self._count("intercepted" if session.rewrite else "http")
        else:
            self._deny(flow.net, DenialKind.SNI, f"{session.name}:{flow.port}", refusal.rule)

    async def _intercept(self, flow: _Flow, name: str, inject: HeaderInjection) -> None:
        if self._ca is None:
            raise SecretError("header injection configured but the proxy has no CA")
        try:
            rewrite = rewriter(inject, self._secrets)
        except SecretError as exc:
            await self._secret_unavailable(flow, inject, exc)
            return
        context = self._ca.server_context(inject.domain.name or name, name)
        client = TlsStream(flow.conn, context, server_side=True, prefix=flow.prefix)
        timeout = self.settings.handshake_timeout
        try:
            upstream = await terminate(
                client, lambda: self._connect(flow), self._upstream_tls, name, timeout
            )
        except InterceptFailed as failed:
            self._count(failed.outcome)
            if failed.detail is not None:
                log.warning("egress_upstream_failed", name=name, error=failed.detail)
                await answer(client, 502, "Bad Gateway", f"{flow.destination}: {failed.detail}")
            return
        session = HttpSession(client, Reader(client), name, upstream, rewrite)
        counter = [0]
        try:
            await self._run_session(flow, session, lambda: copy_back(upstream, client, counter))
        finally:
            self._bytes(0, counter[0])


async def _recv(conn: socket.socket, most: int) -> bytes:
    while True:
        try:
            return conn.recv(most)
        except BlockingIOError:
            await splice.wait_readable(conn)


def _bad_request(exc: Malformed) -> bytes:
    return refusal_bytes(400, "Bad Request", exc.why)
