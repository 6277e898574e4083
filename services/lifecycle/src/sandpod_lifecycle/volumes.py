"""SandboxVolumes: the control-plane API (``<prefix>.api.volumes.*``) and who may mount what.

Requests: ``create`` validates the spec, writes the object and has the backend make its storage
at once (the local runtime's ext4 filesystem, a Kubernetes PVC), so a volume that exists is
usable; ``delete`` is refused (``store.in_use``, naming the holders) while a sandbox mounts it,
else removes its storage (the disk is free) and the object. Tenancy is the sandboxes': on a
tenant's subject every name is the tenant's id (:mod:`sandpod_service.scoping`), another
tenant's volume answers like a missing one, and a tenant's sandbox can only name its own.

Exclusivity lives in the volume's status (:class:`SandboxVolumeStatus`): ``writer`` (one
sandbox, read-write) or ``readers`` (any number, read-only, while there is no writer: a reader
never sees a filesystem another sandbox is changing). :meth:`Volumes.claim` adds a sandbox to
it before the Sandbox object is written, with the store's optimistic concurrency (a write at
the resourceVersion it read; a conflict reads again), so two concurrent creates cannot both
become the writer. :meth:`Volumes.release` takes it out again when the Sandbox object is gone
(the reconciler's last step) or its create failed. Data flow::

    sandboxes.create -> claim(each volume) -> store.create(Sandbox) -> reconciler -> driver binds
    Sandbox deleted  -> driver.destroy -> store.delete(Sandbox) -> release(each volume)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import structlog

from sandpod_contract.errors import (
    BadRequest,
    ResourceConflict,
    ResourceInvalid,
    ResourceNotFound,
    VolumeInUse,
    VolumeQuotaExceeded,
)
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.reserved import refuse_reserved
from sandpod_contract.resources import API_VERSION
from sandpod_contract.volumes import (
    SandboxVolumeSpec,
    SandboxVolumeStatus,
    VolumeMount,
    VolumePhase,
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

__all__ = [
    "VOLUME",
    "StaleHolders",
    "VolumeBackend",
    "VolumeEvents",
    "VolumeLimits",
    "Volumes",
    "effective_mounts",
]

log = structlog.get_logger("sandpod.lifecycle.volumes")

VOLUME = "SandboxVolume"
MAX_LIST = 1000
MAX_CONFLICTS = 20


class VolumeBackend(Protocol):
    """Where volumes' storage is made: the local runtime's filesystems, Kubernetes' PVCs."""

    async def provision(self, namespace: str, name: str, spec: SandboxVolumeSpec) -> None:
        """Make the volume's storage (idempotent). Raises OSError / a typed error."""

    async def remove(self, namespace: str, name: str) -> None:
        """Delete the volume's storage and its data (idempotent)."""

    async def usage(self, namespace: str, name: str) -> int | None:
        """Bytes in use, when the backend can tell."""


def effective_mounts(
    template: Sequence[VolumeMount], own: Sequence[VolumeMount]
) -> tuple[VolumeMount, ...]:
    """The template's volumes and the Sandbox's own; the Sandbox's win where both name the same
    volume or mount path."""
    kept = [
        t
        for t in template
        if not any(o.name == t.name or o.mount_path == t.mount_path for o in own)
    ]
    return (*kept, *own)


@dataclasses.dataclass(frozen=True, slots=True)
class VolumeLimits:
    """Per-tenant quotas on SandboxVolumes, checked at ``create`` against the tenant's volumes
    (administrators on the global subjects are not limited). Two creates racing past the check
    may each be admitted: the overshoot is bounded by the creates in flight."""

    max_count: int = 100  # SANDPOD_VOLUME_MAX_COUNT (0: no limit)
    max_bytes: int = 100 << 30  # SANDPOD_VOLUME_MAX_BYTES: the sum of their spec.size


class VolumeEvents(Protocol):
    async def publish_volume(
        self, *, name: str, namespace: str, type_: str, phase: str, sandbox: str = "", how: str = ""
    ) -> None: ...


class Volumes:
    def __init__(
        self,
        store: Store,
        backend: VolumeBackend | None,
        events: VolumeEvents | None = None,
        limits: VolumeLimits | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.events = events  # volume.<type> events (None: none published)
        self.limits = limits or VolumeLimits()

    async def _event(self, name: str, namespace: str, type_: str, phase: str, **kw: str) -> None:
        if self.events is not None:
            await self.events.publish_volume(
                name=name, namespace=namespace, type_=type_, phase=phase, **kw
            )

    # -- requests -------------------------------------------------------------------------------

    async def create(self, req: ObjectRequest) -> ObjectReply:
        refuse_reserved(req.object)
        if self.backend is None:
            raise BadRequest(
                "this installation's runtime has no volume storage (the local runtime as root, "
                "or kubernetes, has)",
                field="kind",
            )
        raw = scoped_object(req.object, "volume", "vol")
        if raw.get("kind", VOLUME) != VOLUME:
            raise ResourceInvalid(f"kind must be {VOLUME}", field="kind")
        if raw.get("apiVersion", API_VERSION) != API_VERSION:
            raise ResourceInvalid(f"apiVersion must be {API_VERSION}", field="apiVersion")
        obj = Resource.from_dict({**raw, "apiVersion": API_VERSION, "kind": VOLUME})
        if not obj.metadata.name:
            raise ResourceInvalid("a volume needs a name", field="metadata.name")
        obj.validate()
        spec = SandboxVolumeSpec.from_dict(obj.spec)
        obj = dataclasses.replace(obj, spec=spec.to_dict())
        await self._check_quota(obj.metadata.namespace, spec)
        created = await self.store.create(obj)
        ns, name = created.metadata.namespace, created.metadata.name
        try:
            await self.backend.provision(ns, name, spec)
        except (OSError, ValueError) as exc:
            status = SandboxVolumeStatus(
                phase=VolumePhase.FAILED,
                conditions=(
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ProvisionFailed",
                        "message": str(exc),
                    },
                ),
            )
            await self.store.update_status(dataclasses.replace(created, status=status.to_dict()))
            raise ResourceInvalid(
                f"cannot make the storage of volume {name!r}: {exc}", field="spec.size"
            ) from exc
        status = SandboxVolumeStatus(phase=VolumePhase.AVAILABLE, observed_generation=1)
        created = await self.store.update_status(
            dataclasses.replace(created, status=status.to_dict())
        )
        log.info("volume_created", volume=name, namespace=ns, size=spec.size)
        await self._event(name, ns, "created", str(VolumePhase.AVAILABLE))
        return ObjectReply(object=created.to_dict())

    async def _check_quota(self, namespace: str, spec: SandboxVolumeSpec) -> None:
        """Raises VolumeQuotaExceeded when the calling tenant's volumes would exceed a quota."""
        s = scope()
        if s is None:
            return
        req = scoped_selection(Selection(namespace=namespace))
        items, _ = await self.store.list(VOLUME, req.namespace, req.selector)
        own = [i for i in items if s.owns(i.metadata.name)]
        total = spec.size_bytes + sum(SandboxVolumeSpec.from_dict(i.spec).size_bytes for i in own)
        for quota, limit, setting, value, what in (
            ("volumes", self.limits.max_count, "SANDPOD_VOLUME_MAX_COUNT", len(own) + 1, "volumes"),
            ("volume_bytes", self.limits.max_bytes, "SANDPOD_VOLUME_MAX_BYTES", total, "bytes"),
        ):
            if limit and value > limit:  # 0: no limit (as the snapshot quotas)
                raise VolumeQuotaExceeded(
                    f"tenant {s.tenant!r} would hold {value} {what} of volumes, over its quota "
                    f"of {limit}: delete some, or ask the operator to raise {setting}",
                    quota=quota,
                    limit=limit,
                    setting=setting,
                )

    async def get(self, req: Ref) -> ObjectReply:
        req = scoped_ref(req, VOLUME)
        obj = await self.store.get(VOLUME, req.namespace, req.name)
        return ObjectReply(object=(await self._with_usage(obj)).to_dict())

    async def list(self, req: Selection) -> ObjectsReply:
        req = scoped_selection(req)
        items, revision = await self.store.list(VOLUME, req.namespace, req.selector)
        limit = min(req.limit or MAX_LIST, MAX_LIST)
        return visible(
            ObjectsReply(
                items=tuple(i.to_dict() for i in items[:limit]),
                revision=revision,
                truncated=len(items) > limit,
            )
        )

    async def delete(self, req: Ref) -> ObjectReply:
        """Refused while a sandbox holds it; else its storage and then the object go. Raises
        VolumeInUse naming the holders, ResourceNotFound."""
        req = scoped_ref(req, VOLUME)
        obj = await self.store.get(VOLUME, req.namespace, req.name)
        holders = SandboxVolumeStatus.from_dict(obj.status).holders
        if holders:
            raise _in_use(req.name, holders, "delete it")
        # At this resourceVersion: a claim that slipped in meanwhile makes this a conflict.
        await self.store.delete(VOLUME, req.namespace, req.name, obj.metadata.resource_version)
        if self.backend is not None:
            await self.backend.remove(req.namespace, req.name)
        log.info("volume_deleted", volume=req.name, namespace=req.namespace)
        await self._event(req.name, req.namespace, "deleted", str(VolumePhase.AVAILABLE))
        return ObjectReply(object=obj.to_dict())

    # -- claims ---------------------------------------------------------------------------------

    def scoped_mounts(self, mounts: Sequence[VolumeMount]) -> tuple[VolumeMount, ...]:
        """``mounts`` with each name as the calling tenant's volume id (unchanged for
        administrators). Raises ResourceInvalid naming the entry."""
        s = scope()
        if s is None:
            return tuple(mounts)
        return tuple(
            dataclasses.replace(m, name=scoped_name(s, "volume", m.name, f"spec.volumes[{i}].name"))
            for i, m in enumerate(mounts)
        )

    async def claim(self, namespace: str, sandbox: str, mounts: Sequence[VolumeMount]) -> None:
        """Record ``sandbox`` as the writer or a reader of each volume, all or none.

        Raises:
            ResourceInvalid: a volume does not exist (naming the entry's field).
            VolumeInUse: a volume is held in a way that excludes this mount (naming holders).
        """
        done: list[VolumeMount] = []
        try:
            for i, mount in enumerate(mounts):
                await self._claim_one(namespace, sandbox, mount, i)
                done.append(mount)
        except BaseException:
            await self.release(namespace, sandbox, [m.name for m in done])
            raise

    async def _claim_one(self, namespace: str, sandbox: str, mount: VolumeMount, i: int) -> None:
        for _ in range(MAX_CONFLICTS):
            try:
                obj = await self.store.get(VOLUME, namespace, mount.name)
            except ResourceNotFound:
                raise ResourceInvalid(
                    f"unknown SandboxVolume {mount.name!r}: create it first (sandpod volume "
                    "create)",
                    field=f"spec.volumes[{i}].name",
                ) from None
            status = SandboxVolumeStatus.from_dict(obj.status)
            if status.phase in (VolumePhase.PENDING, VolumePhase.FAILED):
                raise ResourceInvalid(
                    f"SandboxVolume {mount.name!r} is {status.phase}: it has no storage",
                    field=f"spec.volumes[{i}].name",
                )
            others = tuple(h for h in status.holders if h != sandbox)
            if mount.read_only:
                if status.writer and status.writer != sandbox:
                    raise _in_use(mount.name, (status.writer,), "mount it read-only")
                readers = tuple(sorted({*status.readers, sandbox}))
                new = dataclasses.replace(status, readers=readers)
            else:
                if others:
                    raise _in_use(mount.name, others, "mount it read-write")
                new = dataclasses.replace(status, writer=sandbox)
            new = dataclasses.replace(new, phase=VolumePhase.IN_USE)
            if new == status:
                return  # already this sandbox's (the reconciler claiming what the API did)
            try:
                await self.store.update_status(dataclasses.replace(obj, status=new.to_dict()))
            except ResourceConflict:
                continue  # someone claimed or released meanwhile: decide again on fresh state
            log.info("volume_claimed", volume=mount.name, sandbox=sandbox, ro=mount.read_only)
            how = "read-only" if mount.read_only else "read-write"
            await self._event(
                mount.name, namespace, "claimed", str(new.phase), sandbox=sandbox, how=how
            )
            return
        raise ResourceConflict(f"SandboxVolume {mount.name!r} keeps changing; retry")

    async def release(self, namespace: str, sandbox: str, names: Sequence[str]) -> None:
        """Take ``sandbox`` out of each named volume's holders (idempotent; a missing volume is
        skipped)."""
        for name in names:
            for _ in range(MAX_CONFLICTS):
                try:
                    obj = await self.store.get(VOLUME, namespace, name)
                except ResourceNotFound:
                    break
                status = SandboxVolumeStatus.from_dict(obj.status)
                if sandbox not in status.holders:
                    break
                new = dataclasses.replace(
                    status,
                    writer=None if status.writer == sandbox else status.writer,
                    readers=tuple(r for r in status.readers if r != sandbox),
                )
                if not new.holders:
                    new = dataclasses.replace(new, phase=VolumePhase.AVAILABLE)
                try:
                    await self.store.update_status(dataclasses.replace(obj, status=new.to_dict()))
                except ResourceConflict:
                    continue
                log.info("volume_released", volume=name, sandbox=sandbox)
                await self._event(name, namespace, "released", str(new.phase), sandbox=sandbox)
                break

    async def _with_usage(self, obj: Resource) -> Resource:
        if self.backend is None:
            return obj
        try:
            used = await self.backend.usage(obj.metadata.namespace, obj.metadata.name)
        except OSError:
            return obj
        if used is None:
            return obj
        status = dataclasses.replace(SandboxVolumeStatus.from_dict(obj.status), used_bytes=used)
        return dataclasses.replace(obj, status=status.to_dict())


class StaleHolders:
    """Releases holders whose Sandbox is gone without having released them (a replica that
    crashed between claiming and writing the Sandbox, a Sandbox removed from the store by
    hand). The leader's resync calls :meth:`sweep`; a holder is released only when two
    consecutive sweeps found no Sandbox of its name, so a create that has claimed and is about
    to write its Sandbox (milliseconds) is never taken for one. Volumes are listed before
    Sandboxes: a holder seen in the volume list was claimed before the Sandbox list was read."""

    def __init__(self, volumes: Volumes) -> None:
        self.volumes = volumes
        self._suspects: set[tuple[str, str, str]] = set()  # (namespace, volume, sandbox)

    async def sweep(self, sandbox_kind: str) -> None:
        store = self.volumes.store
        items, _ = await store.list(VOLUME, None)
        held = {
            (v.metadata.namespace, v.metadata.name, h)
            for v in items
            for h in SandboxVolumeStatus.from_dict(v.status).holders
        }
        if not held:
            self._suspects = set()
            return
        sandboxes, _ = await store.list(sandbox_kind, None)
        alive = {(o.metadata.namespace, o.metadata.name) for o in sandboxes}
        missing = {(ns, vol, h) for ns, vol, h in held if (ns, h) not in alive}
        for ns, vol, holder in sorted(missing & self._suspects):
            log.warning("volume_stale_holder_released", volume=vol, sandbox=holder)
            await self.volumes.release(ns, holder, [vol])
        self._suspects = missing - self._suspects


def _in_use(name: str, holders: Sequence[str], what: str) -> VolumeInUse:
    return VolumeInUse(
        f"SandboxVolume {name!r} is mounted by {', '.join(holders)}: cannot {what} "
        "(a volume is read-write for one sandbox, or read-only for many)",
        name=name,
        holders=",".join(holders),
    )
