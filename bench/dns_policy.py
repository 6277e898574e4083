"""What the node's policy resolver adds to "look a name up, then connect", next to a plain
forwarder (issue 15's target: at most 1 ms added at p50).

One iteration of each path, alternating so host noise hits all alike, from a blocking client
bound to its own loopback "sandbox" address: a UDP A query, then a TCP connect to the address
in the answer (a local listener) and close.

- floor: the query straight to the authoritative server (tests/dnsauth.py);
- forwarder: through a plain UDP relay (bytes in, bytes out: no parsing, no policy, no cache);
- policy, miss: through :class:`NodeResolver` under an allowlist policy (a ``*.`` name rule
  and a CIDR rule), a new name each time (so every query goes upstream: parse, policy,
  upstream query, screening, the sink, reply);
- policy, hit: the same, one name asked again and again (served from the resolver's cache,
  still screened and pushed to the sink every time).

The sink is in-memory (the firewall's libnftables batch, ~100 us, is measured by the firewall's
own bench). The servers run in a thread with their own event loop; the client is the main
thread.

    .venv/bin/python bench/dns_policy.py [--lookups 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import dns.message
import dns.rdatatype
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _platform import pct, summary
from dnsauth import AuthServer
from sandpod_contract.network import NetworkPolicy, Rule
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.resolver import NodeResolver, ResolverSettings
from sandpod_lifecycle.network.sandboxnet import SandboxNet

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--lookups", "20"]

TARGET = "127.0.0.1"  # where every answer points (a listener waits there)
SANDBOX = "127.0.0.77"  # the client's source address: the resolver's sandbox


class MemorySink:
    def __init__(self) -> None:
        self.calls = 0

    async def add_resolved(
        self, sandbox_id: str, rule: Rule, addresses: Sequence[tuple[str, int]]
    ) -> None:
        self.calls += 1

    async def add_injected(self, sandbox_id: str, addresses: Sequence[tuple[str, int]]) -> None:
        self.calls += 1


class Relay(asyncio.DatagramProtocol):
    """The plain forwarder: client datagrams to the upstream, answers back by query id."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.clients: dict[bytes, tuple[str, int]] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.out: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr == self.upstream:
            client = self.clients.pop(data[:2], None)
            if client is not None and self.transport is not None:
                self.transport.sendto(data, client)
            return
        self.clients[data[:2]] = addr
        if self.transport is not None:
            self.transport.sendto(data, self.upstream)


class Servers:
    """Authoritative server, relay, resolver and the TCP target, in a thread's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.addresses: dict[str, tuple[str, int]] = {}
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.main(),))
        self.error: BaseException | None = None

    async def main(self) -> None:
        try:
            await self._main()
        except BaseException as exc:
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        self.stop = asyncio.Event()
        auth = AuthServer()
        auth.add("*.bench.test", "A", 300, TARGET)
        await auth.start()
        relay_transport, _ = await self.loop.create_datagram_endpoint(
            lambda: Relay(auth.address), local_addr=("127.0.0.1", 0)
        )
        policy = NetworkPolicy.from_dict(
            {"mode": "allowlist", "allow": ["*.bench.test", "127.0.0.0/8"]}
        )
        resolver = NodeResolver(
            ResolverSettings(upstreams=(auth.address,)),
            [("127.0.0.1", 0)],
            lookup={SANDBOX: SandboxNet("bench", policy)}.get,
            sink=MemorySink(),
            metrics=NetworkMetrics(CollectorRegistry()),
        )
        await resolver.start()
        target = await asyncio.start_server(_close_at_once, TARGET, 0)
        self.addresses = {
            "floor": auth.address,
            "forwarder": relay_transport.get_extra_info("sockname")[:2],
            "policy": resolver.addresses[0],
            "target": target.sockets[0].getsockname()[:2],
        }
        self.ready.set()
        try:
            await self.stop.wait()
        finally:
            target.close()
            await resolver.close()
            relay_transport.close()
            await auth.close()

    def __enter__(self) -> Servers:
        self.thread.start()
        if not self.ready.wait(30) or self.error is not None:
            raise RuntimeError(f"the servers did not start: {self.error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
        self.loop.close()


async def _close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


def lookup_and_connect(
    client: socket.socket, server: tuple[str, int], name: str, port: int
) -> float:
    """Seconds for one A lookup through ``server`` and a TCP connect to its answer."""
    started = time.perf_counter()
    client.sendto(dns.message.make_query(name, "A").to_wire(), server)
    response = dns.message.from_wire(client.recv(4096))
    [address] = [rd.address for r in response.answer if r.rdtype == dns.rdatatype.A for rd in r]
    with socket.create_connection((address, port), timeout=5):
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()
    with Servers() as servers, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((SANDBOX, 0))
        client.settimeout(5)
        port = servers.addresses["target"][1]
        paths: dict[str, Callable[[int], float]] = {
            "floor (authoritative direct)": lambda i: lookup_and_connect(
                client, servers.addresses["floor"], f"f{i}.bench.test", port
            ),
            "plain forwarder": lambda i: lookup_and_connect(
                client, servers.addresses["forwarder"], f"r{i}.bench.test", port
            ),
            "policy resolver, cache miss": lambda i: lookup_and_connect(
                client, servers.addresses["policy"], f"m{i}.bench.test", port
            ),
            "policy resolver, cache hit": lambda i: lookup_and_connect(
                client, servers.addresses["policy"], "hot.bench.test", port
            ),
        }
        samples: dict[str, list[float]] = {name: [] for name in paths}
        for i in range(-20, args.lookups):  # 20 rounds of warm-up
            for name, run in paths.items():
                elapsed = run(i)
                if i >= 0:
                    samples[name].append(elapsed)
    for name, values in samples.items():
        print(summary(name, values))
    floor = pct(samples["floor (authoritative direct)"], 50)
    plain = pct(samples["plain forwarder"], 50)
    for name in ("policy resolver, cache miss", "policy resolver, cache hit"):
        p50 = pct(samples[name], 50)
        print(
            f"{name}: p50 added vs plain forwarder {(p50 - plain) * 1000:+.3f} ms "
            f"(target <= +1 ms); {p50 / plain:.2f}x the forwarder, {p50 / floor:.2f}x the floor"
        )


if __name__ == "__main__":
    main()
