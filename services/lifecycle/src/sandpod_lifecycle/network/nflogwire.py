"""NFLOG's netlink wire format: the config messages we send and the packet messages we read.

Pure functions over bytes, no socket (``nflog.py`` owns that), so every malformed input can be
tested without a kernel. The kernel side is ``net/netfilter/nfnetlink_log.c``: a message is a
``nlmsghdr`` (native byte order) of type ``NFNL_SUBSYS_ULOG << 8 | msg``, an ``nfgenmsg``
(family, version, group in network byte order), then netlink attributes. A logged packet
carries ``NFULA_PREFIX`` (the rule's ``log prefix``, NUL-terminated) and ``NFULA_PAYLOAD`` (the
packet from its network header, cut to the copy range): :func:`parse_batch` takes one
datagram, which may hold several messages, and returns what it could read of each; a message
it cannot read is counted and skipped, never raised, so nothing a packet carries can stop the
reader.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct

__all__ = [
    "CMD_BIND",
    "CMD_UNBIND",
    "COPY_PACKET",
    "MalformedLog",
    "Refused",
    "config_message",
    "error_of",
    "parse_batch",
    "parse_payload",
]

NETLINK_NETFILTER = 12
SUBSYS_ULOG = 4  # NFNL_SUBSYS_ULOG
MSG_PACKET, MSG_CONFIG = 0, 1  # NFULNL_MSG_*
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN = 1, 2, 3, 4
NLA_TYPE_MASK = ~(1 << 15 | 1 << 14) & 0xFFFF  # NLA_F_NESTED, NLA_F_NET_BYTEORDER

CFG_CMD, CFG_MODE, CFG_QTHRESH = 1, 2, 5  # NFULA_CFG_*
CMD_BIND, CMD_UNBIND = 1, 2  # NFULNL_CFG_CMD_* (never PF_BIND: that changes the host's logger)
COPY_PACKET = 2  # NFULNL_COPY_PACKET
NFULA_PAYLOAD, NFULA_PREFIX = 9, 10

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, portid
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (the group)
_NLATTR = struct.Struct("=HH")  # len, type
PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp", 136: "udplite"}
WITH_PORTS = {6, 17, 132, 136}
IPV6_EXTENSIONS = {0, 43, 60}  # hop-by-hop, routing, destination options: (len + 1) * 8
IPV6_FRAGMENT, IPV6_AH = 44, 51


class MalformedLog(ValueError):
    """A payload that is not an IPv4/IPv6 packet header we can read."""


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """One logged (refused) packet: which rule logged it and where it was going."""

    group: int
    prefix: str
    source: str
    destination: str
    protocol: str  # "tcp", "udp", "icmp", ... or the protocol number
    port: int | None  # the destination port (None: the protocol has none, or a fragment)

    @property
    def target(self) -> str:
        """``203.0.113.9:443/tcp``, ``[2001:db8::1]:53/udp``, ``203.0.113.9/icmp``."""
        host = f"[{self.destination}]" if ":" in self.destination else self.destination
        where = host if self.port is None else f"{host}:{self.port}"
        return f"{where}/{self.protocol}"


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, value: bytes) -> bytes:
    raw = _NLATTR.pack(_NLATTR.size + len(value), kind) + value
    return raw + b"\0" * (_align(len(raw)) - len(raw))


def config_message(
    group: int,
    seq: int,
    *,
    command: int | None = None,
    copy_range: int | None = None,
    qthreshold: int | None = None,
) -> bytes:
    """An ``NFULNL_MSG_CONFIG`` request for ``group`` (acknowledged: ``NLM_F_ACK``):
    ``command`` (bind/unbind), copy mode ``packet`` with ``copy_range`` bytes, the number of
    packets the kernel batches into one datagram (``qthreshold``)."""
    attrs = b""
    if command is not None:
        attrs += _attr(CFG_CMD, struct.pack("B", command))
    if copy_range is not None:
        attrs += _attr(CFG_MODE, struct.pack("!IBB", copy_range, COPY_PACKET, 0))
    if qthreshold is not None:
        attrs += _attr(CFG_QTHRESH, struct.pack("!I", qthreshold))
    body = _NFGENMSG.pack(0, 0, group) + attrs
    kind = SUBSYS_ULOG << 8 | MSG_CONFIG
    return (
        _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body
    )


def error_of(data: bytes, seq: int) -> int | None:
    """The errno of the kernel's answer to request ``seq`` in ``data`` (0: acknowledged),
    None: ``data`` holds no answer to it."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, got_seq, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            return None
        if kind == NLMSG_ERROR and got_seq == seq and length >= _NLMSGHDR.size + 4:
            (error,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
            return -int(error)
        offset += _align(length)
    return None


def parse_batch(data: bytes) -> tuple[list[Refused], int]:
    """The logged packets in one datagram, and how many of its messages could not be read
    (a truncated header ends the datagram: its length cannot be trusted for the rest)."""
    found: list[Refused] = []
    bad = 0
    offset = 0
    while offset < len(data):
        if offset + _NLMSGHDR.size > len(data):
            return found, bad + 1
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            return found, bad + 1
        if kind == SUBSYS_ULOG << 8 | MSG_PACKET:
            try:
                found.append(_packet(data[offset + _NLMSGHDR.size : offset + length]))
            except MalformedLog:
                bad += 1
        elif kind == NLMSG_DONE:
            break
        offset += _align(length)
    return found, bad


def _attrs(body: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    offset = 0
    while offset + _NLATTR.size <= len(body):
        length, kind = _NLATTR.unpack_from(body, offset)
        if length < _NLATTR.size or offset + length > len(body):
            raise MalformedLog("attribute overruns its message")
        out[kind & NLA_TYPE_MASK] = body[offset + _NLATTR.size : offset + length]
        offset += _align(length)
    return out


def _packet(body: bytes) -> Refused:
    if len(body) < _NFGENMSG.size:
        raise MalformedLog("no nfgenmsg")
    _, _, group = _NFGENMSG.unpack_from(body)
    attrs = _attrs(body[_NFGENMSG.size :])
    payload = attrs.get(NFULA_PAYLOAD)
    if payload is None:
        raise MalformedLog("no payload (copy mode is not packet)")
    prefix = attrs.get(NFULA_PREFIX, b"").split(b"\0", 1)[0].decode("ascii", "replace")
    source, destination, protocol, port = parse_payload(payload)
    return Refused(group, prefix, source, destination, protocol, port)


def parse_payload(payload: bytes) -> tuple[str, str, str, int | None]:
    """(source, destination, protocol, destination port or None) of a packet that starts at
    its IPv4 or IPv6 header (possibly cut short after the transport ports).

    Raises:
        MalformedLog: not an IP header, or one cut before its addresses.
    """
    if not payload:
        raise MalformedLog("empty payload")
    version = payload[0] >> 4
    if version == 4:
        return _ipv4(payload)
    if version == 6:
        return _ipv6(payload)
    raise MalformedLog(f"IP version {version}")


def _ipv4(p: bytes) -> tuple[str, str, str, int | None]:
    ihl = (p[0] & 0x0F) * 4
    if ihl < 20 or len(p) < ihl:
        raise MalformedLog("short IPv4 header")
    proto = p[9]
    fragment = struct.unpack_from("!H", p, 6)[0] & 0x1FFF
    src = str(ipaddress.IPv4Address(p[12:16]))
    dst = str(ipaddress.IPv4Address(p[16:20]))
    port = _port(p, ihl, proto) if fragment == 0 else None
    return src, dst, PROTOCOLS.get(proto, str(proto)), port


def _ipv6(p: bytes) -> tuple[str, str, str, int | None]:
    if len(p) < 40:
        raise MalformedLog("short IPv6 header")
    src = str(ipaddress.IPv6Address(p[8:24]))
    dst = str(ipaddress.IPv6Address(p[24:40]))
    proto, offset = p[6], 40
    for _ in range(8):  # a bounded walk over extension headers
        if proto not in IPV6_EXTENSIONS | {IPV6_FRAGMENT, IPV6_AH} or offset + 8 > len(p):
            break
        nxt = p[offset]
        if proto == IPV6_FRAGMENT:
            if struct.unpack_from("!H", p, offset + 2)[0] >> 3:  # not the first fragment
                return src, dst, PROTOCOLS.get(nxt, str(nxt)), None
            proto, offset = nxt, offset + 8
        elif proto == IPV6_AH:
            proto, offset = nxt, offset + (p[offset + 1] + 2) * 4
        else:
            proto, offset = nxt, offset + (p[offset + 1] + 1) * 8
    return src, dst, PROTOCOLS.get(proto, str(proto)), _port(p, offset, proto)


def _port(p: bytes, offset: int, proto: int) -> int | None:
    if proto not in WITH_PORTS or offset + 4 > len(p):
        return None
    return int(struct.unpack_from("!H", p, offset + 2)[0])
