"""DNS wire format for the node resolver: parse a sandbox's query, build the replies.

Everything that touches DNS bytes from a sandbox goes through here, so there is one place
where hostile input is bounded and typed: :func:`parse_query` turns any packet into either a
query the resolver may act on or a :class:`DnsWireError` with a stable ``reason`` (counted by
the resolver, never raised past it). Parsing and building are dnspython's (see
``resolver.py`` for why that library); this module adds the limits and the refusals.

Replies are new messages made from the query (``dns.message.make_response``: the client's id,
question and RD flag echoed), never the upstream's bytes, so nothing the upstream sent
(signatures, additional records, EDNS options) reaches the sandbox unless copied on purpose.
"""

from __future__ import annotations

import struct

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

__all__ = [
    "HEADER_BYTES",
    "REFUSED_TYPES",
    "DnsWireError",
    "formerr_from_header",
    "parse_query",
    "reply",
    "to_wire",
]

HEADER_BYTES = 12
CLASSIC_UDP_PAYLOAD = 512  # a client without EDNS gets at most this over UDP (RFC 1035)
# Types answered REFUSED whatever the policy: ANY would hand over every record of a name in one
# answer (RFC 8482 lets a server decline it), zone transfers and the obsolete mail types have no
# business in a sandbox; none of them is filtered record by record like A/AAAA/HTTPS are.
REFUSED_TYPES = frozenset(
    {
        dns.rdatatype.ANY,
        dns.rdatatype.AXFR,
        dns.rdatatype.IXFR,
        dns.rdatatype.MAILA,
        dns.rdatatype.MAILB,
    }
)


class DnsWireError(Exception):
    """A packet the resolver will not answer normally. ``reason`` is stable (a metric label):
    ``too_large``, ``short``, ``not_a_query``, ``malformed``, ``questions``, ``opcode``."""

    code = "network.dns_malformed"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def parse_query(wire: bytes, max_bytes: int) -> dns.message.Message:
    """The query in ``wire``: one question, opcode QUERY, class IN or other, at most
    ``max_bytes``.

    Raises:
        DnsWireError: too large, shorter than a header, a response (QR set: answering it could
            loop two servers), unparseable, not exactly one question, or an opcode other than
            QUERY (the resolver answers FORMERR/NOTIMP where a header is there to answer).
    """
    if len(wire) > max_bytes:
        raise DnsWireError("too_large", f"{len(wire)} bytes > {max_bytes}")
    if len(wire) < HEADER_BYTES:
        raise DnsWireError("short", f"{len(wire)} bytes")
    if wire[2] & 0x80:
        raise DnsWireError("not_a_query", "QR bit set")
    opcode = (wire[2] >> 3) & 0x0F
    if opcode != dns.opcode.QUERY:
        raise DnsWireError("opcode", f"opcode {opcode}")
    try:
        query = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError, KeyError, IndexError) as exc:
        raise DnsWireError("malformed", type(exc).__name__) from exc
    if len(query.question) != 1 or query.answer or query.authority:
        raise DnsWireError("questions", f"{len(query.question)} questions")
    return query


def formerr_from_header(wire: bytes, rcode: dns.rcode.Rcode = dns.rcode.FORMERR) -> bytes | None:
    """A bare error reply (no question) to a packet that has a query header; None when there
    is no header to answer or it is itself a response."""
    if len(wire) < HEADER_BYTES or wire[2] & 0x80:
        return None
    ident, flags = struct.unpack("!HH", wire[:4])
    keep = flags & (0x7800 | dns.flags.RD)  # opcode and RD, as the client sent them
    flags = keep | dns.flags.QR | dns.flags.RA | int(rcode)
    return struct.pack("!HHHHHH", ident, flags, 0, 0, 0, 0)


def reply(
    query: dns.message.Message,
    rcode: dns.rcode.Rcode = dns.rcode.NOERROR,
    ede: dns.edns.EDECode | None = None,
    ede_text: str | None = None,
) -> dns.message.Message:
    """A reply skeleton to ``query`` with ``rcode``; an EDE option (RFC 8914) when the client
    speaks EDNS and ``ede`` is given (a client without EDNS cannot carry options)."""
    response = dns.message.make_response(query, recursion_available=True, our_payload=1232)
    response.set_rcode(rcode)
    if ede is not None and query.edns >= 0:
        text = ede_text[:200] if ede_text else None
        response.use_edns(0, 0, 1232, options=[dns.edns.EDEOption(ede, text)])
    return response


def to_wire(response: dns.message.Message, query: dns.message.Message, tcp: bool) -> bytes:
    """``response`` as bytes for the client's transport: over UDP at most the client's EDNS
    payload (512 without EDNS), truncated with TC set past it so the client retries over TCP."""
    if tcp:
        return response.to_wire(max_size=65535)
    limit = max(query.payload, CLASSIC_UDP_PAYLOAD) if query.edns >= 0 else CLASSIC_UDP_PAYLOAD
    return response.to_wire(max_size=min(limit, 4096), prefer_truncation=True)
