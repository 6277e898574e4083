"""Secrets that never enter the sandbox: the egress proxy terminates TLS for an ``inject``
domain with the installation's authority, adds the header with the secret's value and sends
the request on over verified TLS, while the sandbox only ever held the placeholder.

Real TLS everywhere: the "real" server has its own test CA (the proxy verifies it against that
bundle), the client trusts only what ``InterceptionCA.trust_pem`` returns for its domains.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import os
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import wait_until
from egress_harness import (
    EchoServer,
    HttpServer,
    InternetCA,
    ProxyHarness,
    Server,
    SilentServer,
    make_test_ca,
    running,
    send_until_blocked,
    server_tls,
)
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.ca import CaError, InterceptionCA
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.secretstore import FileSecretStore, placeholder, placeholder_env

LOOP = ipaddress.ip_address("127.0.0.1")
SECRET = "sk-real-value-0123456789"
POLICY = NetworkPolicy.from_dict(
    {
        "mode": "allowlist",
        "allow": ["api.test", "a.test"],
        "inject": [{"domain": "api.test", "secret": "apikey", "header": "Authorization"}],
    }
)


@pytest.fixture
def internet_ca(tmp_path: Path) -> InternetCA:
    return make_test_ca(tmp_path / "internet", ["api.test", "a.test", "evil.test"])


@pytest.fixture
def authority(tmp_path: Path) -> InterceptionCA:
    return InterceptionCA(tmp_path / "state" / "egress-ca", "inst-test")


@pytest.fixture
def store(tmp_path: Path) -> FileSecretStore:
    secrets = FileSecretStore(tmp_path / "state" / "secrets")
    secrets.put("apikey", SECRET)
    return secrets


@pytest.fixture
def proxy(
    internet_ca: InternetCA, authority: InterceptionCA, store: FileSecretStore
) -> Iterator[ProxyHarness]:
    harness = ProxyHarness(
        POLICY,
        settings=ProxySettings(upstream_ca_file=internet_ca.ca_file),
        ca=authority,
        secrets=store,
    )
    harness.resolved[LOOP] = {"api.test", "a.test"}
    with running(harness):
        yield harness


def sandbox_tls(authority: InterceptionCA) -> ssl.SSLContext:
    """What a sandbox under POLICY trusts: the authority for its inject domains, nothing else."""
    return ssl.create_default_context(cadata=authority.trust_pem(["api.test"]))


def https(sock: ssl.SSLSocket, host: str) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(host)
    conn.sock = sock
    return conn


def test_injected_header_reaches_the_server_and_the_sandbox_only_held_a_placeholder(
    internet_ca: InternetCA, authority: InterceptionCA, proxy: ProxyHarness
) -> None:
    """Two keep-alive requests with the placeholder (one a 3 MiB chunked upload, streamed):
    the server gets the secret in Authorization both times and the body unchanged."""
    env = placeholder_env(POLICY)
    assert env == {"SANDPOD_SECRET_APIKEY": placeholder("apikey")}
    assert SECRET not in repr(env)
    server = HttpServer("127.0.0.1", server_tls(internet_ca))
    chunks = [os.urandom(64 * 1024) for _ in range(48)]
    with running(server):
        raw = proxy.connect(server.address)
        with sandbox_tls(authority).wrap_socket(raw, server_hostname="api.test") as tls:
            assert "Sandpod egress inst-test api.test" in repr(tls.getpeercert())
            conn = https(tls, "api.test")
            bearer = f"Bearer {env['SANDPOD_SECRET_APIKEY']}"
            conn.request("GET", "/first", headers={"Authorization": bearer})
            first = conn.getresponse()
            assert (first.status, first.read()) == (200, b"got 0")
            conn.request(
                "POST",
                "/upload",
                body=iter(chunks),
                headers={"Authorization": bearer},
                encode_chunked=True,
            )
            second = conn.getresponse()
            assert (second.status, second.read()) == (200, b"got %d" % (48 * 64 * 1024))
            conn.request("GET", "/no-header")  # added even when the sandbox sent none
            assert conn.getresponse().read() == b"got 0"
    assert [r.headers["authorization"] for r in server.requests] == [f"Bearer {SECRET}"] * 3
    assert (
        hashlib.sha256(server.requests[1].body).digest()
        == hashlib.sha256(b"".join(chunks)).digest()
    )
    assert all(placeholder("apikey") not in r.headers.values() for r in server.requests)


def test_a_domain_without_injection_is_not_intercepted(
    internet_ca: InternetCA, proxy: ProxyHarness
) -> None:
    """a.test has no inject entry: the client sees the real server's certificate."""
    echo = EchoServer("127.0.0.1", server_tls(internet_ca))
    with running(echo):
        raw = proxy.connect(echo.address)
        context = ssl.create_default_context(cafile=str(internet_ca.ca_file))
        with context.wrap_socket(raw, server_hostname="a.test") as tls:
            assert tls.getpeercert(binary_form=True) == internet_ca.cert_der
            tls.sendall(b"untouched")
            assert tls.recv(100) == b"untouched"


def test_intercepted_request_for_another_host_is_refused_without_the_secret(
    internet_ca: InternetCA, authority: InterceptionCA, proxy: ProxyHarness
) -> None:
    """Domain fronting inside intercepted TLS (SNI api.test, Host evil.test) gets 403 and the
    server never sees the request, so the secret cannot be sent to another virtual host."""
    server = HttpServer("127.0.0.1", server_tls(internet_ca))
    with running(server):
        raw = proxy.connect(server.address)
        with sandbox_tls(authority).wrap_socket(raw, server_hostname="api.test") as tls:
            conn = https(tls, "evil.test")
            conn.request("GET", "/", headers={"Host": "evil.test"})
            answer = conn.getresponse()
            assert answer.status == 403
            assert b"evil.test" in answer.read()
    wait_until(lambda: bool(proxy.denials), 10, "the denial event")
    assert proxy.denials[-1].rule == "host-mismatch"
    assert server.requests == []


def test_plain_http_to_an_inject_domain_is_injected_too(
    store: FileSecretStore, authority: InterceptionCA
) -> None:
    """Port 80 to api.test: the header is replaced there as well."""
    server = HttpServer("127.0.0.1")
    harness = ProxyHarness(POLICY, ca=authority, secrets=store)
    harness.resolved[LOOP] = {"api.test"}
    with running(server, harness), harness.connect(server.address) as sock:
        sock.sendall(
            b"GET / HTTP/1.1\r\nHost: api.test\r\n"
            b"Authorization: Bearer sandpod-placeholder-apikey\r\n\r\n"
        )
        assert sock.recv(1000).startswith(b"HTTP/1.1 200")
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


def test_a_missing_secret_refuses_instead_of_sending_the_placeholder(
    internet_ca: InternetCA, authority: InterceptionCA, store: FileSecretStore
) -> None:
    """Without the secret's value the connection is refused, never forwarded as it is."""
    store.delete("apikey")
    server = HttpServer("127.0.0.1", server_tls(internet_ca))
    harness = ProxyHarness(POLICY, ca=authority, secrets=store)
    harness.resolved[LOOP] = {"api.test"}
    with running(server, harness):
        raw = harness.connect(server.address)
        with pytest.raises(ssl.SSLError, match="ACCESS_DENIED"):
            sandbox_tls(authority).wrap_socket(raw, server_hostname="api.test")
        raw.close()
    assert server.accepted == 0
    assert harness.denials[0].rule == "secret-unavailable:apikey"


def test_the_authority_is_trusted_for_its_domain_only(authority: InterceptionCA) -> None:
    """A certificate for another name signed by api.test's authority (what a leaked key could
    mint) is rejected by a client that trusts that authority: the name constraint holds."""
    for name, ok in (("api.test", True), ("evil.test", False), ("x.api.test", True)):
        context = authority.server_context("api.test", name)
        a, b = socket.socketpair()
        server = threading.Thread(target=_serve_handshake, args=(context, b), daemon=True)
        server.start()
        client = ssl.create_default_context(cadata=authority.trust_pem(["api.test"]))
        try:
            if ok:
                with client.wrap_socket(a, server_hostname=name) as tls:
                    assert tls.version() is not None
            else:
                with pytest.raises(ssl.SSLCertVerificationError, match="permitted subtree"):
                    client.wrap_socket(a, server_hostname=name)
        finally:
            a.close()
            server.join(10)
            b.close()


def _serve_handshake(context: ssl.SSLContext, sock: socket.socket) -> None:
    try:
        with context.wrap_socket(sock, server_side=True):
            pass
    except (ssl.SSLError, OSError):
        pass


def test_the_authority_keys_are_unreadable_by_another_local_user(tmp_path: Path) -> None:
    """Keys are 0600 in a 0700 directory; user nobody cannot read one, even with the directory
    opened up, while the same bytes in a 0644 file are readable to it (the control)."""
    public_dir = Path(tempfile.mkdtemp(prefix="sandpod-ca-test-"))
    try:
        public_dir.chmod(0o755)
        authority = InterceptionCA(public_dir / "egress-ca", "inst-test")
        authority.trust_pem(["api.test"])
        key = public_dir / "egress-ca" / "api.test.key"
        assert key.stat().st_mode & 0o777 == 0o600
        assert (public_dir / "egress-ca").stat().st_mode & 0o777 == 0o700
        assert not _read_as_nobody(key)
        (public_dir / "egress-ca").chmod(0o755)  # the directory alone is not the protection
        assert not _read_as_nobody(key)
        control = public_dir / "control.key"
        control.write_bytes(key.read_bytes())
        control.chmod(0o644)
        assert _read_as_nobody(control)
        key.chmod(0o640)  # and a key someone loosened is refused, not used
        with pytest.raises(CaError, match="0600"):
            InterceptionCA(public_dir / "egress-ca", "inst-test").trust_pem(["api.test"])
    finally:
        subprocess.run(["rm", "-rf", str(public_dir)], check=True)


def _read_as_nobody(path: Path) -> bool:
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0 and b"PRIVATE KEY" in done.stdout


class UpgradeServer(Server):
    """Answers one request with 101 and then echoes raw bytes (a WebSocket's shape)."""

    def __init__(self, host: str, tls: ssl.SSLContext) -> None:
        self.heads: list[bytes] = []
        super().__init__(host, tls)

    def handle(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        self.heads.append(head)
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
        while data := conn.recv(65536):
            conn.sendall(data)


def test_an_upgraded_connection_gets_the_header_then_carries_raw_bytes(
    internet_ca: InternetCA, authority: InterceptionCA, proxy: ProxyHarness
) -> None:
    """The Upgrade request is injected; after 101 the bytes are no longer HTTP and pass as
    they are (they are not parsed as requests, which would refuse them)."""
    server = UpgradeServer("127.0.0.1", server_tls(internet_ca))
    with running(server):
        raw = proxy.connect(server.address)
        with sandbox_tls(authority).wrap_socket(raw, server_hostname="api.test") as tls:
            tls.sendall(
                b"GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\n"
                b"Upgrade: websocket\r\n\r\n"
            )
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += tls.recv(4096)
            assert answer.startswith(b"HTTP/1.1 101")
            frame = b"\x81\x05hello not http \r\n\r\n"
            tls.sendall(frame)
            echoed = b""
            while len(echoed) < len(frame):
                echoed += tls.recv(4096)
            assert echoed == frame
    assert f"Authorization: Bearer {SECRET}".encode() in server.heads[0]


def test_a_request_body_is_streamed_with_backpressure_not_buffered(
    store: FileSecretStore, authority: InterceptionCA
) -> None:
    """A 1 GiB upload to a server that reads nothing: the sandbox is held back after a few
    socket buffers' worth, the proxy never takes the body in (its memory is not the buffer)."""
    server = SilentServer("127.0.0.1")
    harness = ProxyHarness(POLICY, ca=authority, secrets=store)
    harness.resolved[LOOP] = {"api.test"}
    with running(server, harness):
        with harness.connect(server.address) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n" % 2**30)
            taken = send_until_blocked(sock, 2**30)
        assert 0 < taken < 64 * 1024 * 1024
