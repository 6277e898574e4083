"""The snapshot API (``<prefix>.api.snapshots.{create,get,list,delete}``).

``create`` writes a ``Pending`` SandboxSnapshot of a sandbox in the caller's namespace and waits
for the controller (``controller.py``) to make it ``Ready`` -- or answers ``snapshot.failed``
with the reason. ``delete`` refuses a snapshot something restores from (``snapshot.in_use``,
naming them); its layers go once no other snapshot shares them. On a tenant's subject every
name (the snapshot's and its source's) is the tenant's own, as for sandboxes: another tenant's
snapshot answers like a missing one, and cannot be named as a source or restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from sandpod_contract.errors import (
    ResourceNotFound,
    SnapshotFailed,
    SnapshotInUse,
    SnapshotQuotaExceeded,
)
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.reserved import refuse_reserved
from sandpod_contract.snapshots import SnapshotPhase, SnapshotStatus
from sandpod_contract.tenancy import TENANT_LABEL
from sandpod_lifecycle.objects import SANDBOX
from sandpod_lifecycle.snapshots.objects import (
    HIBERNATION_LABEL,
    SNAPSHOT,
    dependents,
    snapshot_from_map,
)
from sandpod_service.scoping import (
    scope,
    scoped_name,
    scoped_object,
    scoped_ref,
    scoped_selection,
    visible,
)
from sandpod_store import Resource, Store

__all__ = ["SnapshotApi", "SnapshotQuota"]

DEFAULT_WAIT = 600.0  # seconds a create waits for the capture when the request names none
MAX_LIST = 1000

Wait = Callable[[Resource, float, Callable[[Resource | None], bool]], Awaitable[Resource]]


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotQuota:
    """Per tenant (per namespace for administrators): how many snapshots, how many stored
    bytes (their own layers); 0: no limit. Hibernation snapshots do not count."""

    count: int = 0
    bytes: int = 0


class SnapshotApi:
    def __init__(
        self,
        store: Store,
        wait: Wait,
        on_deleted: Callable[[], None],
        quota: SnapshotQuota | None = None,
    ) -> None:
        self.store = store
        self._wait = wait
        self._on_deleted = on_deleted  # the controller collects layers nothing shares any more
        self._quota = quota or SnapshotQuota()

    async def create(self, req: ObjectRequest) -> ObjectReply:
        refuse_reserved(req.object)
        raw: dict[str, Any] = dict(scoped_object(req.object, "snapshot", "snap"))
        s = scope()
        spec_raw = raw.get("spec")
        if (
            s is not None
            and isinstance(spec_raw, dict)
            and isinstance(spec_raw.get("sourceRef"), dict)
        ):
            named = str(spec_raw["sourceRef"].get("name", ""))
            spec_raw = {
                **spec_raw,
                "sourceRef": {"name": scoped_name(s, "sandbox", named, "spec.sourceRef.name")},
            }
            raw["spec"] = spec_raw
        obj, spec = snapshot_from_map(raw)
        ns = obj.metadata.namespace
        source = await self.store.get(SANDBOX, ns, spec.source_ref)  # ResourceNotFound: say so
        await self._check_quota(ns, obj.metadata.labels.get(TENANT_LABEL))
        obj = dataclasses.replace(obj, status={})
        created = await self.store.create(obj)
        created = await self.store.update_status(
            dataclasses.replace(
                created,
                status=SnapshotStatus(source_uid=source.metadata.uid).to_dict(),
            )
        )
        done = await self._wait(created, req.wait_ready or DEFAULT_WAIT, _settled)
        status = SnapshotStatus.from_dict(done.status)
        if status.phase is SnapshotPhase.FAILED:
            cond = status.conditions[0] if status.conditions else None
            raise SnapshotFailed(
                f"snapshot {done.metadata.name} of {spec.source_ref} failed: "
                f"{cond.message if cond else 'no reason recorded'}",
                snapshot=done.metadata.name,
                reason=cond.reason if cond else "",
            )
        return ObjectReply(object=done.to_dict())

    async def _check_quota(self, namespace: str, tenant: str | None) -> None:
        """Refuse a snapshot past the tenant's quota (the one being taken counts as one).

        Raises:
            SnapshotQuotaExceeded: naming which quota and its limit.
        """
        q = self._quota
        if not q.count and not q.bytes:
            return
        items, _ = await self.store.list(SNAPSHOT, namespace)
        mine = [
            o
            for o in items
            if o.metadata.labels.get(TENANT_LABEL) == tenant
            and HIBERNATION_LABEL not in o.metadata.labels
        ]
        used = sum(SnapshotStatus.from_dict(o.status).size_bytes for o in mine)
        who = tenant or f"namespace {namespace}"
        if q.count and len(mine) >= q.count:
            raise SnapshotQuotaExceeded(
                f"{who} has {len(mine)} snapshots, its quota (SANDPOD_SNAPSHOT_QUOTA_COUNT): "
                "delete some first",
                quota="count",
                limit=q.count,
                used=len(mine),
            )
        if q.bytes and used >= q.bytes:
            raise SnapshotQuotaExceeded(
                f"{who}'s snapshots store {used} bytes, at its quota of {q.bytes} "
                "(SANDPOD_SNAPSHOT_QUOTA_BYTES): delete some first",
                quota="bytes",
                limit=q.bytes,
                used=used,
            )

    async def get(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, SNAPSHOT)
        return ObjectReply(
            object=(await self.store.get(SNAPSHOT, req.namespace, req.name)).to_dict()
        )

    async def list(self, req: Selection) -> ObjectsReply:
        req = scoped_selection(req)
        items, revision = await self.store.list(SNAPSHOT, req.namespace, req.selector)
        limit = min(req.limit or MAX_LIST, MAX_LIST)
        return visible(
            ObjectsReply(
                items=tuple(i.to_dict() for i in items[:limit]),
                revision=revision,
                truncated=len(items) > limit,
            )
        )

    async def delete(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, SNAPSHOT)
        obj = await self.store.get(SNAPSHOT, req.namespace, req.name)
        holders = await dependents(self.store, req.namespace, req.name)
        if holders:
            raise SnapshotInUse(
                f"snapshot {req.name} is restored by {', '.join(holders)}; delete them first",
                snapshot=req.name,
                holders=holders,
            )
        with contextlib.suppress(ResourceNotFound):  # deleted meanwhile: the same answer
            await self.store.delete(SNAPSHOT, req.namespace, req.name)
        self._on_deleted()
        return ObjectReply(object=obj.to_dict())


def _settled(obj: Resource | None) -> bool:
    if obj is None:
        return True
    return SnapshotStatus.from_dict(obj.status).phase is not SnapshotPhase.PENDING
