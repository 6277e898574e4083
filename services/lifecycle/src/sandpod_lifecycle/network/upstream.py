"""The node resolver's side towards the real DNS: its upstream servers.

A query the policy allows becomes a *new* query (a fresh random id, a fresh socket so a
random source port, the sandbox's EDNS options not copied) to the upstream servers in order:
each gets one attempt of ``attempt_timeout`` (UDP, retried over TCP when the answer comes
back truncated); SERVFAIL or REFUSED from one moves on to the next; the whole lookup ends by
``deadline``, so a client gets SERVFAIL before its own stub gives up (glibc waits 5 s),
never a hang. At most ``max_inflight`` upstream lookups run at once; the rest wait their
turn inside the deadline.

The UDP socket is connected to the server (the kernel drops datagrams from anywhere else) and
an answer must match the query (``Message.is_response``: id and question; anything else is
ignored, not taken), so a spoofed datagram cannot poison the cache. The UDP exchange is done
here on a plain non-blocking socket rather than with ``dns.asyncquery.udp``, which sets up a
whole asyncio transport per query (~0.3 ms more per lookup, measured by bench/dns_policy.py);
TCP is ``dns.asyncquery.tcp``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import secrets
import socket
import struct
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdatatype
from dns.rdataclass import RdataClass
from dns.rdatatype import RdataType

__all__ = ["Upstream", "UpstreamError", "upstreams_from_resolv_conf"]

Server = tuple[str, int]
EDNS_PAYLOAD = 1232  # the DNS flag day 2020 size: no IP fragmentation on common paths


class UpstreamError(Exception):
    """No upstream gave an answer in time; ``reason``: ``timeout`` or ``unreachable``."""

    code = "network.dns_upstream"
    retryable = True

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def upstreams_from_resolv_conf(path: Path = Path("/etc/resolv.conf")) -> tuple[Server, ...]:
    """The ``nameserver`` addresses of a resolv.conf (port 53), in order; () when there is no
    readable file or no valid address in it (a scoped ``fe80::1%eth0`` keeps its scope)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ()
    servers: list[Server] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                ipaddress.ip_address(fields[1].split("%", 1)[0])
            except ValueError:
                continue
            servers.append((fields[1], 53))
    return tuple(servers)


class Upstream:
    def __init__(
        self,
        servers: tuple[Server, ...],
        attempt_timeout: float,
        deadline: float,
        max_inflight: int,
    ) -> None:
        if not servers:
            raise ValueError("the node resolver needs at least one upstream server")
        self._servers = servers
        self._attempt_timeout = attempt_timeout
        self._deadline = deadline
        self._slots = asyncio.Semaphore(max_inflight)

    async def resolve(
        self, qname: dns.name.Name, rdtype: RdataType, rdclass: RdataClass
    ) -> dns.message.Message:
        """The upstreams' answer to (qname, rdtype, rdclass), any rcode.

        Raises:
            UpstreamError: no server answered within the deadline.
        """
        question = _Question(qname, rdtype, rdclass)
        last: dns.message.Message | None = None
        failure = "unreachable"
        try:
            async with asyncio.timeout(self._deadline), self._slots:
                for host, port in self._servers:
                    try:
                        response = await self._exchange(question, host, port)
                    except (dns.exception.Timeout, TimeoutError):
                        failure = "timeout"
                        continue
                    except (OSError, EOFError, dns.exception.DNSException):
                        continue
                    last = response
                    if response.rcode() not in (dns.rcode.SERVFAIL, dns.rcode.REFUSED):
                        return response
        except TimeoutError:
            failure = "timeout"
        if last is not None:
            return last
        raise UpstreamError(failure, ", ".join(f"{h}:{p}" for h, p in self._servers))

    async def _exchange(self, question: _Question, host: str, port: int) -> dns.message.Message:
        """One attempt at one server: UDP from a fresh socket (a new random source port per
        query) with a fresh random id, over TCP when the answer is truncated. Raises
        TimeoutError, OSError or a DNSException."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        ident, wire = question.wire()
        async with asyncio.timeout(self._attempt_timeout):
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                # connected: the kernel drops datagrams from any other address or port
                sock.connect((host, port))
                await loop.sock_sendall(sock, wire)
                while True:
                    data = await loop.sock_recv(sock, 65535)
                    try:
                        response = dns.message.from_wire(data)
                    except dns.exception.DNSException:
                        continue  # junk on our port: keep waiting for the answer
                    if question.answered_by(ident, response):
                        break
        if not response.flags & dns.flags.TC:
            return response
        query = dns.message.make_query(
            question.name, question.rdtype, question.rdclass, use_edns=0, payload=EDNS_PAYLOAD
        )
        return await dns.asyncquery.tcp(query, host, timeout=self._attempt_timeout, port=port)


@dataclasses.dataclass(frozen=True, slots=True)
class _Question:
    """One upstream question. Its query is built as bytes here (a header, the question, an
    EDNS0 OPT record announcing ``EDNS_PAYLOAD``): dnspython's ``make_query`` + ``to_wire``
    cost ~120 us a query, a third of a cache miss's CPU; the answer is still parsed by
    dnspython and matched like ``Message.is_response`` does."""

    name: dns.name.Name
    rdtype: RdataType
    rdclass: RdataClass

    def wire(self) -> tuple[int, bytes]:
        ident = secrets.randbits(16)
        header = struct.pack("!HHHHHH", ident, dns.flags.RD, 1, 0, 0, 1)
        question = self.name.to_digestable() + struct.pack("!HH", self.rdtype, self.rdclass)
        opt = b"\x00" + struct.pack("!HHIH", dns.rdatatype.OPT, EDNS_PAYLOAD, 0, 0)
        return ident, header + question + opt

    def answered_by(self, ident: int, response: dns.message.Message) -> bool:
        if response.id != ident or not response.flags & dns.flags.QR:
            return False
        if response.opcode() != dns.opcode.QUERY or len(response.question) != 1:
            return False
        asked = response.question[0]
        return (asked.name, asked.rdtype, asked.rdclass) == (self.name, self.rdtype, self.rdclass)
