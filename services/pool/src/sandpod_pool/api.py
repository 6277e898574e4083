"""The pool service's API: ``<prefix>.api.pools.*`` and ``<prefix>.api.claims.*``.

Pool handlers validate and write the store (the reconciler does the rest: the reply to
``apply`` or ``scale`` comes before the members exist). Claim handlers bind in the request (see
:mod:`sandpod_pool.claims`), so a claim reply carries a ready sandbox or a typed reason.

No request may set a reserved (``sandpod.dev/``) label or annotation, in metadata or in a claim's
``spec.labels`` (what the claim puts on its sandbox), nor an owner reference: membership and
binding trust them (:mod:`sandpod_contract.reserved`). On a tenant's subject every name (pool,
claim, a claim's ``poolRef``) is the tenant's and the service sets the tenant label
(:mod:`sandpod_service.scoping`), so a tenant's claim can only name its own pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from sandpod_contract.errors import ResourceConflict, ResourceInvalid, ResourceNotFound
from sandpod_contract.messages.pools import Scale
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.pooling import WarmPoolSpec
from sandpod_contract.reserved import refuse_reserved
from sandpod_contract.resources import API_VERSION
from sandpod_contract.tenancy import TENANT_LABEL
from sandpod_pool.cache import Mirror
from sandpod_pool.claims import CLAIM, Claims
from sandpod_pool.members import POOL_KIND
from sandpod_service.scoping import (
    scope,
    scoped_name,
    scoped_object,
    scoped_ref,
    scoped_selection,
    visible,
)
from sandpod_store import Resource, Store

__all__ = ["PoolApi"]

MAX_LIST = 1000
MAX_CONFLICTS = 20


class PoolApi:
    def __init__(
        self,
        store: Store,
        pools: Mirror,
        claims: Claims,
        *,
        claim_wait: float,
        on_pool_change: Callable[[str, str], None],
    ) -> None:
        self.store = store
        self.pools = pools
        self.claims = claims
        self.claim_wait = claim_wait
        self._on_pool_change = on_pool_change

    def routes(self) -> dict[tuple[str, str], Callable[[Any], Awaitable[Any]]]:
        return {
            ("pools", "apply"): self.pool_apply,
            ("pools", "get"): self.pool_get,
            ("pools", "list"): self.pool_list,
            ("pools", "scale"): self.pool_scale,
            ("pools", "delete"): self.pool_delete,
            ("claims", "create"): self.claim_create,
            ("claims", "get"): self.claim_get,
            ("claims", "list"): self.claim_list,
            ("claims", "delete"): self.claim_delete,
        }

    # -- pools ---------------------------------------------------------------------------------

    async def pool_apply(self, req: ObjectRequest) -> ObjectReply:
        refuse_reserved(req.object)
        raw = req.object
        if isinstance(raw, dict) and (raw.get("metadata") or {}).get("name"):
            raw = dict(scoped_object(raw, "pool", "pool"))
        obj = _pool_from_map(raw)
        try:
            current = await self.store.get(POOL_KIND, obj.metadata.namespace, obj.metadata.name)
        except ResourceNotFound:
            saved = await self.store.create(obj)
        else:
            meta = obj.metadata.applied_over(current.metadata)
            saved = await self.store.update(dataclasses.replace(obj, metadata=meta))
        return self._pool_saved(saved)

    def _pool_saved(self, saved: Resource) -> ObjectReply:
        self.pools.observe(saved)
        self._on_pool_change(saved.metadata.namespace, saved.metadata.name)
        return ObjectReply(object=saved.to_dict())

    async def pool_get(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, POOL_KIND)
        return ObjectReply(
            object=(await self.store.get(POOL_KIND, req.namespace, req.name)).to_dict()
        )

    async def pool_list(self, req: Selection) -> ObjectsReply:
        return visible(await self._list(POOL_KIND, scoped_selection(req)))

    async def pool_scale(self, req: Scale) -> ObjectReply:
        req = scoped_ref(req, POOL_KIND)
        WarmPoolSpec.from_dict({"replicas": req.replicas})  # the same bounds as the schema
        for _ in range(MAX_CONFLICTS):
            obj = await self.store.get(POOL_KIND, req.namespace, req.name)
            try:
                saved = await self.store.update(
                    dataclasses.replace(obj, spec={**obj.spec, "replicas": req.replicas})
                )
            except ResourceConflict:
                continue
            return self._pool_saved(saved)
        raise ResourceConflict(f"pool {req.namespace}/{req.name} keeps changing; retry")

    async def pool_delete(self, req: Ref) -> ObjectReply:
        """Delete the pool; the reconciler then deletes its free members (claimed ones stay
        with their claims)."""
        req = scoped_ref(req, POOL_KIND)
        obj = await self.store.get(POOL_KIND, req.namespace, req.name)
        await self.store.delete(POOL_KIND, req.namespace, req.name)
        self.pools.forget(req.namespace, req.name)
        self._on_pool_change(req.namespace, req.name)
        return ObjectReply(object=obj.to_dict())

    # -- claims --------------------------------------------------------------------------------

    async def claim_create(self, req: ObjectRequest) -> ObjectReply:
        refuse_reserved(req.object, spec_labels=True)
        wait = self.claim_wait if req.wait_ready is None else req.wait_ready
        claim = await self.claims.claim(_claim_scoped(req.object), wait)
        return ObjectReply(object=claim.to_dict())

    async def claim_get(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, CLAIM)
        return ObjectReply(object=(await self.store.get(CLAIM, req.namespace, req.name)).to_dict())

    async def claim_list(self, req: Selection) -> ObjectsReply:
        return visible(await self._list(CLAIM, scoped_selection(req)))

    async def claim_delete(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, CLAIM)
        return ObjectReply(object=(await self.claims.release(req.namespace, req.name)).to_dict())

    async def _list(self, kind: str, req: Selection) -> ObjectsReply:
        items, revision = await self.store.list(kind, req.namespace, req.selector)
        limit = min(req.limit or MAX_LIST, MAX_LIST)
        return ObjectsReply(
            items=tuple(i.to_dict() for i in items[:limit]),
            revision=revision,
            truncated=len(items) > limit,
        )


def _claim_scoped(raw: Any) -> Any:
    """A tenant's claim: its id as name, its own pool as poolRef, the tenant label on the claim
    and (through ``spec.labels``) on the sandbox it binds. Unchanged on the global subjects."""
    s = scope()
    if s is None or not isinstance(raw, dict):
        return raw
    out = dict(scoped_object(raw, "claim", "claim"))
    spec = out.get("spec") or {}
    if not isinstance(spec, dict):
        return out  # ClaimSpec names the problem
    spec = dict(spec)
    pool_ref = spec.get("poolRef")
    if isinstance(pool_ref, dict) and isinstance(pool_ref.get("name"), str):
        spec["poolRef"] = {
            **pool_ref,
            "name": scoped_name(s, "pool", pool_ref["name"], "spec.poolRef.name"),
        }
    labels = spec.get("labels") or {}
    if isinstance(labels, dict):
        spec["labels"] = {**labels, TENANT_LABEL: s.tenant}
    return {**out, "spec": spec}


def _pool_from_map(raw: Any) -> Resource:
    if not isinstance(raw, dict):
        raise ResourceInvalid("object must be a map")
    if raw.get("kind", POOL_KIND) != POOL_KIND or raw.get("apiVersion", API_VERSION) != API_VERSION:
        raise ResourceInvalid(f"expected {API_VERSION} {POOL_KIND}", field="kind")
    obj = Resource.from_dict({**raw, "apiVersion": API_VERSION, "kind": POOL_KIND, "status": {}})
    if not obj.metadata.name:
        raise ResourceInvalid("a pool needs metadata.name", field="metadata.name")
    obj.validate()
    spec = WarmPoolSpec.from_dict(obj.spec)
    return dataclasses.replace(obj, spec=spec.to_dict())
