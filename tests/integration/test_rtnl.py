"""The rtnetlink requests a sandbox's link is made with (``network/rtnl.py``), against the real
kernel: a veth into another process's network namespace, read back with iproute2, and the
kernel's refusals as typed errors. The whole egress path over it is in ``test_net_local.py``."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandpod_lifecycle.network.addressing import SandboxAddresses
from sandpod_lifecycle.network.link import LinkError, LinkNames, delete
from sandpod_lifecycle.network.rtnl import Rtnl, RtnlError, in_netns_of

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="creates links and joins network namespaces: run as root, as CI does"
)

HOST, INSIDE = ipaddress.IPv4Address("10.231.7.0"), ipaddress.IPv4Address("10.231.7.1")
HOST6, INSIDE6 = ipaddress.IPv6Address("fd5a::7:0"), ipaddress.IPv6Address("fd5a::7:1")


@pytest.fixture
def netns_pid() -> Iterator[int]:
    """A process alone in a new network namespace (what a holder is to a sandbox's link)."""
    proc = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"])
    try:
        ns = f"/proc/{proc.pid}/ns/net"
        while os.readlink(ns) == os.readlink("/proc/self/ns/net"):  # unshare not done yet
            if proc.poll() is not None:
                pytest.fail(f"unshare --net exited {proc.returncode}")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def name() -> Iterator[str]:
    ifname = f"sprt{uuid.uuid4().hex[:8]}"
    yield ifname
    delete(ifname)


def _ip(*argv: str, pid: int | None = None) -> Any:
    inside = ["nsenter", f"--target={pid}", "--net", "--"] if pid else []
    out = subprocess.run([*inside, "ip", "-j", *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def _addresses(ifname: str, pid: int | None = None) -> set[str]:
    (link,) = _ip("addr", "show", "dev", ifname, pid=pid)
    return {f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"]}


def test_a_veth_into_another_namespace_is_addressed_up_and_routed_on_both_ends(
    netns_pid: int, name: str
) -> None:
    with Rtnl() as nl:
        nl.add_veth(name, "eth0", netns_pid)
        host = nl.index(name)
        nl.add_address(host, HOST, 31)
        nl.add_address(host, HOST6, 127)
        nl.set_up(host)

    def inside() -> int:
        with Rtnl() as nl:
            eth0 = nl.index("eth0")
            nl.no_ipv6_addrgen(eth0)
            nl.add_address(eth0, INSIDE, 31)
            nl.add_address(eth0, INSIDE6, 127)
            nl.set_up(eth0)
            nl.add_default_route(eth0, HOST)
            nl.add_default_route(eth0, HOST6)
            return eth0

    in_netns_of(netns_pid, inside)
    (host_end,) = _ip("link", "show", "dev", name)
    assert "link_netnsid" in host_end  # its peer was made in the other namespace, never here
    assert {"10.231.7.0/31", "fd5a::7:0/127"} <= _addresses(name)
    # inside: exactly its two addresses (no link-local one: addrgenmode none), up, routed
    assert _addresses("eth0", netns_pid) == {"10.231.7.1/31", "fd5a::7:1/127"}
    (eth0,) = _ip("link", "show", "dev", "eth0", pid=netns_pid)
    assert "UP" in eth0["flags"]
    routes = _ip("route", "show", "default", pid=netns_pid)
    routes6 = _ip("-6", "route", "show", "default", pid=netns_pid)
    assert [(r["gateway"], r["dev"]) for r in routes] == [("10.231.7.0", "eth0")]
    assert [(r["gateway"], r["dev"]) for r in routes6] == [("fd5a::7:0", "eth0")]
    # the IPv6 addresses are usable at once (no duplicate address detection pending)
    assert not any(
        a.get("tentative") for i in _ip("addr", "show", pid=netns_pid) for a in i["addr_info"]
    )
    # traffic flows: from inside, a TCP connection to a listener on the host end's address
    with socket.create_server((str(HOST), 0)) as server:
        port = server.getsockname()[1]

        def connect() -> str:
            with socket.create_connection((str(HOST), port), timeout=10) as conn:
                return str(conn.getsockname()[0])

        assert in_netns_of(netns_pid, connect) == str(INSIDE)


def test_the_kernels_refusals_are_typed_errors_and_leave_nothing_half_made(
    netns_pid: int, name: str
) -> None:
    with Rtnl() as nl:
        nl.add_veth(name, "eth0", netns_pid)
        with pytest.raises(RtnlError) as taken:
            nl.add_veth(name, "eth1", netns_pid)  # the name is taken
        assert taken.value.errno == errno.EEXIST
        with pytest.raises(RtnlError) as missing:
            nl.index("sprt-none")
        assert missing.value.errno == errno.ENODEV
        with pytest.raises(RtnlError) as bad:
            nl.add_address(nl.index(name), HOST, 33)  # no /33
        assert bad.value.errno == errno.EINVAL
    # a process that is gone: its namespace cannot be joined
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(RtnlError) as joined:
        in_netns_of(gone.pid, lambda: None)
    assert joined.value.errno == errno.ENOENT

    # an error inside reaches the caller, from the namespace's thread
    def host_end_inside() -> int:
        with Rtnl() as nl:
            return nl.index(name)  # the host end is not in there

    with pytest.raises(RtnlError) as inside:
        in_netns_of(netns_pid, host_end_inside)
    assert inside.value.errno == errno.ENODEV


def test_a_sandbox_link_for_a_holder_that_is_gone_is_a_link_error(name: str) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    links = LinkNames.of("abcdef0000")
    addrs = SandboxAddresses(index=7, host=HOST, sandbox=INSIDE)
    with pytest.raises(LinkError, match="cannot set up the link"):
        links.create(addrs, gone.pid)
    assert not os.path.exists(f"/sys/class/net/{links.sandbox(7)}")


def test_a_sandbox_link_carries_traffic_the_moment_it_is_made(name: str) -> None:
    """When ``LinkNames.create`` returns, the host end is operational, not only up: a veth end
    brought up before its peer gets its transmit queue from the kernel's linkwatch work, later
    (until then a noop queue drops what the host sends, a sandbox's first ARP reply among
    them: its first connection waited a 1 s ARP retry, or failed on a busy host, although the
    sandbox was Ready). Many links, each checked at once (it was late about one time in
    three), and the first connection from inside goes through."""
    links = LinkNames.of("abcdef0000")
    late: list[tuple[int, str]] = []
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = server.getsockname()[1]
        for index in range(40):
            holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"])
            try:
                ns = f"/proc/{holder.pid}/ns/net"
                while os.readlink(ns) == os.readlink("/proc/self/ns/net"):
                    assert holder.poll() is None, f"unshare --net exited {holder.returncode}"
                base = HOST + 2 * index
                host_end = links.create(SandboxAddresses(index, base, base + 1), holder.pid)
                state = Path(f"/sys/class/net/{host_end}/operstate").read_text().strip()
                if state != "up":
                    late.append((index, state))

                def connect(to: str = str(base)) -> None:
                    socket.create_connection((to, port), timeout=10).close()

                in_netns_of(holder.pid, connect)
                server.accept()[0].close()
            finally:
                delete(links.sandbox(index))
                holder.kill()
                holder.wait()
    assert late == [], f"host ends not operational when create returned: {late}"
