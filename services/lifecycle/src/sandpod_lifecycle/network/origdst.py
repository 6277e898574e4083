"""The destination a DNAT'ed connection was really sent to (``SO_ORIGINAL_DST``).

nftables rewrites a sandbox's connection to ``<gateway>:<proxy port>``; conntrack remembers the
address before the rewrite and hands it back on the accepted socket: ``getsockopt(SOL_IP,
SO_ORIGINAL_DST)`` for IPv4 (a ``sockaddr_in``), ``getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST)``
for IPv6 (a ``sockaddr_in6``); both options are number 80. The proxy takes the lookup as a
parameter (:data:`OriginalDst`) so its unit tests can run without a DNAT; the real one is tested
against a real nftables DNAT in a network namespace.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable

__all__ = ["NoOriginalDst", "OriginalDst", "original_dst"]

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
IP6T_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv6/ip6_tables.h
_SOL_IPV6 = getattr(socket, "SOL_IPV6", 41)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
OriginalDst = Callable[[socket.socket], tuple[IPAddress, int]]


class NoOriginalDst(OSError):
    """The socket was not DNAT'ed (conntrack has no entry): someone connected to the proxy's
    own address directly."""


def original_dst(sock: socket.socket) -> tuple[IPAddress, int]:
    """The (address, port) the peer of an accepted ``sock`` connected to before DNAT.

    Raises:
        NoOriginalDst: conntrack knows no original destination for it.
    """
    try:
        if sock.family == socket.AF_INET6:
            raw = sock.getsockopt(_SOL_IPV6, IP6T_SO_ORIGINAL_DST, 28)
            port = struct.unpack_from("!H", raw, 2)[0]
            address: IPAddress = ipaddress.IPv6Address(raw[8:24])
        else:
            raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            port = struct.unpack_from("!H", raw, 2)[0]
            address = ipaddress.IPv4Address(raw[4:8])
    except OSError as exc:
        raise NoOriginalDst(exc.errno, f"no original destination: {exc.strerror}") from exc
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, port
