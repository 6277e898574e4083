"""The few rtnetlink requests a sandbox's link needs, sent from this process: no ``ip`` spawned.

Why not iproute2 or pyroute2: a sandbox's veth was three ``ip`` processes (one through
``nsenter``), 10-15 ms of a 50 ms create on a loaded 2-core host; pyroute2 took as long (7 ms
for the host end's three requests: an event loop per call). These requests are each one
``sendmsg`` and one ack here, well under a millisecond for the whole link.

What is sent (``rtnetlink(7)``): ``RTM_NEWLINK`` a veth whose peer is created directly in a
process's network namespace (``IFLA_NET_NS_PID``), ``RTM_NEWLINK`` to bring a link up or turn
off its IPv6 address generation, ``RTM_NEWADDR`` (IPv4, or IPv6 with ``IFA_F_NODAD``) and
``RTM_NEWROUTE`` (a default route via a gateway). Every request asks for an ack; a refusal is
:class:`RtnlError` with the kernel's errno. The requests for the inside of a sandbox run on a
netlink socket opened by a thread that joined the holder's network namespace (``setns``: a
socket belongs to the namespace it was made in); that thread never runs anything else.
"""

from __future__ import annotations

import ctypes
import errno as errnos
import ipaddress
import itertools
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Rtnl", "RtnlError", "in_netns_of"]

T = TypeVar("T")

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 20, 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFF_UP = 0x1
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_PID, IFLA_AF_SPEC = 3, 18, 19, 26
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE = 8, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
IFA_F_NODAD = 0x02
RTA_GATEWAY, RTA_OIF = 5, 4
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
CLONE_NEWNET = 0x40000000
IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFADDR = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, proto, scope, type
HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
TIMEOUT = 5.0
_LIBC = ctypes.CDLL(None, use_errno=True)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RtnlError(OSError):
    """The kernel refused a request (``errno`` is its error); ``what`` names the request."""

    def __init__(self, err: int, what: str) -> None:
        super().__init__(err, f"{what}: {os.strerror(err)}")
        self.what = what


def _attr(kind: int, data: bytes) -> bytes:
    size = 4 + len(data)
    return struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)


def _name(value: str) -> bytes:
    return value.encode() + b"\0"


class Rtnl:
    """One rtnetlink socket in the network namespace of the thread that opened it."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self._sock.settimeout(TIMEOUT)
        self._sock.bind((0, 0))
        self._seq = itertools.count(1)

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def index(self, name: str) -> int:
        """The interface index of ``name`` in the calling thread's namespace (if_nametoindex(3)
        asks through a socket of its own, made in that thread's namespace)."""
        try:
            return socket.if_nametoindex(name)
        except OSError as exc:
            raise RtnlError(exc.errno or errnos.ENODEV, f"no link {name}") from exc

    def add_veth(self, name: str, peer: str, peer_netns_pid: int) -> None:
        """A veth pair: ``name`` here, ``peer`` created in the network namespace of
        ``peer_netns_pid`` (it never exists here). Fails if ``name`` exists."""
        peer_info = IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, _name(peer))
        peer_info += _attr(IFLA_NET_NS_PID, struct.pack("=I", peer_netns_pid))
        info = _attr(IFLA_INFO_KIND, b"veth\0") + _attr(
            IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info)
        )
        body = IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, _name(name))
        body += _attr(IFLA_LINKINFO, info)
        self._request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"add veth {name}")

    def set_up(self, index: int) -> None:
        body = IFINFO.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP)
        self._request(RTM_NEWLINK, 0, body, f"set link {index} up")

    def no_ipv6_addrgen(self, index: int) -> None:
        """No IPv6 link-local address for this link (``addrgenmode none``)."""
        mode = _attr(IFLA_INET6_ADDR_GEN_MODE, struct.pack("=B", IN6_ADDR_GEN_MODE_NONE))
        body = IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0)
        body += _attr(IFLA_AF_SPEC, _attr(socket.AF_INET6, mode))
        self._request(RTM_NEWLINK, 0, body, f"addrgenmode none on link {index}")

    def add_address(self, index: int, address: Address, prefixlen: int) -> None:
        """``address``/``prefixlen`` on the link (IPv6 without duplicate address detection)."""
        v6 = address.version == 6
        family = socket.AF_INET6 if v6 else socket.AF_INET
        flags = IFA_F_NODAD if v6 else 0
        body = IFADDR.pack(family, prefixlen, flags, RT_SCOPE_UNIVERSE, index)
        body += _attr(IFA_LOCAL, address.packed) + _attr(IFA_ADDRESS, address.packed)
        if v6:
            body += _attr(IFA_FLAGS, struct.pack("=I", flags))
        self._request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, f"add address {address}")

    def add_default_route(self, index: int, gateway: Address) -> None:
        family = socket.AF_INET6 if gateway.version == 6 else socket.AF_INET
        body = RTMSG.pack(
            family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0
        )
        body += _attr(RTA_GATEWAY, gateway.packed) + _attr(RTA_OIF, struct.pack("=I", index))
        self._request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body, f"default via {gateway}")

    def _request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        seq = next(self._seq)
        flags |= NLM_F_REQUEST | NLM_F_ACK
        self._sock.send(HEADER.pack(HEADER.size + len(body), kind, flags, seq, 0) + body)
        while True:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                raise RtnlError(errnos.ETIMEDOUT, what) from None
            offset = 0
            while offset + HEADER.size <= len(data):
                size, mtype, _, mseq, _ = HEADER.unpack_from(data, offset)
                if size < HEADER.size:
                    raise RtnlError(errnos.EBADMSG, what)
                if mseq == seq and mtype == NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", data, offset + HEADER.size)
                    if err:
                        raise RtnlError(-err, what)
                    return
                offset += (size + 3) & ~3


def in_netns_of(pid: int, work: Callable[[], T]) -> T:
    """``work()`` in a new thread that joined ``pid``'s network namespace (and then ends).

    Raises:
        RtnlError: cannot join it (the process is gone, or not ours to enter).
        Exception: whatever ``work`` raised.
    """
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            failure.append(RtnlError(exc.errno or errnos.ESRCH, f"netns of {pid}"))
            return
        try:
            if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                failure.append(RtnlError(ctypes.get_errno(), f"join netns of {pid}"))
                return
        finally:
            os.close(fd)
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
