"""The per-node policy DNS resolver: every sandbox's DNS, answered under its network policy.

Lifecycle runs one :class:`NodeResolver` per installation on the installation's gateway
address, port 53, UDP and TCP (the firewall DNATs every port-53 packet a sandbox sends here,
so a hard-coded 8.8.8.8 gets these answers too). Each query is identified by its source
address (the sandbox's own), checked against the sandbox's live policy, forwarded upstream
when allowed, screened, and, in allowlist mode, its addresses opened in the firewall before
the reply leaves: see ``dnsanswer.py`` for the pipeline and every refusal's reasoning,
``dnspolicy.py`` for the screening, ``dnscache.py`` for the bounded memories.

Library: dnspython (``dns.message`` for the wire format both ways, ``dns.asyncquery`` towards
the upstreams). It is the maintained, pure-Python, typed DNS toolkit (EDNS, EDE, SVCB/HTTPS,
truncation, TCP framing all implemented and tested upstream), so the resolver stays in the
lifecycle process and shares its policy objects and the firewall's in-process nftables
handle: a packaged resolver (unbound, dnsmasq) would need a policy compiler, a control
channel per update and a second process per node, and still could not feed per-sandbox
timed sets with the rule's ports before answering.

Bounds: UDP datagrams go into a queue of ``udp_queue`` (overflow: dropped and counted; a stub
retries) drained by ``workers`` tasks; upstream lookups at most ``max_inflight`` at once,
``sandbox_inflight`` of them for one sandbox, and one per question (a question already under
way is waited for, not asked again); TCP
at most ``tcp_connections`` (more: closed at once), each idle at most ``tcp_idle_timeout``
and at most ``tcp_queries`` queries long; queries over ``max_query_bytes`` are FORMERR (UDP)
or end the connection (TCP). Every task is the resolver's: :meth:`NodeResolver.close`
cancels and awaits them all.

Settings: ``dnssettings.ResolverSettings`` (``SANDPOD_DNS_*``, the table there).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import time
import typing
from collections.abc import Callable, Sequence

import structlog

from sandpod_lifecycle.events import RateLimiter
from sandpod_lifecycle.network.dnsanswer import Answerer, AnswerLimits, ResolvedSink
from sandpod_lifecycle.network.dnscache import AnswerCache, ResolvedNames
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxLookup
from sandpod_lifecycle.network.upstream import Upstream

__all__ = ["NodeResolver", "ResolvedSink", "ResolverBindError", "ResolverSettings"]

log = structlog.get_logger("sandpod.lifecycle.network.resolver")

Address = tuple[str, int]
UDP_RECEIVE_BUFFER = 1 << 20  # capped by net.core.rmem_max


class ResolverBindError(Exception):
    """The resolver could not listen on an address (in use, or not on this host)."""

    code = "network.dns_bind"
    retryable = False


class _UdpIntake(asyncio.DatagramProtocol):
    """Queues datagrams for the workers; a full queue drops (counted), never blocks the loop."""

    def __init__(
        self, queue: asyncio.Queue[tuple[_UdpIntake, bytes, Address]], metrics: NetworkMetrics
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.transport: asyncio.DatagramTransport | None = None

    def itself(self) -> _UdpIntake:  # the protocol factory asyncio wants
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a datagram endpoint's transport (not an isinstance: 3.11's selector transport is
        # no DatagramTransport subclass)
        self.transport = typing.cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            self.queue.put_nowait((self, data, (str(addr[0]), int(addr[1]))))
        except asyncio.QueueFull:
            self.metrics.dns_dropped.labels("udp_queue").inc()

    def error_received(self, exc: Exception) -> None:  # ICMP errors about earlier replies
        log.debug("dns_udp_error", error=repr(exc))


def _bind(family: int, kind: int, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if kind == socket.SOCK_DGRAM:  # room for a burst of queries while workers are busy
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RECEIVE_BUFFER)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _bind_pair(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket on the same ``host:port`` (port 0: one free for both)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(8):
        udp = _bind(family, socket.SOCK_DGRAM, host, port)
        try:
            tcp = _bind(family, socket.SOCK_STREAM, host, udp.getsockname()[1])
        except OSError as exc:
            udp.close()
            if port == 0 and exc.errno == errno.EADDRINUSE:
                continue  # the free UDP port is taken for TCP: another pair
            raise
        return udp, tcp
    raise OSError(errno.EADDRINUSE, f"no port free for both UDP and TCP on {host}")


class NodeResolver:
    """The node's policy resolver on ``listen`` addresses (UDP and TCP on each).

    Args:
        settings: the knobs (:class:`ResolverSettings`).
        listen: (address, port) pairs; port 0 picks a free one (tests), see :attr:`addresses`.
        lookup: source address -> the sandbox behind it, or None (REFUSED); called per query.
        sink: where an allowlisted sandbox's resolved addresses go, before the reply.
        metrics: the enforcers' shared metrics (``NetworkMetrics`` on lifecycle's registry).
        on_denied: called (rate-limited per sandbox) with each refusal; must not block.
        clock: monotonic seconds, for the caches' expiry and the event rate.
    """

    def __init__(
        self,
        settings: ResolverSettings,
        listen: Sequence[Address],
        *,
        lookup: SandboxLookup,
        sink: ResolvedSink,
        metrics: NetworkMetrics,
        on_denied: Callable[[Denial], None] = lambda denial: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._listen = tuple(listen)
        self._metrics = metrics
        self._clock = clock
        self._names = ResolvedNames(settings.names_per_sandbox, settings.max_sandboxes)
        self._cache = AnswerCache(settings.cache_entries, settings.max_ttl)
        self._answerer = Answerer(
            limits=AnswerLimits(
                max_query_bytes=settings.max_query_bytes,
                min_ttl=settings.min_ttl,
                max_ttl=settings.max_ttl,
                sink_timeout=settings.sink_timeout,
                denied_rcode=settings.denied_rcode,
                sandbox_inflight=settings.sandbox_inflight,
            ),
            lookup=lookup,
            upstream=Upstream(
                settings.upstreams,
                settings.attempt_timeout,
                settings.deadline,
                settings.max_inflight,
            ),
            sink=sink,
            cache=self._cache,
            names=self._names,
            metrics=metrics,
            on_denied=on_denied,
            events=RateLimiter(settings.event_burst, settings.event_rate, clock),
            clock=clock,
        )
        self._queue: asyncio.Queue[tuple[_UdpIntake, bytes, Address]] = asyncio.Queue(
            settings.udp_queue
        )
        self._transports: list[asyncio.DatagramTransport] = []
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()  # UDP workers
        self._connections: set[asyncio.Task[object]] = set()  # TCP clients being served
        self.addresses: list[Address] = []  # where it listens, ports resolved
        self._state = "new"

    async def start(self) -> None:
        """Listen on every address and start the workers.

        Raises:
            ResolverBindError: an address cannot be bound (nothing is left listening).
            RuntimeError: started twice, or after close.
        """
        if self._state != "new":
            raise RuntimeError(f"NodeResolver.start: already {self._state}")
        self._state = "running"
        loop = asyncio.get_running_loop()
        try:
            for host, port in self._listen:
                try:
                    udp, tcp = _bind_pair(host, port)
                except OSError as exc:
                    raise ResolverBindError(f"cannot listen on {host}:{port}: {exc}") from exc
                bound = udp.getsockname()
                self.addresses.append((str(bound[0]), int(bound[1])))
                intake = _UdpIntake(self._queue, self._metrics)
                transport, _ = await loop.create_datagram_endpoint(intake.itself, sock=udp)
                self._transports.append(transport)
                server = await asyncio.start_server(self._serve_tcp, sock=tcp)
                self._servers.append(server)
        except BaseException:
            await self.close()
            raise
        for index in range(self._settings.workers):
            task = asyncio.create_task(self._udp_worker(), name=f"dns-udp-{index}")
            self._tasks.add(task)
        log.info("dns_resolver_started", addresses=self.addresses)

    async def close(self) -> None:
        """Stop listening, cancel every worker and connection, wait for them (idempotent)."""
        if self._state == "closed":
            return
        self._state = "closed"
        for server in self._servers:
            server.close()
        for transport in self._transports:
            transport.close()
        tasks = [*self._tasks, *self._connections]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()
        self._transports.clear()

    def resolved_names(self, sandbox_id: str, address: str) -> set[str]:
        """The names ``sandbox_id`` was told (and may still use) that resolve to ``address``:
        the egress proxy's proof that a TLS SNI / HTTP Host goes where the sandbox looked."""
        return self._names.names(sandbox_id, address, self._clock())

    def forget(self, sandbox_id: str) -> None:
        """Drop what the resolver remembers of a sandbox (call it at teardown)."""
        self._names.forget(sandbox_id)

    async def answer(self, wire: bytes, peer: str, transport: str = "udp") -> bytes | None:
        """The reply to one query from ``peer`` (for tests and other transports)."""
        return await self._answerer.answer(wire, peer, transport)

    async def _udp_worker(self) -> None:
        while True:
            intake, data, peer = await self._queue.get()
            try:
                response = await self._answerer.answer(data, peer[0], "udp")
                if response is not None and intake.transport is not None:
                    intake.transport.sendto(response, peer)
            except Exception:  # a bug must cost one answer, never a worker
                log.exception("dns_udp_failed", peer=peer[0])
                self._metrics.dns_queries.labels("udp", "internal_error").inc()

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or self._state != "running":
            writer.close()
            return
        if len(self._connections) >= self._settings.tcp_connections:
            self._metrics.dns_dropped.labels("tcp_connections").inc()
            writer.close()
            return
        self._connections.add(task)
        self._metrics.dns_tcp_connections.inc()
        peer = writer.get_extra_info("peername")
        try:
            await self._tcp_queries(reader, writer, str(peer[0]))
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: its connection ends, nothing else
        except Exception:
            log.exception("dns_tcp_failed", peer=str(peer[0]))
            self._metrics.dns_queries.labels("tcp", "internal_error").inc()
        finally:
            self._connections.discard(task)
            self._metrics.dns_tcp_connections.dec()
            writer.close()

    async def _tcp_queries(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        idle = self._settings.tcp_idle_timeout
        for _ in range(self._settings.tcp_queries):
            try:
                async with asyncio.timeout(idle):
                    head = await reader.readexactly(2)
            except asyncio.IncompleteReadError:
                return  # a clean close between queries
            length = int.from_bytes(head, "big")
            if length > self._settings.max_query_bytes:
                self._metrics.dns_malformed.labels("too_large").inc()
                return
            async with asyncio.timeout(idle):
                wire = await reader.readexactly(length)
            response = await self._answerer.answer(wire, peer, "tcp")
            if response is None:
                return
            writer.write(len(response).to_bytes(2, "big") + response)
            async with asyncio.timeout(idle):
                await writer.drain()
