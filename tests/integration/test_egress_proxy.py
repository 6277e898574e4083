"""The egress proxy against real sockets and real TLS: name rules checked on SNI and Host,
allowed bytes spliced unchanged, refusals where the policy says no, and a client that never
speaks cannot hold a slot.

The "internet" is loopback: upstream servers with their own test CA on 127.0.0.1, the proxy on
its own thread, and the original destination given by a table (the DNAT test in
test_egress_dnat.py proves the kernel path).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from egress_harness import (
    EchoServer,
    HttpServer,
    InternetCA,
    ProxyHarness,
    make_test_ca,
    running,
    server_tls,
)
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.proxymetrics import ProxyMetrics
from sandpod_lifecycle.network.verdict import HardDenies

LOOP = ipaddress.ip_address("127.0.0.1")


def allowlist(*names: str) -> NetworkPolicy:
    return NetworkPolicy.from_dict({"mode": "allowlist", "allow": list(names)})


@pytest.fixture
def internet_ca(tmp_path: Path) -> InternetCA:
    return make_test_ca(tmp_path / "internet", ["a.test", "b.test", "api.test"])


def client_tls(internet_ca: InternetCA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(internet_ca.ca_file))


def wait_until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        time.sleep(0.01)


def echo_both_ways(sock: socket.socket, size: int) -> tuple[str, str]:
    """Send ``size`` random bytes in 256 KiB pieces, reading each piece's echo before the next
    (one thread: an SSL socket must not be read and written from two threads at once);
    returns (sha256 sent, sha256 received)."""
    payload = os.urandom(size)
    received = hashlib.sha256()
    piece = 256 * 1024
    for start in range(0, size, piece):
        chunk = payload[start : start + piece]
        sock.sendall(chunk)
        got = 0
        while got < len(chunk):
            data = sock.recv(len(chunk) - got)
            assert data, "connection ended before the echo was complete"
            received.update(data)
            got += len(data)
    return hashlib.sha256(payload).hexdigest(), received.hexdigest()


@pytest.fixture
def echo(internet_ca: InternetCA) -> Iterator[EchoServer]:
    server = EchoServer("127.0.0.1", server_tls(internet_ca))
    with running(server):
        yield server


def test_allowed_sni_is_spliced_with_exact_bytes_and_the_real_certificate(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """An allowed name resolved to the destination passes; 4 MiB each way arrive unchanged
    and the client sees the upstream's own certificate (nothing intercepted)."""
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        raw = proxy.connect(echo.address)
        with client_tls(internet_ca).wrap_socket(raw, server_hostname="a.test") as tls:
            assert tls.getpeercert(binary_form=True) == internet_ca.cert_der
            sent, received = echo_both_ways(tls, 4 * 1024 * 1024)
        assert sent == received
        assert proxy.denials == []


def test_denied_name_on_an_allowed_shared_address_is_refused(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """b.test shares a.test's address (a CDN edge): a.test's rule does not open b.test."""
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        raw = proxy.connect(echo.address)
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            client_tls(internet_ca).wrap_socket(raw, server_hostname="b.test")
        raw.close()
        wait_until(lambda: proxy.denials)
        assert proxy.denials[0].kind == "sni"
        assert proxy.denials[0].destination == f"b.test:{echo.address[1]}"
        assert proxy.denials[0].rule == "mode:allowlist"
        assert echo.accepted == 0


def test_name_not_resolved_to_that_address_is_refused(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """An allowed name sent to an address it never resolved to (/etc/hosts pinning) fails."""
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[ipaddress.ip_address("127.0.0.2")] = {"a.test"}
    with running(proxy):
        raw = proxy.connect(echo.address)
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            client_tls(internet_ca).wrap_socket(raw, server_hostname="a.test")
        raw.close()
        wait_until(lambda: proxy.denials)
        assert proxy.denials[0].rule == "not-resolved"
        assert echo.accepted == 0


def test_tls_without_sni_is_refused_under_a_name_rule(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """IP-literal TLS (no SNI) to a name rule's address cannot say which name it wants."""
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[LOOP] = {"a.test"}
    context = client_tls(internet_ca)
    context.check_hostname = False
    with running(proxy):
        raw = proxy.connect(echo.address)
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            context.wrap_socket(raw)  # no server_hostname: no SNI
        raw.close()
        wait_until(lambda: proxy.denials)
        assert proxy.denials[0].rule == "no-name:tls"
        assert proxy.denials[0].kind == "connect"


def http_exchange(sock: socket.socket, request: bytes) -> bytes:
    sock.sendall(request)
    out = b""
    while b"\r\n\r\n" not in out:
        data = sock.recv(65536)
        if not data:
            return out
        out += data
    head, _, body = out.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_plain_http_host_mismatch_is_refused_on_every_request() -> None:
    """A denied Host gets 403 naming the rule; a keep-alive connection that switches its Host
    to a denied name on its second request is refused too, after its first answer."""
    server = HttpServer("127.0.0.1")
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[LOOP] = {"a.test"}
    with running(server, proxy):
        with proxy.connect(server.address) as sock:
            answer = http_exchange(sock, b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403")
        assert b"mode:allowlist" in answer
        with proxy.connect(server.address) as sock:
            first = http_exchange(sock, b"GET /1 HTTP/1.1\r\nHost: a.test\r\n\r\n")
            second = http_exchange(sock, b"GET /2 HTTP/1.1\r\nHost: b.test\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200")
        assert second.startswith(b"HTTP/1.1 403")
        assert [r.head for r in server.requests] == ["GET /1 HTTP/1.1"]
        assert {d.rule for d in proxy.denials} >= {"mode:allowlist"}


def test_slowloris_times_out_and_frees_its_slot(internet_ca: InternetCA, echo: EchoServer) -> None:
    """With one sniffing slot, a client that never sends its ClientHello is closed at the
    timeout and the next client then gets through."""
    settings = ProxySettings(sniff_timeout=0.5, max_sniffing=1)
    proxy = ProxyHarness(allowlist("a.test"), settings=settings)
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        slow = proxy.connect(echo.address)
        slow.sendall(b"\x16\x03\x01")  # a record header's start, then nothing
        wait_until(lambda: proxy.proxy.sniffing == 1)
        raw = proxy.connect(echo.address)
        with client_tls(internet_ca).wrap_socket(raw, server_hostname="a.test") as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"ping"
        assert slow.recv(1) == b""  # closed by the proxy
        slow.close()
        wait_until(lambda: proxy.proxy.sniffing == 0)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\xff",  # ClientHello declaring more than it has
        b"\x16\x03\x01\x00\x00",  # empty record
        b"\x16\x09\x01\x00\x10" + b"\x00" * 16,  # wrong version
        b"\x16\x03\x01\x00\x06\x02\x00\x00\x02\x03\x03",  # ServerHello from a client
        b"\x16\x03\x01\x40\x00" + b"\x01\x00\x3f\xfc" + b"\xff" * 16380,  # fields overrun
    ],
)
def test_malformed_client_hello_is_refused_and_the_proxy_keeps_serving(
    internet_ca: InternetCA, echo: EchoServer, garbage: bytes
) -> None:
    """Garbage dressed as TLS gets a decode_error alert and a close; the next client works."""
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        with proxy.connect(echo.address) as bad:
            bad.sendall(garbage)
            answer = b""
            while data := bad.recv(100):
                answer += data
        assert answer == bytes([21, 3, 3, 0, 2, 2, 50])
        raw = proxy.connect(echo.address)
        with client_tls(internet_ca).wrap_socket(raw, server_hostname="a.test") as tls:
            tls.sendall(b"ok")
            assert tls.recv(2) == b"ok"
        assert echo.accepted == 1


def test_a_sandbox_past_its_connection_limit_is_refused_until_one_closes(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """limits.maxConnections 1: a second connection while the first is open is refused with
    an event naming the limit; after the first closes, a new one goes through."""
    policy = NetworkPolicy.from_dict(
        {"mode": "allowlist", "allow": ["a.test"], "limits": {"maxConnections": 1}}
    )
    proxy = ProxyHarness(policy)
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        first = client_tls(internet_ca).wrap_socket(
            proxy.connect(echo.address), server_hostname="a.test"
        )
        with proxy.connect(echo.address) as second:
            assert second.recv(1) == b""
        wait_until(lambda: proxy.denials)
        assert proxy.denials[0].rule == "limits.maxConnections"
        first.close()
        wait_until(lambda: proxy.proxy.active == 0)
        with client_tls(internet_ca).wrap_socket(
            proxy.connect(echo.address), server_hostname="a.test"
        ) as third:
            third.sendall(b"x")
            assert third.recv(1) == b"x"


def test_denials_are_counted_always_and_reported_rate_limited(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """Five refused connections: the metric counts five (kind sni), the event callback gets
    the burst of two, the rest are dropped by the per-sandbox bucket."""
    registry = CollectorRegistry()
    settings = ProxySettings(denial_burst=2, denial_rate=0.001)
    proxy = ProxyHarness(allowlist("a.test"), settings=settings, metrics=ProxyMetrics(registry))
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        for _ in range(5):
            with proxy.connect(echo.address) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
                assert sock.recv(12) == b"HTTP/1.1 403"
        wait_until(
            lambda: (
                registry.get_sample_value("sandpod_lifecycle_network_denied_total", {"kind": "sni"})
                == 5
            )
        )
    assert len(proxy.denials) == 2
    assert echo.accepted == 0


def test_a_name_resolving_to_the_host_itself_is_not_reached_through_the_proxy(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """An allowed name whose record points at the host's loopback (or own address): the
    firewall's hard denies do not see the proxy's own connection, so the proxy refuses it
    (without HardDenies, as in the other tests here, the same connection goes through)."""
    proxy = ProxyHarness(allowlist("a.test"), forbidden=HardDenies())
    proxy.resolved[LOOP] = {"a.test"}
    with running(proxy):
        with proxy.connect(echo.address) as sock:
            assert sock.recv(1) == b""
        wait_until(lambda: proxy.denials)
        assert proxy.denials[0].kind == "connect"
        assert proxy.denials[0].rule == "hard-deny:127.0.0.0/8"
        assert echo.accepted == 0


def test_lookups_run_on_the_owner_loop_when_one_is_given(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """With ``owner_loop`` (the lifecycle's), the sandbox lookup, the resolver record and the
    denial callback run on that loop's thread, never on the proxy's."""
    owner = asyncio.new_event_loop()
    owner_thread = threading.Thread(target=owner.run_forever, daemon=True)
    owner_thread.start()
    try:
        proxy = ProxyHarness(allowlist("a.test"), owner_loop=owner)
        proxy.resolved[LOOP] = {"a.test"}
        with running(proxy):
            raw = proxy.connect(echo.address)
            with client_tls(internet_ca).wrap_socket(raw, server_hostname="a.test") as tls:
                tls.sendall(b"x")
                assert tls.recv(1) == b"x"
            with proxy.connect(echo.address) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
                assert sock.recv(12) == b"HTTP/1.1 403"
            wait_until(lambda: proxy.denials)
        assert proxy.lookup_threads == {owner_thread.ident}
        assert proxy.denial_threads == {owner_thread.ident}
    finally:
        owner.call_soon_threadsafe(owner.stop)
        owner_thread.join(5)
        owner.close()


def test_stopping_the_proxy_ends_open_connections_cleanly(
    internet_ca: InternetCA, echo: EchoServer
) -> None:
    """A spliced connection open at shutdown is closed (the client sees EOF), the thread ends
    without an error and nothing of the proxy is left listening."""
    proxy = ProxyHarness(allowlist("a.test"))
    proxy.resolved[LOOP] = {"a.test"}
    raw = proxy.connect(echo.address)
    tls = client_tls(internet_ca).wrap_socket(raw, server_hostname="a.test")
    tls.sendall(b"x")
    assert tls.recv(1) == b"x"
    proxy.close()
    assert tls.recv(1) == b""  # a ragged EOF: the proxy closed the TCP connection
    tls.close()
    assert proxy.proxy.active == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=5)
