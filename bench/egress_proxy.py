"""Throughput through the egress proxy's splice path vs the same transfer direct, same run.

A source/sink server and a client, each in its own process (as a sandbox and the internet are),
move ``--mib`` MiB one way and then the other over loopback TCP; once directly (the floor) and
once through the egress proxy (its thread in this process, as in the lifecycle), where the
client's first bytes are a real TLS ClientHello with an allowed SNI, so the connection takes the
real path: sniff, verdict, connect, splice. Prints MB/s for each and the ratio to the floor.

    .venv/bin/python bench/egress_proxy.py [--mib 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import multiprocessing
import resource
import socket
import ssl
import time
from multiprocessing.connection import Connection

from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.proxy import EgressProxy
from sandpod_lifecycle.network.proxyconfig import ProxySettings
from sandpod_lifecycle.network.proxythread import ProxyThread, listen
from sandpod_lifecycle.network.sandboxnet import SandboxNet

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--mib", "4", "--rounds", "1"]

MiB = 1024 * 1024
CHUNK = 1024 * 1024
LOOP = ipaddress.ip_address("127.0.0.1")


def client_hello(name: str) -> bytes:
    """A real ClientHello for ``name`` (OpenSSL's), the first bytes the proxy checks."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def server(listener: socket.socket, nbytes: int, hello_len: int) -> None:
    """Per connection: read the hello, sink ``nbytes`` (then ack), then source ``nbytes``."""
    while True:
        conn, _ = listener.accept()
        with conn:
            buf = bytearray(CHUNK)
            need = hello_len + nbytes
            while need:
                n = conn.recv_into(buf, min(CHUNK, need))
                if not n:
                    break
                need -= n
            conn.sendall(b"k")
            payload = bytes(CHUNK)
            left = nbytes
            while left:
                left -= conn.send(payload[: min(CHUNK, left)])


def client(address: tuple[str, int], nbytes: int, hello: bytes, out: Connection) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(hello)
        payload = bytes(CHUNK)
        t0 = time.perf_counter()
        left = nbytes
        while left:
            left -= sock.send(payload[: min(CHUNK, left)])
        assert sock.recv(1) == b"k"
        t1 = time.perf_counter()
        buf = bytearray(CHUNK)
        left = nbytes
        while left:
            n = sock.recv_into(buf, min(CHUNK, left))
            assert n, "connection ended early"
            left -= n
        t2 = time.perf_counter()
    out.send((t1 - t0, t2 - t1))


def transfer(address: tuple[str, int], nbytes: int, hello: bytes) -> tuple[float, float]:
    """(up MB/s, down MB/s) for one client process."""
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=client, args=(address, nbytes, hello, theirs))
    proc.start()
    if not ours.poll(600):
        proc.kill()
        raise SystemExit("client did not finish")
    up_s, down_s = ours.recv()
    proc.join()
    return nbytes / up_s / 1e6, nbytes / down_s / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    nbytes = args.mib * MiB
    hello = client_hello("bench.test")
    listener = listen("127.0.0.1")
    upstream = listener.getsockname()[:2]
    srv = multiprocessing.Process(target=server, args=(listener, nbytes, len(hello)), daemon=True)
    srv.start()
    policy = NetworkPolicy.from_dict({"mode": "allowlist", "allow": ["bench.test"]})
    proxy = EgressProxy(
        ProxySettings(),
        lookup=lambda source: SandboxNet("bench", policy),
        resolved_names=lambda sid, ip: {"bench.test"} if ip == str(LOOP) else set(),
        original_dst=lambda sock: (LOOP, upstream[1]),
    )
    thread = ProxyThread(proxy, [listen("127.0.0.1")])
    thread.start()
    try:
        best: dict[str, tuple[float, float]] = {}
        cpu = [0.0, 0.0]  # this process (the proxy's thread) during proxied transfers
        for _ in range(args.rounds):
            for label, address in (("direct", upstream), ("proxy", thread.addresses[0])):
                before = resource.getrusage(resource.RUSAGE_SELF)
                up, down = transfer(address, nbytes, hello)
                after = resource.getrusage(resource.RUSAGE_SELF)
                if label == "proxy":
                    cpu[0] += after.ru_utime - before.ru_utime
                    cpu[1] += after.ru_stime - before.ru_stime
                old = best.get(label, (0.0, 0.0))
                best[label] = (max(old[0], up), max(old[1], down))
    finally:
        thread.stop()
        srv.kill()
        srv.join()
    print(f"egress proxy splice path, {args.mib} MiB each way, best of {args.rounds}")
    for i, direction in enumerate(("sandbox->internet", "internet->sandbox")):
        floor, through = best["direct"][i], best["proxy"][i]
        print(
            f"  {direction}: direct {floor:8.0f} MB/s (floor)  proxy {through:8.0f} MB/s"
            f"  ratio {through / floor:.2f}x"
        )
    gib = 2 * nbytes * args.rounds / (1024 * MiB)
    print(
        f"  proxy CPU per GiB moved: user {cpu[0] / gib:.3f} s (Python), "
        f"system {cpu[1] / gib:.3f} s (splice, TCP)"
    )


if __name__ == "__main__":
    main()
