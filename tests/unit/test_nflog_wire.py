"""NFLOG's wire format (``nflogwire.py``): logged packets read, malformed ones skipped.

Messages are built byte by byte the way ``nfnetlink_log.c`` lays them out (``nflogmsg.py``),
independent of the module's own builder; the parser is a pure function, so every short or lying
length is tried without a kernel.
"""

from __future__ import annotations

import errno
import random
import struct

import pytest

from nflogmsg import TCP_443, UDP_53, attr, ipv4, ipv6, message
from sandpod_lifecycle.network.nflogwire import (
    CMD_BIND,
    MalformedLog,
    config_message,
    error_of,
    parse_batch,
    parse_payload,
)


def test_a_logged_tcp_packet_names_its_destination_prefix_and_group() -> None:
    """An IPv4 TCP SYN (with IP options) reads as ``203.0.113.9:443/tcp``, with the rule's
    prefix and the group it was logged to."""
    data = message(ipv4("203.0.113.9", 6, TCP_443, options=b"\x01" * 8))
    (refused,), bad = parse_batch(data)
    assert bad == 0
    assert (refused.group, refused.prefix, refused.source) == (
        30001,
        "sandpod_abc:3",
        "10.240.16.3",
    )
    assert refused.target == "203.0.113.9:443/tcp"


def test_several_messages_in_one_datagram_and_the_other_protocols() -> None:
    """UDP, ICMP (no port), a later IPv4 fragment (no port), IPv6 through extension headers,
    an IPv6 non-first fragment: all in one datagram, read in order; NLMSG_DONE ends it."""
    hop_by_hop = bytes([17, 0]) + b"\0" * 6  # next: UDP, length (0 + 1) * 8
    fragment = bytes([6, 0]) + struct.pack("!HI", 8 << 3, 1)  # next: TCP, offset 8: not first
    datagram = b"".join(
        [
            message(ipv4("198.51.100.7", 17, UDP_53)),
            message(ipv4("198.51.100.8", 1, b"\x08\0\0\0\0\0\0\0")),
            message(ipv4("198.51.100.9", 6, TCP_443[:4], fragment=185)),
            message(ipv6("2001:db8::1", 0, hop_by_hop + UDP_53)),
            message(ipv6("2001:db8::2", 44, fragment + b"\0" * 8)),
            struct.pack("=IHHII", 16, 3, 0, 0, 0),  # NLMSG_DONE
            message(ipv4("198.51.100.10", 6, TCP_443)),  # after DONE: not read
        ]
    )
    refused, bad = parse_batch(datagram)
    assert bad == 0
    assert [r.target for r in refused] == [
        "198.51.100.7:53/udp",
        "198.51.100.8/icmp",
        "198.51.100.9/tcp",
        "[2001:db8::1]:53/udp",
        "[2001:db8::2]/tcp",
    ]


def test_a_payload_cut_before_the_ports_still_names_the_address() -> None:
    """A copy range that ends inside the transport header leaves the port unknown."""
    assert parse_payload(ipv4("203.0.113.9", 6, TCP_443[:3])) == (
        "10.240.16.3",
        "203.0.113.9",
        "tcp",
        None,
    )


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x45",  # IPv4, nothing else
        ipv4("203.0.113.9", 6, TCP_443)[:19],  # cut inside the addresses
        b"\x43" + ipv4("203.0.113.9", 6, TCP_443)[1:],  # IHL 3: shorter than a header
        b"\x4f" + ipv4("203.0.113.9", 6, b"")[1:],  # IHL 15 (60 bytes) on a 20-byte packet
        ipv6("2001:db8::1", 17, UDP_53)[:39],
        b"\x50" + b"\0" * 40,  # IP version 5
    ],
    ids=["empty", "one-byte", "cut-address", "ihl-3", "ihl-past-end", "short-ipv6", "version-5"],
)
def test_a_malformed_payload_raises_malformed_log(payload: bytes) -> None:
    """Anything that is not an IP header with its addresses is MalformedLog, nothing else."""
    with pytest.raises(MalformedLog):
        parse_payload(payload)


def test_malformed_messages_are_counted_and_skipped() -> None:
    """A message without a payload, or with a bad payload or an attribute overrunning it, is
    counted and the good ones around it are read; a header whose length lies ends the
    datagram (counted once)."""
    good = message(ipv4("203.0.113.9", 6, TCP_443))
    no_payload = message(None)
    bad_payload = message(b"\x45\0\0")
    overrun = bytearray(message(ipv4("203.0.113.9", 6, TCP_443)))
    struct.pack_into("=H", overrun, 16 + 4, 200)  # the first attribute claims 200 bytes
    refused, bad = parse_batch(good + no_payload + bad_payload + bytes(overrun) + good)
    assert (len(refused), bad) == (2, 3)
    lying = bytearray(good)
    struct.pack_into("=I", lying, 0, 4096)  # longer than the datagram
    assert parse_batch(good + bytes(lying)) == (parse_batch(good)[0], 1)
    too_short = bytearray(good)
    struct.pack_into("=I", too_short, 0, 8)  # shorter than its own header
    assert parse_batch(bytes(too_short))[1] == 1
    assert parse_batch(good[:10]) == ([], 1)  # a cut header
    assert parse_batch(b"") == ([], 0)


def test_no_byte_sequence_makes_the_parser_raise() -> None:
    """Every truncation and thousands of random corruptions of a datagram parse without an
    exception (the reader must never stop on what a packet carries)."""
    datagram = message(ipv4("203.0.113.9", 6, TCP_443)) + message(ipv6("2001:db8::1", 17, UDP_53))
    for end in range(len(datagram)):
        parse_batch(datagram[:end])
    rnd = random.Random(7)
    for _ in range(5000):
        corrupt = bytearray(datagram)
        for _ in range(rnd.randrange(1, 6)):
            corrupt[rnd.randrange(len(corrupt))] = rnd.randrange(256)
        refused, bad = parse_batch(bytes(corrupt))
        assert len(refused) + bad <= 3


def test_config_requests_and_their_acks() -> None:
    """A bind request is one ULOG config message asking for an ack; ``error_of`` finds the
    kernel's answer to that sequence number (0: done, else the errno) and ignores others."""
    msg = config_message(30001, 9, command=CMD_BIND, copy_range=128, qthreshold=1)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq) == (len(msg), 4 << 8 | 1, 0x1 | 0x4, 9)
    assert struct.unpack_from("!BBH", msg, 16) == (0, 0, 30001)
    assert attr(1, bytes([CMD_BIND])) in msg
    assert attr(2, struct.pack("!IBB", 128, 2, 0)) in msg  # copy mode packet, 128 bytes

    def answer(seq: int, error: int) -> bytes:
        return struct.pack("=IHHII", 36, 2, 0, seq, 0) + struct.pack("=i", error) + msg[:16]

    assert error_of(answer(9, 0), 9) == 0
    assert error_of(answer(9, -errno.EPERM), 9) == errno.EPERM
    assert error_of(answer(8, -errno.EPERM), 9) is None
    assert error_of(message(ipv4("203.0.113.9", 6, TCP_443)) + answer(9, 0), 9) == 0
    assert error_of(answer(9, 0)[:18], 9) is None
