"""Refused connections name their destination: NFLOG read by the lifecycle, real jails.

Each test runs real jails (``netsbx.py``) against the fake internet (``fakenet.py``), with a
:class:`DenialLog` reading the installation's NFLOG group the way the lifecycle does, and waits
on the events themselves. The flood test shows the log is bounded per sandbox (the chain's
``limit``) while the counters stay exact; the side-by-side test that two installations bind
different groups and each reads only its own sandboxes. Needs root (veth, nftables, netlink).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from netsbx import egress_runtime, make, ok
from prometheus_client import CollectorRegistry

from fakenet import FakeNet
from sandpod_contract.network import NetworkPolicy
from sandpod_lifecycle.network.denials import DenialLog
from sandpod_lifecycle.network.egress import Egress
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nflog import NflogSocket
from sandpod_lifecycle.network.nft import Nft
from sandpod_lifecycle.network.rules import LOG_BURST
from sandpod_lifecycle.runtime.base import InstanceStatus
from sandpod_lifecycle.runtime.local import LocalRuntime

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="sandbox networking needs root (veth, nftables): run as root"
)

PUBLIC = NetworkPolicy()
DENY_ALL = NetworkPolicy.from_dict({"mode": "deny-all"})
DEADLINE = 30.0
LOG_PER_SECOND = 5  # rules.LOG_RATE
# fire-and-forget: each "host:port/proto" gets one TCP SYN (non-blocking connect) or datagram
FIRE = r"""
import socket, sys
for t in sys.argv[1:]:
    where, proto = t.rsplit("/", 1)
    host, port = where.rsplit(":", 1)
    if proto == "udp":
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (host, int(port)))
    else:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, int(port)))
        s.close()
"""
# a flood: argv[2] TCP connections to host argv[1] (ports 1024 up), 200 sockets at a time
FLOOD = r"""
import socket, sys
host, n = sys.argv[1], int(sys.argv[2])
for start in range(0, n, 200):
    socks = []
    for i in range(start, min(n, start + 200)):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, 1024 + i))
        socks.append(s)
    for s in socks:
        s.close()
"""


class Seen:
    """What a DenialLog published: (sandbox id, kind, destination), waitable."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self._changed = asyncio.Condition()

    async def publish(self, sandbox_id: str, kind: str, dest: str, rule: str, count: int) -> None:
        assert count >= 1 and rule == "policy"
        async with self._changed:
            self.events.append((sandbox_id, kind, dest))
            self._changed.notify_all()

    async def wait(self, pred: Callable[[tuple[str, str, str]], bool]) -> None:
        async with asyncio.timeout(DEADLINE), self._changed:
            await self._changed.wait_for(lambda: any(pred(e) for e in self.events))

    def of(self, sandbox_id: str) -> list[str]:
        return [dest for sid, _, dest in self.events if sid == sandbox_id]


@contextlib.asynccontextmanager
async def reading(egress: Egress) -> AsyncIterator[tuple[Seen, CollectorRegistry]]:
    """A DenialLog on the egress's NFLOG group, publishing into a :class:`Seen`."""
    assert egress.log is not None and egress.firewall is not None, egress.notes
    seen, registry = Seen(), CollectorRegistry()
    log = DenialLog(
        egress.log, egress.firewall.sandbox_of_log, seen.publish, NetworkMetrics(registry)
    )
    task = asyncio.create_task(log.run())
    try:
        yield seen, registry
    finally:
        log.close()
        await asyncio.wait_for(task, DEADLINE)


async def fire(status: InstanceStatus, *targets: str) -> None:
    await ok(status, ["python3", "-c", FIRE, *targets])


async def fire_until_seen(seen: Seen, status: InstanceStatus, target: str) -> None:
    """Fire at ``target`` until its event arrives (a sandbox past its log burst has one log
    slot every 1/LOG_RATE s: a single attempt may fall between two)."""
    end = time.monotonic() + DEADLINE
    while (status.sandbox_id, "connect", target) not in seen.events:
        assert time.monotonic() < end, f"no event for {target}: {seen.events[-5:]}"
        await fire(status, target)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(seen.wait(lambda e: e[2] == target), 0.5)


@pytest.fixture
def fakenet() -> Iterator[FakeNet]:
    with FakeNet() as net:
        yield net
    assert not net.leftovers()


@pytest.fixture
async def node(default_rootfs: Path | None) -> AsyncIterator[tuple[LocalRuntime, Egress]]:
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    state = Path("/var/tmp") / f"sandpod-nflog-test-{uuid.uuid4().hex[:8]}"
    try:
        async with egress_runtime(state, default_rootfs) as pair:
            yield pair
    finally:
        subprocess.run(["rm", "-rf", str(state)], check=False)


async def test_a_refused_connection_is_reported_with_its_exact_destination(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """A public sandbox's SYN to the metadata server (a hard deny of the forward chain), to a
    private service (its own chain) and a datagram to the host's gateway address (the input
    chain) each become an event naming that address, port and protocol, and nothing else
    does: the other sandbox, which refused nothing, has no event."""
    rt, egress = node
    a, quiet = await make(rt, PUBLIC), await make(rt, PUBLIC)
    targets = {
        f"{fakenet.metadata}:80/tcp",
        f"{fakenet.private}:8443/tcp",
        f"{egress.gateway}:9/udp",
    }
    async with reading(egress) as (seen, registry):
        await fire(a, *sorted(targets))
        await seen.wait(lambda _: targets <= set(seen.of(a.sandbox_id)))
        assert set(seen.of(a.sandbox_id)) == targets, seen.events
        assert seen.of(quiet.sandbox_id) == []
        assert {kind for _, kind, _ in seen.events} == {"connect"}
        reported = registry.get_sample_value(
            "sandpod_lifecycle_network_denied_logs_total", {"outcome": "reported"}
        )
        assert reported == len(seen.events)
    assert egress.denied_counts()[a.sandbox_id] >= len(targets)  # the counters still count


async def test_a_flooding_sandbox_gets_a_bounded_log_and_others_still_get_their_events(
    node: tuple[LocalRuntime, Egress], fakenet: FakeNet
) -> None:
    """A sandbox opening 20000 refused connections is logged at most its burst plus its rate
    over the flood's duration (its counter has all 20000); a second sandbox refused during the
    flood still gets its event, with its own destination."""
    rt, egress = node
    flooder, other = await make(rt, DENY_ALL), await make(rt, DENY_ALL)
    n = 20000
    async with reading(egress) as (seen, _):
        started = time.monotonic()
        flood = asyncio.create_task(ok(flooder, ["python3", "-c", FLOOD, fakenet.public, str(n)]))
        try:
            await fire_until_seen(seen, other, f"{fakenet.public2}:8080/tcp")
        finally:
            await flood
        elapsed = time.monotonic() - started
        # every log of the flood is read once a later one of the flooder's arrives
        await fire_until_seen(seen, flooder, f"{fakenet.private}:7/udp")
        marker_wait = time.monotonic() - started - elapsed
    flood_logs = [d for d in seen.of(flooder.sandbox_id) if d.startswith(f"{fakenet.public}:")]
    bound = LOG_BURST + LOG_PER_SECOND * (elapsed + marker_wait + 1)
    assert 1 <= len(flood_logs) <= bound, (len(flood_logs), elapsed, marker_wait)
    assert egress.denied_counts()[flooder.sandbox_id] >= n
    assert set(seen.of(other.sandbox_id)) == {f"{fakenet.public2}:8080/tcp"}


async def test_two_installations_each_read_only_their_own_refusals(
    default_rootfs: Path | None, fakenet: FakeNet
) -> None:
    """Two installations asked to start at the same NFLOG group get different ones (the
    second takes the next free); each reader gets its own sandbox's refusals and never the
    other's; once stopped, both groups are free again (unbound)."""
    if default_rootfs is None:
        pytest.skip("no default sandbox rootfs (mmdebstrap could not build it: see conftest)")
    first = 40000 + int(uuid.uuid4().hex[:4], 16) % 20000
    s1, s2 = (Path(f"/var/tmp/sandpod-nflog-{c}-{uuid.uuid4().hex[:6]}") for c in "ab")
    try:
        async with (
            egress_runtime(s1, default_rootfs, log_group=first) as (rt1, e1),
            egress_runtime(s2, default_rootfs, log_group=first) as (rt2, e2),
        ):
            assert e1.log is not None and e2.log is not None
            assert (e1.log.group, e2.log.group) == (first, first + 1)
            a, b = await make(rt1, DENY_ALL), await make(rt2, DENY_ALL)
            async with reading(e1) as (seen1, reg1), reading(e2) as (seen2, reg2):
                await fire_until_seen(seen1, a, f"{fakenet.public}:81/tcp")
                await fire_until_seen(seen2, b, f"{fakenet.public}:82/tcp")
                # the second one's refusals are all read by now: the first's once more
                await fire_until_seen(seen1, a, f"{fakenet.public}:83/tcp")
            assert {sid for sid, _, _ in seen1.events} == {a.sandbox_id}, seen1.events
            assert {sid for sid, _, _ in seen2.events} == {b.sandbox_id}, seen2.events
            assert f"{fakenet.public}:82/tcp" not in {d for _, _, d in seen1.events}
            for registry in (reg1, reg2):
                strangers = registry.get_sample_value(
                    "sandpod_lifecycle_network_denied_logs_total", {"outcome": "stranger"}
                )
                assert not strangers
    finally:
        subprocess.run(["rm", "-rf", str(s1), str(s2)], check=False)
    for group in (first, first + 1):
        NflogSocket.bind(group, attempts=1).close()  # free: both were unbound


async def test_a_full_socket_buffer_is_counted_and_reading_goes_on() -> None:
    """With a tiny receive buffer and an unlimited log rule (a table of the test's own on
    loopback output), the kernel drops log messages: the reader counts the ENOBUFS, and still
    publishes the ones that fit and the ones logged after it."""
    sock = NflogSocket.bind(45000 + int(uuid.uuid4().hex[:4], 16) % 10000, rcvbuf=4096)
    table = f"sandpod_nflogtest{uuid.uuid4().hex[:6]}"
    port = 20000 + int(uuid.uuid4().hex[:4], 16) % 10000
    nft = Nft()
    registry = CollectorRegistry()
    seen = Seen()
    log = DenialLog(
        sock, lambda p: "s1" if p == f"{table}:1" else None, seen.publish, NetworkMetrics(registry)
    )
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        nft.run(
            f"add table inet {table}\n"
            f"add chain inet {table} out {{ type filter hook output priority filter; }}\n"
            f"add rule inet {table} out ip daddr 127.0.0.1 udp dport {{ {port}, {port + 1} }} "
            f'log prefix "{table}:1" group {sock.group}\n'
        )
        for _ in range(2000):  # nobody reads yet: far more than 4 KiB of log messages
            udp.sendto(b"x", ("127.0.0.1", port))
        task = asyncio.create_task(log.run())
        try:
            await seen.wait(lambda e: True)
            udp.sendto(b"x", ("127.0.0.1", port + 1))  # logged after the overrun: read too
            await seen.wait(lambda e: e[2] == f"127.0.0.1:{port + 1}/udp")
            overruns = registry.get_sample_value(
                "sandpod_lifecycle_network_denied_log_overruns_total"
            )
            assert overruns is not None and overruns >= 1
            assert seen.events[0] == ("s1", "connect", f"127.0.0.1:{port}/udp")
        finally:
            log.close()
            await asyncio.wait_for(task, DEADLINE)
    finally:
        udp.close()
        nft.run(f"add table inet {table}\ndelete table inet {table}")
        nft.close()
        sock.close()
