"""``DenialLog``: NFLOG datagrams in, ``network.denied`` publishes out, everything bounded.

The socket is one end of a Unix datagram socketpair wrapped as an :class:`NflogSocket` (the
reader only receives): the test writes datagrams into the other end, including malformed ones,
another installation's prefix, and an ``ENOBUFS`` the kernel would report for a full buffer.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from nflogmsg import TCP_443, UDP_53, ipv4, message
from sandpod_lifecycle.network.denials import DenialLog, Repeats
from sandpod_lifecycle.network.metrics import NetworkMetrics
from sandpod_lifecycle.network.nflog import NflogSocket

TIMEOUT = 10.0


class PairSocket(NflogSocket):
    """An NflogSocket over a socketpair; ``overruns`` recvs fail with ENOBUFS first."""

    def __init__(self) -> None:
        self.peer, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        mine.setblocking(False)
        super().__init__(mine, 30001)
        self.overruns = 0

    def recv(self) -> bytes:
        if self.overruns:
            self.overruns -= 1
            raise OSError(errno.ENOBUFS, "No buffer space available")
        return super().recv()


@pytest.fixture
def pair() -> Iterator[PairSocket]:
    sock = PairSocket()
    yield sock
    sock.close()
    sock.peer.close()


def _sample(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value(
        "sandpod_lifecycle_network_denied_logs_total", {"outcome": outcome}
    )
    return value or 0.0


async def test_logged_refusals_are_published_in_order_and_bad_ones_counted(
    pair: PairSocket,
) -> None:
    """Each logged packet of one of our sandboxes is published as ``connect`` with its
    destination, in order; a repeat, a malformed datagram, another installation's prefix and
    an ENOBUFS are counted and the reader reads on; ``close`` ends ``run``."""
    published: list[tuple[str, str, str, str, int]] = []
    arrived = asyncio.Event()

    async def publish(sandbox_id: str, kind: str, dest: str, rule: str, count: int) -> None:
        published.append((sandbox_id, kind, dest, rule, count))
        if len(published) == 2:
            arrived.set()

    def sandbox_of(prefix: str) -> str | None:
        return {"sandpod_abc:3": "sbx-3"}.get(prefix)

    registry = CollectorRegistry()
    metrics = NetworkMetrics(registry)
    log = DenialLog(pair, sandbox_of, publish, metrics, repeats=Repeats(clock=lambda: 0.0))
    task = asyncio.create_task(log.run())
    pair.overruns = 1
    pair.peer.send(message(ipv4("203.0.113.9", 6, TCP_443)))
    pair.peer.send(message(ipv4("203.0.113.9", 6, TCP_443)))  # a retransmission: held back
    pair.peer.send(b"\x10\0\0\0garbage")
    pair.peer.send(message(ipv4("203.0.113.7", 6, TCP_443), prefix=b"sandpod_other:3"))
    pair.peer.send(message(ipv4("198.51.100.1", 17, UDP_53)))
    await asyncio.wait_for(arrived.wait(), TIMEOUT)
    log.close()
    await asyncio.wait_for(task, TIMEOUT)
    assert published == [
        ("sbx-3", "connect", "203.0.113.9:443/tcp", "policy", 1),
        ("sbx-3", "connect", "198.51.100.1:53/udp", "policy", 1),
    ]
    outcomes = ("reported", "repeated", "malformed", "stranger")
    assert [_sample(registry, o) for o in outcomes] == [2, 1, 1, 1]
    overruns = registry.get_sample_value("sandpod_lifecycle_network_denied_log_overruns_total")
    assert overruns == 1
    assert not pair.closed  # the reader never owns the socket: the egress closes it


async def test_a_slow_publisher_bounds_the_queue_and_counts_the_overflow(
    pair: PairSocket,
) -> None:
    """With publishing stuck, at most ``queue_size`` refusals wait (plus the one being
    published); the rest are counted as ``queue_full``, never buffered without bound."""
    gate = asyncio.Event()
    published: list[str] = []
    read = 0
    all_read = asyncio.Event()

    async def publish(sandbox_id: str, kind: str, dest: str, rule: str, count: int) -> None:
        await gate.wait()
        published.append(dest)

    def sandbox_of(prefix: str) -> str | None:
        nonlocal read
        read += 1
        if read == 50:
            all_read.set()
        return "sbx-3"

    registry = CollectorRegistry()
    log = DenialLog(pair, sandbox_of, publish, NetworkMetrics(registry), queue_size=4)
    task = asyncio.create_task(log.run())
    for i in range(50):
        pair.peer.send(message(ipv4(f"203.0.113.{i + 1}", 6, TCP_443)))
    await asyncio.wait_for(all_read.wait(), TIMEOUT)
    full = _sample(registry, "queue_full")
    assert 50 - 5 <= full <= 50 - 4
    gate.set()
    log.close()  # what is queued is still published, then run returns
    await asyncio.wait_for(task, TIMEOUT)
    assert len(published) == 50 - full
    assert published[0] == "203.0.113.1:443/tcp"


def test_repeats_of_one_destination_are_held_back_and_counted_into_the_next() -> None:
    """Within the window only the first refusal of a (sandbox, destination) is published;
    the ones held back ride on the next one published after it; other sandboxes and other
    destinations are independent; the memory is bounded (least recently seen forgotten)."""
    now = [100.0]
    repeats = Repeats(window=1.0, size=3, clock=lambda: now[0])
    assert repeats.take("a", "203.0.113.9:443/tcp") == 1
    assert repeats.take("a", "203.0.113.9:443/tcp") == 0
    assert repeats.take("b", "203.0.113.9:443/tcp") == 1  # another sandbox
    assert repeats.take("a", "203.0.113.9:80/tcp") == 1  # another destination
    now[0] += 0.5
    assert repeats.take("a", "203.0.113.9:443/tcp") == 0
    now[0] += 0.6  # 1.1 s after the first one was published
    assert repeats.take("a", "203.0.113.9:443/tcp") == 3  # itself and the two held back
    assert repeats.take("a", "203.0.113.9:443/tcp") == 0
    for i in range(3):  # three newer pairs push the oldest out
        repeats.take("c", f"198.51.100.{i}:53/udp")
    assert repeats.take("a", "203.0.113.9:443/tcp") == 1  # forgotten: published at once
