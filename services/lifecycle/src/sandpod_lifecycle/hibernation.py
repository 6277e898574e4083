"""Hibernation: an idle sandbox's files kept in a snapshot, its instance gone, woken on use.

With ``idlePolicy: Hibernate`` (the sandbox's, else its template's), an idle sandbox is not
deleted. The steps (``steps.py``) call :meth:`Hibernator.hibernate`:

    phase Hibernating   its execd stops serving (a request now finds no responder: the
                        client asks the lifecycle to wake it, see ``sandpod_client.channel``);
                        a Pod's execd freezes its commands instead (new ones are refused with
                        ``sandbox.paused``) until the Pod is deleted
    capture             its writable layer and workspace, frozen, into the snapshot
                        ``hib-<hash of namespace/name/uid>`` (labelled with the sandbox: it
                        cannot be deleted while the sandbox exists; its layers only add to
                        what the sandbox started from)
    destroy             its processes end, its memory and cgroups are freed (the Pod is
                        deleted; the Sandbox stays)
    phase Hibernated    condition Hibernated=True, reason FilesOnly: processes do not survive

A wake (``sandboxes.wake``: the SDK's and gateway's calls do it on their own when they find
no responder; ``resume`` and claims too) sets the phase back to Pending; the create step then
restores the instance from that snapshot (``Restores.resolve`` finds it first) and the caller's
request is answered once it runs. Deleting the sandbox deletes its hibernation snapshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Protocol

import structlog

from sandpod_contract.errors import ResourceNotFound
from sandpod_contract.resources import API_VERSION
from sandpod_contract.snapshots import SnapshotPhase, SnapshotSpec, SnapshotStatus
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.snapshots.controller import SnapshotController
from sandpod_lifecycle.snapshots.objects import HIBERNATION_LABEL, SNAPSHOT
from sandpod_lifecycle.snapshots.restore import hibernation_name
from sandpod_store import ObjectMeta, Resource, SandboxView, Store

__all__ = ["FILES_ONLY", "HibernatingDriver", "Hibernator"]

log = structlog.get_logger("sandpod.lifecycle.hibernation")

# seconds a command that started just before the hibernation may run on (below the node
# request's 10 s deadline); one still running then is killed with the instance
DRAIN = 8.0
FILES_ONLY = (
    "hibernated: its files are kept in snapshot {name}; its processes were stopped (this node "
    "does not checkpoint processes) and its memory freed; its next use wakes it"
)


class HibernatingDriver(Protocol):
    """A runtime that can hibernate: ``LocalDriver`` (its execd stops serving) or
    ``PodDriver`` (its commands are frozen; the Pod is deleted)."""

    name: str

    async def stop_serving(self, sandbox_id: str, drain: float = 0.0) -> None: ...
    async def resume(self, sandbox_id: str) -> None: ...
    async def destroy(self, sandbox_id: str) -> None: ...


class Hibernator:
    def __init__(
        self, store: Store, driver: HibernatingDriver, snapshots: SnapshotController
    ) -> None:
        self.store = store
        self.driver = driver
        self.snapshots = snapshots

    async def hibernate(self, view: SandboxView) -> str:
        """Stop serving, capture into the sandbox's hibernation snapshot, destroy the instance;
        the snapshot's name.

        Raises:
            SnapshotFailed, RuntimeFailure, SandpodError: the capture failed (the instance is
                kept: the caller serves it again).
        """
        owner = Owner(view.namespace, view.obj.metadata.uid)
        name = hibernation_name(owner, view.name)
        await self.driver.stop_serving(view.name, drain=DRAIN)
        try:
            obj = await self._pending(view, name)
            await self.snapshots.capture_now(obj)
        except BaseException:
            if self.driver.name == "kubernetes":  # its commands were frozen: they run on
                with contextlib.suppress(Exception):
                    await self.driver.resume(view.name)
            raise
        await self.driver.destroy(view.name)
        log.info("sandbox_hibernated", sandbox=view.name, snapshot=name)
        return name

    async def forget(self, view: SandboxView) -> None:
        """The sandbox is gone: its hibernation snapshot goes (and its own layers with it)."""
        name = hibernation_name(Owner(view.namespace, view.obj.metadata.uid), view.name)
        try:
            await self.store.delete(SNAPSHOT, view.namespace, name)
        except ResourceNotFound:
            return
        self.snapshots.collect_soon()

    async def _pending(self, view: SandboxView, name: str) -> Resource:
        """The hibernation snapshot, Pending (made now, or kept with its layers listed: the
        running instance stacks on them until it is destroyed)."""
        try:
            obj = await self.store.get(SNAPSHOT, view.namespace, name)
        except ResourceNotFound:
            meta = ObjectMeta(
                name=name,
                namespace=view.namespace,
                labels={HIBERNATION_LABEL: view.name},
            )
            spec = SnapshotSpec(source_ref=view.name).to_dict()
            obj = await self.store.create(
                Resource(api_version=API_VERSION, kind=SNAPSHOT, metadata=meta, spec=spec)
            )
        status = SnapshotStatus.from_dict(obj.status)
        pending = dataclasses.replace(
            status, phase=SnapshotPhase.PENDING, source_uid=view.obj.metadata.uid
        )
        return await self.store.update_status(dataclasses.replace(obj, status=pending.to_dict()))
