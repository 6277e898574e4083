"""IPv6 egress of local sandboxes, attacked from inside real jails against a v6 fake internet.

The same bed as ``test_net_local.py`` (``netsbx.py`` jails with their own veth and chain,
``fakenet.py`` with ``ipv6=True``: "public" v6 servers in ``3fff::/20``, a ULA service, the
IPv6 metadata address fd00:ec2::254), plus the node's own parts where a test needs them (the
resolver on the gateway addresses answering from a fake authoritative server, the refusal log).
Probes run *inside* the sandboxes as their unprivileged user; where a protection is what stops
an attack, the test removes it once and shows the attack then works. Needs root and a host
with IPv6 (skipped, saying so, when it has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from dnsauth import AuthServer
from netsbx import egress_runtime, make, ok, probe, reached
from prometheus_client import CollectorRegistry

from fakenet import FakeNet
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.dnssettings import ResolverSettings
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.ipv6 import host_support
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.node import NodeNetwork, start_node_network
from sandpod_lifecycle.runtime.base import InstanceStatus
from sandpod_lifecycle.runtime.local import LocalRuntime

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="sandbox networking needs root (veth, nftables): run as root"
    ),
    pytest.mark.skipif(
        host_support() is not None, reason=f"no IPv6 on this host: {host_support()}"
    ),
]

PUBLIC = NetworkPolicy()
DEADLINE = 30.0


def v6(address: str, port: int) -> str:
    """A probe target (``netsbx.PROBE`` splits at the last colon: no brackets)."""
    return f"{address}:{port}"


@pytest.fixture
def fakenet() -> Iterator[FakeNet]:
    with FakeNet(ipv6=True) as net:
        yield net
    assert not net.leftovers()


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path("/var/tmp") / f"sandpod-net6-test-{uuid.uuid4().hex[:8]}"
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
async def node(
    state: Path, default_rootfs: Path | None
) -> AsyncIterator[tuple[LocalRuntime, Egress]]:
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    async with egress_runtime(state, default_rootfs) as pair:
        assert pair[1].ipv6_off is None, pair[1].notes
        yield pair


class Events:
    """What the node published: (sandbox id, kind, destination), waitable."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self._changed = asyncio.Condition()

    async def publish(self, sandbox_id: str, kind: str, dest: str, rule: str, count: int) -> None:
        async with self._changed:
            self.seen.append((sandbox_id, kind, dest))
            self._changed.notify_all()

    async def wait_for(self, event: tuple[str, str, str]) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0), self._changed:
                await self._changed.wait_for(lambda: event in self.seen)
        return event in self.seen


@contextlib.asynccontextmanager
async def node_network(
    egress: Egress, upstream: tuple[str, int]
) -> AsyncIterator[tuple[NodeNetwork, Events]]:
    """The node's resolver (on both gateway addresses) and refusal log, as lifecycle starts
    them; every task it spawned is cancelled and awaited on exit."""
    events, tasks = Events(), set()

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
        tasks.add(asyncio.create_task(coro, name=name))

    net = await start_node_network(
        egress,
        ResolverSettings(upstreams=(upstream,), min_ttl=30),
        NetworkMetrics(CollectorRegistry()),
        publish=events.publish,
        spawn=spawn,
    )
    try:
        yield net, events
    finally:
        await net.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def host_addresses6() -> list[str]:
    out = subprocess.run(["ip", "-6", "-o", "addr"], capture_output=True, text=True).stdout
    found = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in found if not a.startswith("fe80:")]


def link_local(egress: Egress, status: InstanceStatus) -> str:
    """The link-local address of the host end of the sandbox's veth (neighbour discovery)."""
    name = egress.link(status.sandbox_id)
    assert name is not None
    out = subprocess.run(
        ["ip", "-6", "-o", "addr", "show", "dev", name, "scope", "link"],
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[3].split("/")[0]


@contextlib.contextmanager
def host_service6() -> Iterator[int]:
    """A TCP server of the host on ``::`` (every v6 address) answering ``host secret``."""
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = False

    def serve() -> None:
        while not stop:
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(1024)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nhost secret\n")

    import threading

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop = True
        thread.join()
        sock.close()


async def test_public_reaches_the_v6_internet_but_not_the_host_metadata_ula_or_other_sandboxes(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """Under ``public`` a sandbox has its own v6 address and reaches the fake internet's v6
    servers (NAT66 out); a ULA service (special range), fd00:ec2::254, the host's own v6
    addresses (a service on ``::``, the v6 gateway too) and another sandbox's v6 address do
    not. Without the forward chain's hard denies the metadata server and the other sandbox
    answer; without the input chain's drop the host's service does."""
    rt, egress = node
    a, b = await make(rt, PUBLIC), await make(rt, PUBLIC)
    a6, b6 = egress.address6(a.sandbox_id), egress.address6(b.sandbox_id)
    assert a6 and b6 and a6 != b6 and egress.gateway6 is not None
    inside = await ok(a, "cat /proc/net/if_inet6")
    assert ipaddress.IPv6Address(a6).exploded.replace(":", "") in inside, inside
    assert " eth0" in inside and "fe80" not in inside, inside  # no link-local to talk to
    assert a.protections["egress_ipv6"] == "active"
    await ok(b, "setsid python3 -m http.server 8000 --bind :: >/dev/null 2>&1 < /dev/null &")
    with host_service6() as port:
        hosts = [*host_addresses6(), str(egress.gateway6), f"{link_local(egress, a)}%eth0"]
        forbidden = [
            *(v6(h, port) for h in hosts),
            v6(fakenet.metadata6, 80),
            v6(fakenet.private6, 80),
            v6(b6, 8000),
        ]
        good = [v6(fakenet.public6, 80), v6(fakenet.public6b, 80)]
        results = await probe(a, *good, *forbidden)
        assert results[good[0]] == "fakenet public6", results
        assert reached(results) == set(good), results
        assert egress.denied_counts()[a.sandbox_id] >= len(forbidden)
        # the attacks are real: without the input chain's drop the host's service answers ...
        fw = egress.firewall
        assert fw is not None
        fw.nft.run(f"flush chain inet {egress.table} input")
        gw = v6(str(egress.gateway6), port)
        assert (await probe(a, gw))[gw] == "host secret"
        # ... and without the forward chain, the metadata server and the other sandbox do
        await ok(b, f"python3 -c 'import socket; socket.create_connection((\"{b6}\", 8000), 5)'")
        fw.nft.run(f"flush chain inet {egress.table} forward")
        again = await probe(a, v6(fakenet.metadata6, 80), v6(b6, 8000))
        assert len(reached(again)) == 2, again
