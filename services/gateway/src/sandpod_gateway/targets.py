"""Where a sandbox's ports are, and which of them are public: read from its Sandbox object.

The preview proxy needs, per request, the sandbox's network address (``status.endpoint
["address"]``, set by the runtime: the sandbox's own IP, the Pod IP, 127.0.0.1 for the process
runtime) and its public ports (the reserved annotation lifecycle's ``expose`` verb writes). Both
live on the Sandbox, so every replica sees the same and a restart loses nothing; this module asks
lifecycle (on the owning tenant's subject) and keeps the answer ``ttl`` seconds (default 1 s) in
a bounded cache, so a page's hundred sub-requests cost one control-plane read, and a port made
private again closes on every replica within ``ttl``. Concurrent misses for one sandbox share one
request. The replica that changes an exposure forgets its entry at once.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable

from sandpod_contract.errors import ResourceNotFound
from sandpod_contract.messages.sandboxes import PUBLIC_PORTS_ANNOTATION, ObjectReply, Ref
from sandpod_gateway.tenancy import DEFAULT_TENANT, LIFECYCLE_NAMESPACE, Scope
from sandpod_gateway.upstream import Upstream

__all__ = ["SandboxPorts", "Targets", "public_ports", "tenant_of"]

SEP = "--"


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxPorts:
    """One sandbox as the preview proxy needs it."""

    sandbox_id: str
    tenant: str
    address: str | None  # None: the runtime gave it no address (not reachable)
    phase: str
    public: frozenset[int]


def tenant_of(sandbox_id: str) -> str | None:
    """The tenant whose id ``sandbox_id`` is (see :mod:`sandpod_contract.tenancy`); None if no
    tenant can own it."""
    tenant = sandbox_id.split(SEP, 1)[0] if SEP in sandbox_id else DEFAULT_TENANT
    try:
        scope = Scope(tenant)
    except ValueError:
        return None
    return tenant if scope.owns(sandbox_id) else None


def public_ports(annotations: object) -> frozenset[int]:
    """The ports the reserved annotation lists (malformed entries ignored)."""
    if not isinstance(annotations, dict):
        return frozenset()
    raw = str(annotations.get(PUBLIC_PORTS_ANNOTATION, ""))
    return frozenset(int(p) for p in raw.split(",") if p.isdigit() and 0 < int(p) < 65536)


class Targets:
    def __init__(
        self,
        upstream: Upstream,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = 4096,
    ) -> None:
        self._upstream = upstream
        self._ttl = ttl
        self._clock = clock
        self._capacity = capacity
        self._cache: collections.OrderedDict[str, tuple[float, SandboxPorts | None]] = (
            collections.OrderedDict()
        )
        self._pending: dict[str, asyncio.Future[SandboxPorts | None]] = {}
        # called when a cached record leaves before its time (the native front's epoch)
        self.on_change: Callable[[], None] = _nothing

    async def get(self, sandbox_id: str) -> SandboxPorts | None:
        """The sandbox ``sandbox_id`` (None: no such sandbox, or no tenant owns such an id).

        Raises:
            SandboxUnavailable: lifecycle does not answer.
        """
        hit = self._cache.get(sandbox_id)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        pending = self._pending.get(sandbox_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[SandboxPorts | None] = asyncio.get_running_loop().create_future()
        self._pending[sandbox_id] = future
        try:
            found = await self._read(sandbox_id)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            self._pending.pop(sandbox_id, None)
        future.set_result(found)
        self._cache[sandbox_id] = (self._clock() + self._ttl, found)
        self._cache.move_to_end(sandbox_id)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
            self.on_change()
        return found

    def cached(self, sandbox_id: str) -> SandboxPorts | None:
        """What ``get`` would answer from the cache now (None: not cached, or no such
        sandbox)."""
        hit = self._cache.get(sandbox_id)
        return hit[1] if hit is not None and hit[0] > self._clock() else None

    def fresh_for(self, sandbox_id: str) -> float:
        """Seconds the cached record of ``sandbox_id`` stays ``get``'s answer (0: none)."""
        hit = self._cache.get(sandbox_id)
        return max(0.0, hit[0] - self._clock()) if hit is not None else 0.0

    def known(self, sandbox_id: str) -> bool:
        """Whether ``get`` would answer from the cache (no control-plane request)."""
        hit = self._cache.get(sandbox_id)
        return hit is not None and hit[0] > self._clock()

    def forget(self, sandbox_id: str) -> None:
        """Drop what this replica knows of ``sandbox_id`` (its exposure just changed)."""
        self._cache.pop(sandbox_id, None)
        self.on_change()

    async def _read(self, sandbox_id: str) -> SandboxPorts | None:
        tenant = tenant_of(sandbox_id)
        if tenant is None:
            return None
        ref = Ref(name=sandbox_id, namespace=LIFECYCLE_NAMESPACE)
        try:
            reply = await self._upstream.api("sandboxes", "get", ref, ObjectReply, tenant=tenant)
        except ResourceNotFound:
            return None
        obj = reply.object
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        endpoint = status.get("endpoint") or {}
        address = endpoint.get("address") if isinstance(endpoint, dict) else None
        return SandboxPorts(
            sandbox_id=sandbox_id,
            tenant=tenant,
            address=str(address) if address else None,
            phase=str(status.get("phase") or ""),
            public=public_ports(meta.get("annotations")),
        )


def _nothing() -> None:
    pass
