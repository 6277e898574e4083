"""Per-object leases in a JetStream KV bucket (sandpod_service.leases) on a real nats-server:
exactly one holder, cheap re-acquisition, expiry and release hand-over."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from conftest import NatsServer
from sandpod_bus import Bus, BusSettings
from sandpod_service.leases import Leases


@pytest.fixture
async def bus(nats: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=nats.url))
    yield b
    await b.close()


KEY = "sandbox.default.x"


async def _pair(bus: Bus, ttl: float) -> tuple[Leases, Leases, str]:
    """Two replicas' leases on a bucket of this test's own, and its name."""
    bucket = f"leases-{uuid.uuid4().hex[:8]}"
    return (
        await Leases.open(bus, "a", ttl, bucket=bucket),
        await Leases.open(bus, "b", ttl, bucket=bucket),
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
    """A holder that stops renewing loses the key once its ttl has passed; the old holder
    then finds it taken."""
    a, b, _ = await _pair(bus, ttl=0.5)
    assert await a.acquire(KEY)
    deadline = time.monotonic() + 10
    while not await b.acquire(KEY):
        assert time.monotonic() < deadline, "the expired lease was never taken over"
        await asyncio.sleep(0.05)
    assert not await a.acquire(KEY) and not a.holds(KEY)


async def test_release_hands_over_at_once(bus: Bus) -> None:
    """A released lease is free immediately, long before its ttl."""
    a, b, _ = await _pair(bus, ttl=30)
    assert await a.acquire(KEY)
    await a.release(KEY)
    assert await b.acquire(KEY) and b.holds(KEY)
