"""Per-object leases in a JetStream KV bucket (sandpod_service.leases) on a real nats-server:
exactly one holder, cheap re-acquisition, expiry and release hand-over."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from conftest import NatsServer
from sandpod_bus import Bus, BusSettings
from sandpod_service.clock import REAL, Clock, FakeClock
from sandpod_service.leases import Leases


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


KEY = "sandbox.default.x"


async def _pair(bus: Bus, ttl: float, clock: Clock = REAL) -> tuple[Leases, Leases, str]:
    """Two replicas' leases on a bucket of this test's own, and its name."""
    bucket = f"leases-{uuid.uuid4().hex[:8]}"
    return (
        await Leases.open(bus, "a", ttl, bucket=bucket, clock=clock),
        await Leases.open(bus, "b", ttl, bucket=bucket, clock=clock),
        bucket,
    )


async def test_one_holder_and_a_fresh_lease_costs_no_round_trip(bus: Bus) -> None:
    """Only one replica holds a key; re-acquiring a fresh lease leaves the record untouched,
    while renew=True writes it again."""
    a, b, name = await _pair(bus, ttl=30)
    assert await a.acquire(KEY) and not await b.acquire(KEY)
    bucket = await bus.kv(name, history=1)
    first = (await bucket.get(KEY)).revision
    assert await a.acquire(KEY)
    assert (await bucket.get(KEY)).revision == first
    assert await a.acquire(KEY, renew=True)
    assert (await bucket.get(KEY)).revision > first
    assert not await b.acquire(KEY)


async def test_an_expired_lease_passes_to_another_replica(bus: Bus) -> None:
    """Takeover: a holder that stops renewing (a dead replica) keeps the key until its ttl
    has passed, not a moment less; then another replica takes it (the real bucket's
    compare-and-set, the time a fake clock's) and the old holder finds it taken."""
    clock = FakeClock()
    a, b, _ = await _pair(bus, ttl=30, clock=clock)
    assert await a.acquire(KEY)
    clock.advance(29.5)
    assert not await b.acquire(KEY), "taken over before the holder's lease expired"
    clock.advance(0.499)
    assert not await b.acquire(KEY), "taken over before the holder's lease expired"
    clock.advance(0.001)
    assert await b.acquire(KEY) and b.holds(KEY)
    assert not await a.acquire(KEY) and not a.holds(KEY)


async def test_a_renewed_lease_is_never_taken_over(bus: Bus) -> None:
    """A live holder renews (the reconcilers' resync): however long it runs, another replica
    never gets the key."""
    clock = FakeClock()
    a, b, _ = await _pair(bus, ttl=30, clock=clock)
    assert await a.acquire(KEY)
    for _ in range(10):
        clock.advance(20)  # two thirds of the ttl since the last renewal
        assert not await b.acquire(KEY)
        await a.renew_all()
        assert a.holds(KEY)


async def test_release_hands_over_at_once(bus: Bus) -> None:
    """A released lease is free immediately, long before its ttl."""
    a, b, _ = await _pair(bus, ttl=30)
    assert await a.acquire(KEY)
    await a.release(KEY)
    assert await b.acquire(KEY) and b.holds(KEY)
