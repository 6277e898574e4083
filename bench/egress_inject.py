"""What header injection costs: HTTPS through the egress proxy's interception vs direct.

A TLS HTTP/1.1 server (its own test CA) and a client, each in its own process; the client
talks to the server directly (the floor), then through the egress proxy where the name is an
``inject`` domain: TLS terminated with the installation's authority, the header set from the
secret store, TLS again to the server (verified). Measured in the same run, interleaved:
a new connection + one small request (two handshakes instead of one), small requests on a
kept-alive connection, and a download (bytes through Python and OpenSSL twice).

    .venv/bin/python bench/egress_inject.py [--requests 300] [--mib 256]
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import multiprocessing
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from egress_harness import make_test_ca
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.ca import InterceptionCA
from sandpod_lifecycle.network.proxy import EgressProxy
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.proxythread import ProxyThread, listen
from sandpod_lifecycle.network.sandboxnet import SandboxNet
from sandpod_lifecycle.network.secretstore import FileSecretStore

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--requests", "5", "--mib", "1"]

MiB = 1024 * 1024
LOOP = ipaddress.ip_address("127.0.0.1")
NAME = "api.bench.test"


def serve(listener: socket.socket, cert_file: Path) -> None:
    """Keep-alive HTTP/1.1 over TLS: ``GET /<n>`` answers n zero bytes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(conn, context), daemon=True).start()


def _serve_one(conn: socket.socket, context: ssl.SSLContext) -> None:
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tls = context.wrap_socket(conn, server_side=True)
        f = tls.makefile("rb")
        body = bytes(MiB)
        while line := f.readline():
            while f.readline() not in (b"\r\n", b""):
                pass
            size = int(line.split()[1][1:])
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
            if size <= 4096:  # a small answer in one write, as real servers do
                tls.sendall(head + body[:size])
                continue
            tls.sendall(head)
            while size:
                size -= tls.send(body[: min(size, MiB)])
    except (OSError, ssl.SSLError):
        pass


def client(address: tuple[str, int], ca_pem: str, args: tuple[int, int], out: Connection) -> None:
    requests, mib = args
    context = ssl.create_default_context(cadata=ca_pem)

    def connect() -> http.client.HTTPConnection:
        raw = socket.create_connection(address)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = http.client.HTTPConnection(NAME)
        conn.sock = context.wrap_socket(raw, server_hostname=NAME)
        return conn

    fresh = []
    for _ in range(max(requests // 10, 3)):
        t0 = time.perf_counter()
        conn = connect()
        conn.request("GET", "/16", headers={"Authorization": "Bearer placeholder"})
        conn.getresponse().read()
        fresh.append(time.perf_counter() - t0)
        conn.close()
    conn = connect()
    kept = []
    for _ in range(requests):
        t0 = time.perf_counter()
        conn.request("GET", "/16", headers={"Authorization": "Bearer placeholder"})
        conn.getresponse().read()
        kept.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    conn.request("GET", f"/{mib * MiB}")
    response = conn.getresponse()
    while response.read(MiB):
        pass
    download = mib * MiB / (time.perf_counter() - t0) / 1e6
    conn.close()
    out.send((statistics.median(fresh) * 1e3, statistics.median(kept) * 1e3, download))


def measure(address: tuple[str, int], ca_pem: str, requests: int, mib: int) -> tuple[float, ...]:
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=client, args=(address, ca_pem, (requests, mib), theirs))
    proc.start()
    if not ours.poll(600):
        proc.kill()
        raise SystemExit("client did not finish")
    result: tuple[float, ...] = ours.recv()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandpod-bench-") as tmp:
        internet = make_test_ca(Path(tmp) / "internet", [NAME])
        listener = listen("127.0.0.1")
        upstream = listener.getsockname()[:2]
        server = multiprocessing.Process(
            target=serve, args=(listener, internet.cert_file), daemon=True
        )
        server.start()
        authority = InterceptionCA(Path(tmp) / "egress-ca", "bench")
        secrets = FileSecretStore(Path(tmp) / "secrets")
        secrets.put("key", "sk-bench")
        policy = NetworkPolicy.from_dict(
            {"mode": "allowlist", "allow": [NAME], "inject": [{"domain": NAME, "secret": "key"}]}
        )
        proxy = EgressProxy(
            ProxySettings(upstream_ca_file=internet.ca_file),
            lookup=lambda source: SandboxNet("bench", policy),
            resolved_names=lambda sid, ip: {NAME},
            original_dst=lambda sock: (LOOP, upstream[1]),
            ca=authority,
            secrets=secrets,
        )
        thread = ProxyThread(proxy, [listen("127.0.0.1")])
        thread.start()
        try:
            direct = measure(upstream, internet.ca_file.read_text(), args.requests, args.mib)
            pem = authority.trust_pem([NAME])
            through = measure(thread.addresses[0], pem, args.requests, args.mib)
        finally:
            thread.stop()
            server.kill()
            server.join()
    print(f"header injection (intercepted HTTPS), {args.requests} requests, {args.mib} MiB")
    labels = ("new connection + request p50 (ms)", "kept-alive request p50 (ms)", "download MB/s")
    for label, floor, value in zip(labels, direct, through, strict=True):
        print(
            f"  {label}: direct {floor:8.2f} (floor)  injected {value:8.2f}  {value / floor:.2f}x"
        )


if __name__ == "__main__":
    main()
