"""What a new local instance restores: the snapshot its Sandbox (or template) names, as layers.

The local driver asks :meth:`Restores.resolve` while creating an instance. The snapshot is
looked up in the Sandbox's namespace (a tenant's sandbox can only name its own); its root is
the base of the template it was *taken* on (its files are changes to that base), while the
Sandbox's own template still gives resources, environment and network. A snapshot still being
taken makes the create wait (``SnapshotPending``); one that is gone, failed, or whose layers
the object store returns changed fails the Sandbox (``SnapshotUnavailable``), never a sandbox
that silently starts empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable

from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.resources import ConditionReason, SandboxSpec, SandboxTemplateSpec
from sandpod_contract.snapshots import SnapshotPhase, SnapshotStatus
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.runtime.base import InstanceUnhealthy, SnapshotLayer
from sandpod_lifecycle.runtime.localsnap import LocalSnapshots
from sandpod_lifecycle.runtime.podsnap import PodSnapshots
from sandpod_lifecycle.runtime.snaplayers import LayerCorrupt, LayerInfo, SnapshotStoreFailed
from sandpod_lifecycle.snapshots.objects import SNAPSHOT
from sandpod_store import Store

__all__ = ["Restore", "Restores", "hibernation_name"]

Templates = Callable[[str, str | None], Awaitable[SandboxTemplateSpec]]


@dataclasses.dataclass(frozen=True, slots=True)
class Restore:
    name: str
    root: SandboxTemplateSpec  # the template the snapshot was taken on: its base is the root's
    layers: tuple[SnapshotLayer, ...]


def hibernation_name(owner: Owner, sandbox_id: str) -> str:
    """The name of the snapshot a sandbox hibernates into: one per Sandbox object (its uid:
    a new sandbox of the same name never wakes into an old one's files)."""
    digest = hashlib.sha256(f"{owner.namespace}/{sandbox_id}/{owner.uid}".encode()).hexdigest()
    return f"hib-{digest[:24]}"


class Restores:
    def __init__(
        self, store: Store, templates: Templates, snapshots: LocalSnapshots | PodSnapshots
    ) -> None:
        self.store = store
        self._templates = templates
        self.snapshots = snapshots

    async def source(
        self, owner: Owner, sandbox_id: str, spec: SandboxSpec, template: SandboxTemplateSpec
    ) -> str | None:
        """The snapshot an instance of this sandbox starts from: the one it hibernated into,
        else its own ``snapshotRef``, else its template's (None: none)."""
        hib = hibernation_name(owner, sandbox_id)
        try:
            obj = await self.store.get(SNAPSHOT, owner.namespace, hib)
        except ResourceNotFound:
            obj = None
        if obj is None or not SnapshotStatus.from_dict(obj.status).layers:
            return spec.snapshot_ref or template.snapshot_ref  # never hibernated (yet)
        return hib

    async def resolve(
        self, owner: Owner, sandbox_id: str, spec: SandboxSpec, template: SandboxTemplateSpec
    ) -> Restore | None:
        """The snapshot to restore (None: the sandbox starts from its template's empty state).

        Raises:
            InstanceUnhealthy: ``SnapshotPending`` (wait) or ``SnapshotUnavailable`` (give up).
            SnapshotStoreFailed: a layer could not be fetched now (retried).
        """
        namespace = owner.namespace
        name = await self.source(owner, sandbox_id, spec, template)
        if name is None:
            return None
        try:
            obj = await self.store.get(SNAPSHOT, namespace, name)
        except ResourceNotFound:
            raise _gone(f"snapshot {name} does not exist (deleted?)") from None
        status = SnapshotStatus.from_dict(obj.status)
        if status.phase is SnapshotPhase.PENDING:
            raise InstanceUnhealthy(
                f"snapshot {name} is still being taken",
                reason=ConditionReason.SNAPSHOT_PENDING,
                terminal=False,
            )
        if status.phase is SnapshotPhase.FAILED:
            raise _gone(f"snapshot {name} failed and cannot be restored")
        try:
            root = await self._templates(namespace, status.template)
        except ResourceInvalid:
            raise _gone(
                f"snapshot {name} was taken on template {status.template}, which is gone"
            ) from None
        chain = tuple(
            LayerInfo(x.digest, x.size, x.part, x.owner, x.unpacked) for x in status.layers
        )
        try:
            layers = await self.snapshots.restore_layers(chain)
        except LayerCorrupt as exc:
            raise _gone(f"snapshot {name} cannot be restored: {exc.message}") from exc
        except SnapshotStoreFailed:
            raise
        return Restore(name, root, layers)

    def forget(self, sandbox_id: str) -> None:
        self.snapshots.forget(sandbox_id)


def _gone(message: str) -> InstanceUnhealthy:
    return InstanceUnhealthy(message, reason=ConditionReason.SNAPSHOT_UNAVAILABLE, terminal=True)
