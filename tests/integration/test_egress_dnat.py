"""The egress proxy behind a real nftables DNAT: SO_ORIGINAL_DST on the real kernel.

Two network namespaces the test creates: ``sb`` (the sandbox) and ``gw`` (the node), joined by
a veth. In ``gw`` a dummy link holds a "public" address (11.22.33.44 and 2a00:1:2:3::44) with a
TLS echo server on port 443, and an nftables prerouting rule DNATs every TCP/443 connection
coming in from the veth to the proxy on the gateway address, as the firewall does for a
sandbox. A client in ``sb`` connects to the public address; the proxy recovers it from
conntrack (IPv4 ``SO_ORIGINAL_DST``, IPv6 ``IP6T_SO_ORIGINAL_DST``), checks the SNI against it
and splices. Sockets are created in a namespace by switching the creating thread's network
namespace (``setns``) for the moment of their creation; the proxy's thread is started inside
``gw`` so its upstream sockets are there too. Both namespaces are deleted at the end (with the
veth and the nftables table in them) and the test checks nothing is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from egress_harness import EchoServer, InternetCA, make_test_ca, server_tls
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.proxy import EgressProxy
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.proxythread import ProxyThread, listen
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxNet

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
PUBLIC4 = "11.22.33.44"
PUBLIC6 = "2a00:1:2:3::44"
GW4, SB4 = "10.77.0.1", "10.77.0.2"
GW6, SB6 = "fd00:77::1", "fd00:77::2"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: run as root (CI does)")


def _run(*argv: str, stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the block with this thread in network namespace ``name``."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


@contextlib.contextmanager
def two_namespaces() -> Iterator[tuple[str, str, str]]:
    tag = uuid.uuid4().hex[:8]
    gw, sb = f"spxg{tag}", f"spxs{tag}"
    veth_gw, veth_sb = f"pxg{tag}", f"pxs{tag}"
    _run("ip", "netns", "add", gw)
    try:
        _run("ip", "netns", "add", sb)
        _run("ip", "-n", gw, "link", "add", veth_gw, "type", "veth", "peer", veth_sb, "netns", sb)
        for ns, link, v4, v6 in ((gw, veth_gw, GW4, GW6), (sb, veth_sb, SB4, SB6)):
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{v4}/30", "dev", link)
            _run("ip", "-n", ns, "addr", "add", f"{v6}/64", "dev", link, "nodad")
            _run("ip", "-n", ns, "link", "set", link, "up")
        _run("ip", "-n", gw, "addr", "add", f"{PUBLIC4}/32", "dev", "lo")
        _run("ip", "-n", gw, "addr", "add", f"{PUBLIC6}/128", "dev", "lo", "nodad")
        _run("ip", "-n", sb, "route", "add", "default", "via", GW4)
        _run("ip", "-n", sb, "-6", "route", "add", "default", "via", GW6)
        yield gw, sb, veth_gw
    finally:
        for ns in (sb, gw):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        assert not Path(f"/run/netns/{gw}").exists() and not Path(f"/run/netns/{sb}").exists()
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
        assert tag not in links.stdout


@pytest.fixture
def internet_ca(tmp_path: Path) -> InternetCA:
    return make_test_ca(tmp_path / "internet", ["a.test", "b.test"])


def install_dnat(gw: str, veth: str, port: int) -> None:
    """What the firewall does for a sandbox: its TCP/443 goes to the proxy."""
    rules = f"""
    table inet sandpod_proxytest {{
        chain pre {{
            type nat hook prerouting priority dstnat;
            iifname "{veth}" meta nfproto ipv4 tcp dport 443 dnat ip to {GW4}:{port}
            iifname "{veth}" meta nfproto ipv6 tcp dport 443 dnat ip6 to [{GW6}]:{port}
        }}
    }}
    """
    _run("ip", "netns", "exec", gw, "nft", "-f", "-", stdin=rules)


@pytest.mark.parametrize(("public", "sandbox"), [(PUBLIC4, SB4), (PUBLIC6, SB6)])
def test_dnat_original_destination_reaches_the_proxy_check(
    internet_ca: InternetCA, public: str, sandbox: str
) -> None:
    """A sandbox connection to public:443, DNAT'ed by nftables, is checked against the address
    it was really sent to: an allowed, resolved SNI is spliced to it; SNI of another name on
    the same address, and the allowed name to an address it never resolved to, are refused."""
    resolved: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, set[str]] = {}
    denials: list[Denial] = []
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["a.test"]})
    sources: list[object] = []

    def lookup(source: str) -> SandboxNet | None:
        sources.append(source)
        return SandboxNet("sbx-dnat", policy) if str(source) == sandbox else None

    with two_namespaces() as (gw, sb, veth):
        with in_netns(gw):
            listener = listen(GW4 if "." in public else GW6)
            echo = EchoServer(public, server_tls(internet_ca), port=443)
            proxy = EgressProxy(
                ProxySettings(),
                lookup=lookup,
                resolved_names=lambda sid, ip: resolved.get(ipaddress.ip_address(ip), set()),
                on_denied=denials.append,
            )
            thread = ProxyThread(proxy, [listener])
            thread.start()
        install_dnat(gw, veth, listener.getsockname()[1])
        try:
            client = ssl.create_default_context(cafile=str(internet_ca.ca_file))
            resolved[ipaddress.ip_address(public)] = {"a.test"}
            with in_netns(sb):
                raw = socket.create_connection((public, 443), timeout=10)
            with client.wrap_socket(raw, server_hostname="a.test") as tls:
                assert tls.getpeercert(binary_form=True) == internet_ca.cert_der
                tls.sendall(b"through the DNAT")
                assert tls.recv(100) == b"through the DNAT"
            assert echo.accepted == 1

            with in_netns(sb):
                raw = socket.create_connection((public, 443), timeout=10)
            with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
                client.wrap_socket(raw, server_hostname="b.test")
            raw.close()

            resolved.clear()  # a.test now resolved to some other address only
            with in_netns(sb):
                raw = socket.create_connection((public, 443), timeout=10)
            with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
                client.wrap_socket(raw, server_hostname="a.test")
            raw.close()
        finally:
            thread.stop()
            echo.close()
        assert thread.error is None
        assert [(d.destination, d.rule) for d in denials] == [
            ("b.test:443", "mode:allowlist"),
            ("a.test:443", "not-resolved"),
        ]
        assert echo.accepted == 1
        assert {str(s) for s in sources} == {sandbox}
