"""A small authoritative DNS server for tests (dnspython), UDP and TCP, in the test's own loop.

It serves whatever records a test adds (``add("a.test", "A", 60, "11.22.0.1")``), follows
CNAMEs inside its data, answers ``*.name`` wildcards, NXDOMAIN/NODATA with an SOA (so negative
answers are cacheable), and logs every question it was asked (``asked``) so a test can see
what reached "the internet". ``truncate_udp`` makes it answer TC over UDP (forcing TCP);
``holding`` keeps UDP answers back until :meth:`release` (a slow upstream, on cue).
Listens on a loopback address and a free port; :meth:`close` leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import typing
from collections import defaultdict

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset

__all__ = ["AuthServer"]

SOA = "ns.test. admin.test. 1 3600 600 86400 {minimum}"


class AuthServer:
    def __init__(self, host: str = "127.0.0.1", negative_ttl: int = 30) -> None:
        self.host = host
        self.port = 0
        self.asked: list[tuple[str, str, str]] = []  # (name, type, transport)
        self.truncate_udp = False
        self.holding = False  # while True, UDP answers wait for release()
        self._held: list[tuple[_Udp, bytes, tuple[str | int, ...]]] = []
        self._records: dict[tuple[str, int], list[dns.rrset.RRset]] = defaultdict(list)
        self._names: set[str] = set()
        self._negative_ttl = negative_ttl
        self._transport: asyncio.DatagramTransport | None = None
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[object]] = set()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def add(self, name: str, rdtype: str, ttl: int, *rdatas: str) -> None:
        """Serve ``rdatas`` (presentation format) as ``name``'s ``rdtype`` with ``ttl``."""
        owner = dns.name.from_text(name)
        kind = dns.rdatatype.from_text(rdtype)
        parsed = [dns.rdata.from_text(dns.rdataclass.IN, kind, text) for text in rdatas]
        key = (owner.to_text().lower(), int(kind))
        self._records[key] = [dns.rrset.from_rdata_list(owner, ttl, parsed)]
        self._names.add(key[0])

    def release(self) -> None:
        """Send the UDP answers held while ``holding``, and stop holding."""
        self.holding = False
        held, self._held = self._held, []
        for protocol, answer, addr in held:
            if protocol.transport is not None:
                protocol.transport.sendto(answer, addr)

    def asked_for(self, name: str) -> int:
        """How many times ``name`` (any type, any transport) was asked."""
        wanted = name.lower().rstrip(".") + "."
        return sum(1 for asked, _, _ in self.asked if asked == wanted)

    async def start(self) -> None:
        """Listen on UDP and TCP on one free port of ``host`` (retried if TCP's is taken)."""
        loop = asyncio.get_running_loop()
        for _ in range(8):
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Udp(self), local_addr=(self.host, 0)
            )
            port = int(transport.get_extra_info("sockname")[1])
            try:
                self._server = await asyncio.start_server(self._tcp, self.host, port)
            except OSError:
                transport.close()
                continue
            self._transport, self.port = transport, port
            return
        raise OSError(f"no port free for both UDP and TCP on {self.host}")

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def respond(self, wire: bytes, transport: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:
            return None
        question = query.question[0]
        self.asked.append(
            (
                question.name.to_text().lower(),
                dns.rdatatype.to_text(question.rdtype),
                transport,
            )
        )
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if transport == "udp" and self.truncate_udp:
            response.flags |= dns.flags.TC
            return response.to_wire()
        self._fill(response, question.name, question.rdtype)
        return response.to_wire(max_size=65535)

    def _fill(self, response: dns.message.Message, name: dns.name.Name, rdtype: int) -> None:
        for _ in range(8):  # CNAME chain inside the data
            key = self._lookup_key(name)
            if key is None:
                response.set_rcode(dns.rcode.NXDOMAIN)
                self._soa(response)
                return
            cname = self._records.get((key, int(dns.rdatatype.CNAME)))
            if cname and rdtype != dns.rdatatype.CNAME:
                response.answer.append(_owned(cname[0], name))
                name = cname[0][0].target
                continue
            found = self._records.get((key, int(rdtype)))
            if not found:
                self._soa(response)
                return
            response.answer.append(_owned(found[0], name))
            return

    def _lookup_key(self, name: dns.name.Name) -> str | None:
        text = name.to_text().lower()
        if text in self._names:
            return text
        labels = text.split(".")
        for i in range(1, len(labels) - 1):
            wildcard = "*." + ".".join(labels[i:])
            if wildcard in self._names:
                return wildcard
        return None

    def _soa(self, response: dns.message.Message) -> None:
        soa = dns.rdata.from_text(
            dns.rdataclass.IN, dns.rdatatype.SOA, SOA.format(minimum=self._negative_ttl)
        )
        response.authority.append(
            dns.rrset.from_rdata_list(dns.name.from_text("test."), self._negative_ttl, [soa])
        )

    async def _tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            while True:
                head = await reader.readexactly(2)
                wire = await reader.readexactly(int.from_bytes(head, "big"))
                answer = self.respond(wire, "tcp")
                if answer is None:
                    return
                writer.write(len(answer).to_bytes(2, "big") + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()


def _owned(rrset: dns.rrset.RRset, name: dns.name.Name) -> dns.rrset.RRset:
    """``rrset`` under ``name`` (a wildcard's records answer as the asked name)."""
    return dns.rrset.from_rdata_list(name, rrset.ttl, list(rrset))


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: AuthServer) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        answer = self.server.respond(data, "udp")
        if answer is not None and self.server.holding:
            self.server._held.append((self, answer, addr))
        elif answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)
