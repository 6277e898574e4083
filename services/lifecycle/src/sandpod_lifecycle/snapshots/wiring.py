"""Snapshots in the lifecycle service: the node's layer store, the controller, the API routes.

The local runtime as root takes and restores snapshots with ``LocalSnapshots`` (frozen jails,
id-mapped layers); the kubernetes runtime with ``PodSnapshots`` (through each Pod's execd:
/workspace only), restoring a new Pod's files through :class:`PodRestorer` before the Pod
driver reports it. On any other runtime the routes still answer and a snapshot fails with
``Unsupported``, saying so.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from sandpod_blobs import BlobStore, JetStreamBlobStore, S3BlobStore, S3Settings
from sandpod_bus import Bus
from sandpod_contract.errors import SandpodError
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.driver import Driver, Owner
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.runtime.local_driver import LocalDriver
from sandpod_lifecycle.runtime.localsnap import LocalSnapshots
from sandpod_lifecycle.runtime.podsnap import PodSnapshots
from sandpod_lifecycle.runtime.snaplayers import LayerStore
from sandpod_lifecycle.snapshots.api import SnapshotApi, SnapshotQuota, Wait
from sandpod_lifecycle.snapshots.controller import SnapshotController, Snapshotter, Templates
from sandpod_lifecycle.snapshots.restore import Restores
from sandpod_service.clock import Clock
from sandpod_store import Store

__all__ = ["Snapshots", "start_snapshots"]

log = structlog.get_logger("sandpod.lifecycle.snapshots")

Handler = Callable[[Any], Awaitable[Any]]


class Snapshots:
    def __init__(self, controller: SnapshotController, api: SnapshotApi) -> None:
        self.controller = controller
        self.api = api

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("snapshots", "create"): self.api.create,
            ("snapshots", "get"): self.api.get,
            ("snapshots", "list"): self.api.list,
            ("snapshots", "delete"): self.api.delete,
        }


class PodRestorer:
    """The Pod driver's ``restores``: resolve the snapshot a new Pod starts from (``Restores``:
    the Sandbox's namespace only; pending, failed, changed layers refused) and stream its files
    in (``PodSnapshots.restore_into``)."""

    def __init__(self, restores: Restores, pods: PodSnapshots) -> None:
        self.restores = restores
        self.pods = pods

    async def restore(
        self, sandbox_id: str, owner: Owner, spec: SandboxSpec, template: SandboxTemplateSpec
    ) -> None:
        found = await self.restores.resolve(owner, sandbox_id, spec, template)
        if found is None:
            return
        entries = await self.pods.restore_into(sandbox_id, found.name, found.layers)
        log.info("pod_restored", sandbox=sandbox_id, snapshot=found.name, entries=entries)

    def forget(self, sandbox_id: str) -> None:
        self.pods.forget(sandbox_id)


async def _blobs(bus: Bus, subjects: Subjects, s3: S3Settings | None) -> BlobStore:
    if s3 is None:
        return JetStreamBlobStore(await bus.objects(subjects.storage("snapshots")))
    store_s3 = S3BlobStore(s3)
    try:
        await store_s3.ensure_bucket()
    except SandpodError as exc:  # a bucket made by its owner: it may still work
        log.warning("snapshot_bucket_not_created", bucket=s3.bucket, error=str(exc))
    return store_s3


async def start_snapshots(
    *,
    bus: Bus,
    store: Store,
    events: Events,
    driver: Driver,
    templates: Templates,
    wait: Wait,
    subjects: Subjects,
    state_dir: Path,
    clock: Clock,
    s3: S3Settings | None = None,
    quota: SnapshotQuota | None = None,
) -> Snapshots:
    """The snapshot controller and API for this lifecycle (the caller runs ``controller.run``).
    Layers go to the installation's JetStream object store, or to S3 when ``s3`` is given
    (``SANDPOD_SNAPSHOT_S3_*``)."""
    local: Snapshotter | None = None
    restores: Restores | None = None
    if isinstance(driver, LocalDriver) and os.geteuid() == 0:
        layers = LayerStore(state_dir / "snapshots", await _blobs(bus, subjects, s3))
        local = LocalSnapshots(driver.runtime, layers)
        restores = Restores(store, templates, local)
        driver.restores = restores
    elif driver.name == "kubernetes" and hasattr(driver, "restores"):  # PodDriver (lazy import)
        layers = LayerStore(state_dir / "snapshots", await _blobs(bus, subjects, s3))
        pods = PodSnapshots(layers, bus, subjects)
        local = pods
        restores = Restores(store, templates, pods)
        driver.restores = PodRestorer(restores, pods)
    controller = SnapshotController(
        store=store,
        events=events,
        snapshots=local,
        templates=templates,
        restores=restores,
        clock=clock,
    )
    api = SnapshotApi(store, wait, controller.collect_soon, quota)
    return Snapshots(controller, api)
