"""Leader election on a real ``coordination.k8s.io`` Lease (sandpod_kube.leader): never two
leaders, a dead leader is replaced after the lease duration, a released Lease is taken at once,
and a race on one resourceVersion has exactly one winner.

Timing is short (lease 2 s, renew deadline 1 s, retry 0.2 s); every wait is on a real condition
(an elector's state, the Lease's record) with a deadline, and checks the invariant while waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client

from k8s.envtest import ControlPlane
from sandpod_kube import ElectedLeases, LeaderElector, LeaderSettings
from sandpod_kube.leader import _Observed

FAST = LeaderSettings(lease_duration=2, renew_deadline=1.0, retry_period=0.2)


def read_lease(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    with plane.settings.api_client() as api_client:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(name, namespace)
        return dict(api_client.sanitize_for_serialization(lease)["spec"])


async def until(
    done: Callable[[], bool],
    timeout: float,
    what: str,
    invariant: Callable[[], None] = lambda: None,
) -> float:
    """Seconds until ``done()``, checking ``invariant()`` at each look; fail after ``timeout``."""
    start = time.monotonic()
    while not done():
        invariant()
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.01)
    invariant()
    return time.monotonic() - start


class Replicas:
    """Electors on one Lease, each with its own election loop task."""

    def __init__(self, plane: ControlPlane, namespace: str, settings: LeaderSettings) -> None:
        self.plane, self.namespace, self.settings = plane, namespace, settings
        self.name = f"lease-{uuid.uuid4().hex[:8]}"
        self.electors: list[LeaderElector] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.changes: list[tuple[str, bool]] = []

    def add(self, identity: str) -> LeaderElector:
        elector = LeaderElector(
            self.plane.settings,
            dataclasses.replace(self.settings, namespace=self.namespace),
            name=self.name,
            identity=identity,
            on_change=lambda leading: self.changes.append((identity, leading)),
        )
        self.electors.append(elector)
        return elector

    def start(self, elector: LeaderElector) -> None:
        self.tasks[elector.identity] = asyncio.create_task(elector.run(), name=elector.identity)

    async def stop(self, elector: LeaderElector) -> None:
        """Stop its loop, without releasing (what a crash looks like to the others)."""
        task = self.tasks.pop(elector.identity)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def leaders(self) -> list[str]:
        return [e.identity for e in self.electors if e.is_leader]

    def one_at_most(self) -> None:
        assert len(self.leaders()) <= 1, self.leaders()

    def lease(self) -> dict[str, Any]:
        return read_lease(self.plane, self.namespace, self.name)

    async def close(self) -> None:
        for elector in list(self.electors):
            if elector.identity in self.tasks:
                await self.stop(elector)
            await elector.close()


@pytest.fixture
async def replicas(kube_apiserver: ControlPlane, namespace: str) -> AsyncIterator[Replicas]:
    group = Replicas(kube_apiserver, namespace, FAST)
    try:
        yield group
    finally:
        await group.close()


async def test_a_dead_leader_is_replaced_after_the_lease_duration(replicas: Replicas) -> None:
    """Two electors: exactly one leads; when the leader stops renewing (no release) it stops
    acting within its renew deadline, and the other leads only after the lease duration, with
    leaseTransitions incremented; there are never two leaders."""
    a, b = replicas.add("replica-a"), replicas.add("replica-b")
    replicas.start(a)
    replicas.start(b)
    await until(lambda: len(replicas.leaders()) == 1, 10, "a leader", replicas.one_at_most)
    leader = next(e for e in (a, b) if e.is_leader)
    standby = b if leader is a else a
    first = replicas.lease()
    assert first["holderIdentity"] == leader.identity
    assert first["leaseDurationSeconds"] == 2
    assert first["leaseTransitions"] == 0
    # The standby has read the record (it follows), and the adapter says what the elector says.
    await until(lambda: standby.holder == leader.identity, 5, "the standby saw the holder")
    assert await ElectedLeases(leader).acquire("Sandbox.default.x")
    assert not await ElectedLeases(standby).acquire("Sandbox.default.x")

    await replicas.stop(leader)
    stopped = time.monotonic()
    await until(
        lambda: not leader.is_leader,
        FAST.renew_deadline + 0.5,
        "the stopped leader steps down",
        replicas.one_at_most,
    )
    assert not standby.is_leader  # the old leader stepped down first, nobody leads
    await until(lambda: standby.is_leader, 10, "the standby takes over", replicas.one_at_most)
    took = time.monotonic() - stopped
    # Taken no earlier than a lease duration after the last renew the standby saw.
    assert took >= FAST.lease_duration - FAST.retry_period
    second = replicas.lease()
    assert second["holderIdentity"] == standby.identity
    assert second["leaseTransitions"] == 1
    assert second["acquireTime"] != first["acquireTime"]
    assert (standby.identity, True) in replicas.changes
    assert replicas.changes.index((leader.identity, False)) < replicas.changes.index(
        (standby.identity, True)
    )


async def test_a_released_lease_is_taken_at_once(
    kube_apiserver: ControlPlane, namespace: str
) -> None:
    """With a 30 s lease, a leader that releases (clean shutdown) is replaced by the standby
    at its next retry, not after the lease duration."""
    settings = LeaderSettings(lease_duration=30, renew_deadline=20, retry_period=0.2)
    slow = Replicas(kube_apiserver, namespace, settings)
    try:
        a, b = slow.add("replica-a"), slow.add("replica-b")
        slow.start(a)
        await until(lambda: a.is_leader, 10, "a leads")
        slow.start(b)
        await until(lambda: b.holder == "replica-a", 5, "b sees a holding the lease")
        assert not b.is_leader
        await slow.stop(a)
        await a.release()
        assert not a.is_leader
        assert slow.lease().get("holderIdentity") is None
        took = await until(lambda: b.is_leader, 10, "b takes the released lease", slow.one_at_most)
        assert took < 30
        lease = slow.lease()
        assert lease["holderIdentity"] == "replica-b"
        assert lease["leaseTransitions"] == 1
    finally:
        await slow.close()


async def test_a_race_on_one_resource_version_has_one_winner(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four electors read the Lease (absent, then free) before any of them writes: the create
    and then the update at the same resourceVersion succeed for exactly one; the others are
    refused (AlreadyExists, 409 Conflict) and are not leader."""
    electors = [replicas.add(f"replica-{i}") for i in range(4)]
    barrier = asyncio.Barrier(len(electors))
    racing = {"on": True}
    for elector in electors:
        real = elector._get  # hold every elector between its read and its write

        async def get(real: Callable[[], Any] = real) -> _Observed | None:
            seen: _Observed | None = await real()
            if racing["on"]:
                await barrier.wait()
            return seen

        monkeypatch.setattr(elector, "_get", get)
    for round_ in range(3):
        racing["on"] = True
        results = await asyncio.gather(*(e.step() for e in electors))
        assert sum(results) == 1, (round_, results)
        winner = electors[results.index(True)]
        assert replicas.leaders() == [winner.identity]
        lease = replicas.lease()
        assert lease["holderIdentity"] == winner.identity
        assert lease["leaseTransitions"] == round_  # created at 0, +1 per taking of a free one
        racing["on"] = False  # the winner gives it up, so the next round races for a free Lease
        await winner.release()


def test_leader_settings_from_env_and_their_limits() -> None:
    """Defaults are client-go's; the variables are read; a renew deadline not below the lease
    duration, or a fractional lease duration, is refused."""
    assert LeaderSettings.from_env({}) == LeaderSettings(15, 10.0, 2.0, None)
    env = {
        "SANDPOD_LEADER_LEASE_DURATION": "4",
        "SANDPOD_LEADER_RENEW_DEADLINE": "2.5",
        "SANDPOD_LEADER_RETRY_PERIOD": "0.5",
        "SANDPOD_NAMESPACE": "sandpod",
    }
    assert LeaderSettings.from_env(env) == LeaderSettings(4, 2.5, 0.5, "sandpod")
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderSettings.from_env({"SANDPOD_LEADER_RENEW_DEADLINE": "15"})
    with pytest.raises(ValueError, match="whole seconds"):
        LeaderSettings.from_env({"SANDPOD_LEADER_LEASE_DURATION": "2.5"})
    with pytest.raises(ValueError, match="retry period"):
        LeaderSettings(lease_duration=2, renew_deadline=1, retry_period=1)
