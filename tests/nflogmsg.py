"""NFLOG messages built byte by byte the way ``nfnetlink_log.c`` lays them out, for the tests of
the parser (``nflogwire.py``) and the reader (``denials.DenialLog``); independent of the
module's own code on purpose."""

from __future__ import annotations

import ipaddress
import struct

__all__ = ["TCP_443", "UDP_53", "attr", "ipv4", "ipv6", "message"]

ULOG_PACKET = 4 << 8 | 0
TCP_443 = struct.pack("!HHIIHHHH", 40000, 443, 1, 0, 0x5002, 64240, 0, 0)
UDP_53 = struct.pack("!HHHH", 40000, 53, 8, 0)


def attr(kind: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)


def message(payload: bytes | None, prefix: bytes = b"sandpod_abc:3", group: int = 30001) -> bytes:
    """One ``NFULNL_MSG_PACKET``: packet header, prefix, input interface, payload."""
    body = struct.pack("!BBH", 2, 0, group)
    body += attr(1, struct.pack("!HBB", 0x0800, 2, 0))  # NFULA_PACKET_HDR (forward hook)
    body += attr(10, prefix + b"\0")  # NFULA_PREFIX
    body += attr(4, struct.pack("!I", 7))  # NFULA_IFINDEX_INDEV
    if payload is not None:
        body += attr(9, payload)  # NFULA_PAYLOAD
    raw = struct.pack("=IHHII", 16 + len(body), ULOG_PACKET, 0, 0, 0) + body
    return raw + b"\0" * (-len(raw) % 4)


def ipv4(dst: str, proto: int, l4: bytes, *, fragment: int = 0, options: bytes = b"") -> bytes:
    """An IPv4 packet from 10.240.16.3 to ``dst`` carrying ``l4``."""
    ihl = (20 + len(options)) // 4
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x40 | ihl,
        0,
        ihl * 4 + len(l4),
        1,
        fragment,
        64,
        proto,
        0,
        ipaddress.IPv4Address("10.240.16.3").packed,
        ipaddress.IPv4Address(dst).packed,
    )
    return header + options + l4


def ipv6(dst: str, next_header: int, rest: bytes) -> bytes:
    """An IPv6 packet from fd00::3 to ``dst``: ``rest`` after the fixed header."""
    return (
        struct.pack("!IHBB", 6 << 28, len(rest), next_header, 64)
        + ipaddress.IPv6Address("fd00::3").packed
        + ipaddress.IPv6Address(dst).packed
        + rest
    )
