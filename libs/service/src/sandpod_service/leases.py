"""Per-object leases in a JetStream KV bucket: exactly one replica of a service (lifecycle, pool)
reconciles an object at a time.

A lease is the key ``<kind>.<namespace>.<name>`` holding ``{holder, expires}``. A replica may act
on an object only while it holds its lease; it takes a free or expired lease with a
compare-and-set (so two replicas can never both win), renews it while working, and releases it at
shutdown. A replica that dies stops renewing; after ``ttl`` another replica's resync takes over.

:class:`LeaseKeeper` is the seam the reconcilers see, so they do not care which kind they have:
these KV leases (embedded mode), or in Kubernetes mode ``sandpod_kube.ElectedLeases``, where one
elected leader (a ``coordination.k8s.io`` Lease) holds every object and the others hold none.
"""

from __future__ import annotations

import contextlib
import json
from typing import Protocol

from sandpod_bus import Bus, KvBucket
from sandpod_contract.errors import (
    ResourceConflict,
    ResourceExists,
    ResourceNotFound,
    SandpodError,
)
from sandpod_service.clock import REAL, Clock

__all__ = ["LeaseKeeper", "Leases"]

BUCKET = "sandpod-leases"


class LeaseKeeper(Protocol):
    """Who may act on which object: per-object leases, or one leader for everything."""

    async def acquire(self, key: str) -> bool:
        """Hold (or keep holding) ``key``; False: another replica acts on it, do nothing."""
        ...

    def holds(self, key: str) -> bool:
        """Whether ``key`` is held now (no I/O)."""
        ...

    def active(self) -> bool:
        """Whether this replica may do replica-wide work (orphan sweeps) now."""
        ...

    async def renew_all(self) -> None:
        """Extend what we hold (a no-op where renewal runs on its own)."""
        ...

    async def release(self, key: str) -> None:
        """Done with ``key`` (it was deleted)."""
        ...

    async def release_all(self) -> None:
        """Shutdown: give everything up so another replica takes over at once."""
        ...


class Leases:
    def __init__(self, bucket: KvBucket, holder: str, ttl: float, *, clock: Clock = REAL) -> None:
        self._bucket = bucket
        self.holder = holder
        self.ttl = ttl
        self._clock = clock  # wall time: ``expires`` is compared across replicas
        self._held: dict[str, int] = {}  # key -> revision of our lease record
        self._expires: dict[str, float] = {}  # key -> when our record says it expires

    @classmethod
    async def open(
        cls, bus: Bus, holder: str, ttl: float, bucket: str = BUCKET, *, clock: Clock = REAL
    ) -> Leases:
        return cls(await bus.kv(bucket, history=1), holder, ttl, clock=clock)

    def _value(self, key: str) -> bytes:
        self._expires[key] = expires = self._clock.now() + self.ttl
        return json.dumps({"holder": self.holder, "expires": expires}).encode()

    async def acquire(self, key: str, *, renew: bool = False) -> bool:
        """Hold (or keep holding) the lease on ``key``; False if another live replica has it.

        A lease we hold with more than half its ttl left is ours without asking the bucket
        (nobody may take it before it expires): reconciling an object again costs no round
        trip. ``renew`` extends it anyway.
        """
        if (
            not renew
            and key in self._held
            and self._expires.get(key, 0.0) - self._clock.now() > (self.ttl / 2)
        ):
            return True
        try:
            entry = await self._bucket.get(key)
        except ResourceNotFound:
            try:
                self._held[key] = await self._bucket.create(key, self._value(key))
                return True
            except (ResourceExists, ResourceConflict):
                return False
        try:
            data = json.loads(entry.value)
            holder, expires = str(data["holder"]), float(data["expires"])
        except (ValueError, KeyError, TypeError):
            holder, expires = "", 0.0  # a corrupt lease is a free lease
        if holder != self.holder and expires > self._clock.now():
            self._held.pop(key, None)
            self._expires.pop(key, None)
            return False
        try:
            self._held[key] = await self._bucket.update(key, self._value(key), entry.revision)
        except ResourceConflict:
            self._held.pop(key, None)
            self._expires.pop(key, None)
            return False
        return True

    def holds(self, key: str) -> bool:
        return key in self._held

    def active(self) -> bool:
        """Always: each replica sweeps what it sees (sweeps are idempotent)."""
        return True

    async def renew_all(self) -> None:
        """Extend every lease we hold (drop the ones we lost)."""
        for key in list(self._held):
            await self.acquire(key, renew=True)

    async def release(self, key: str) -> None:
        revision = self._held.pop(key, None)
        self._expires.pop(key, None)
        if revision is not None:
            # Lost, changed or unreachable: the lease then simply expires after ttl.
            with contextlib.suppress(SandpodError):
                await self._bucket.delete(key, revision)

    async def release_all(self) -> None:
        for key in list(self._held):
            await self.release(key)
