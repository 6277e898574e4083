"""Real servers on loopback for the egress proxy's tests: a test CA and its "real" upstream
TLS servers, a TLS echo server, an HTTP/1.1 server that records what reached it, and the proxy
itself on its own thread with an injectable original-destination table (the one path the
DNAT test in a network namespace replaces with the kernel's SO_ORIGINAL_DST).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.proxy import EgressProxy
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.proxythread import ProxyThread, listen
from sandpod_lifecycle.network.sandboxnet import Denial, SandboxNet

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SANDBOX_SOURCE = "127.0.0.1"


@dataclasses.dataclass
class InternetCA:
    """A CA of the test's "internet" and a server certificate for ``names`` signed by it."""

    ca_file: Path
    cert_file: Path
    cert_der: bytes


def make_test_ca(directory: Path, names: list[str]) -> InternetCA:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test internet CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file = directory / "server.pem"
    cert_file.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return InternetCA(ca_file, cert_file, cert.public_bytes(serialization.Encoding.DER))


class Server:
    """A threaded TCP server on ``host`` (optionally TLS): ``handle(conn)`` per connection."""

    def __init__(self, host: str, tls: ssl.SSLContext | None = None, port: int = 0) -> None:
        self.sock = listen(host, port)
        self.address = self.sock.getsockname()[:2]
        self.tls = tls
        self.accepted = 0
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, ssl.SSLError), conn:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self.handle(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._accepter.join(5)
        for thread in self._threads:
            thread.join(5)


class EchoServer(Server):
    def handle(self, conn: socket.socket) -> None:
        while data := conn.recv(256 * 1024):
            conn.sendall(data)


@dataclasses.dataclass
class Recorded:
    head: str
    headers: dict[str, str]
    body: bytes


class HttpServer(Server):
    """HTTP/1.1 with keep-alive; records each request (head, headers, de-chunked body) and
    answers 200 with the request's body length."""

    def __init__(self, host: str, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Recorded] = []
        super().__init__(host, tls)

    def handle(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            headers: dict[str, str] = {}
            while (h := f.readline()) not in (b"\r\n", b""):
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = b""
            if headers.get("transfer-encoding") == "chunked":
                while size := int(f.readline().split(b";")[0], 16):
                    body += f.read(size)
                    f.readline()
                while f.readline() != b"\r\n":
                    pass
            elif "content-length" in headers:
                body = f.read(int(headers["content-length"]))
            self.requests.append(Recorded(line.decode("latin-1").strip(), headers, body))
            answer = f"got {len(body)}".encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))


def server_tls(test_ca: InternetCA) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(test_ca.cert_file)
    return ctx


class ProxyHarness:
    """The proxy on its own thread; ``dnat[client port] = (address, port)`` plays conntrack."""

    def __init__(self, policy: NetworkPolicy, **kwargs: object) -> None:
        self.policy = policy
        self.resolved: dict[IPAddress, set[str]] = {}  # address -> names (for sandbox-test)
        self.dnat: dict[int, tuple[IPAddress, int]] = {}
        self.denials: list[Denial] = []
        self.lookup_threads: set[int] = set()  # threads the lookups ran on
        self.denial_threads: set[int] = set()  # ... and the denial callbacks
        settings = kwargs.pop("settings", None) or ProxySettings()
        assert isinstance(settings, ProxySettings)
        self.proxy = EgressProxy(
            settings,
            lookup=self._lookup,
            resolved_names=lambda sid, ip: self.resolved.get(ipaddress.ip_address(ip), set()),
            original_dst=lambda sock: self.dnat[sock.getpeername()[1]],
            on_denied=self._denied,
            **kwargs,  # type: ignore[arg-type]
        )
        self.thread = ProxyThread(self.proxy, [listen("127.0.0.1")])
        self.address = self.thread.addresses[0]
        self.thread.start()

    def _denied(self, denial: Denial) -> None:
        self.denial_threads.add(threading.get_ident())
        self.denials.append(denial)

    def _lookup(self, source: str) -> SandboxNet | None:
        self.lookup_threads.add(threading.get_ident())
        return SandboxNet("sbx-test", self.policy) if source == SANDBOX_SOURCE else None

    def connect(self, to: tuple[str, int], timeout: float = 10.0) -> socket.socket:
        """A client socket to the proxy that the proxy believes was sent to ``to``."""
        sock = socket.socket()
        sock.settimeout(timeout)
        sock.bind(("127.0.0.1", 0))
        self.dnat[sock.getsockname()[1]] = (ipaddress.ip_address(to[0]), to[1])
        sock.connect(self.address)
        return sock

    def close(self) -> None:
        self.thread.stop()
        assert self.thread.error is None, self.thread.error


@contextlib.contextmanager
def running(*items: Server | ProxyHarness) -> Iterator[None]:
    try:
        yield
    finally:
        for item in items:
            item.close()


class SilentServer(Server):
    """Accepts and never reads: whatever is sent to it piles up in front of it."""

    def handle(self, conn: socket.socket) -> None:
        conn.recv(0)
        self.stopped.wait(30)

    def __init__(self, host: str) -> None:
        self.stopped = threading.Event()
        super().__init__(host)

    def close(self) -> None:
        self.stopped.set()
        super().close()


def send_until_blocked(sock: socket.socket, limit: int) -> int:
    """Send zeros until the peer stops taking them for a second (or ``limit`` is reached);
    returns how many bytes were taken."""
    sock.settimeout(1.0)
    chunk = bytes(1024 * 1024)
    sent = 0
    with contextlib.suppress(TimeoutError, BlockingIOError):
        while sent < limit:
            sent += sock.send(chunk)
    return sent
