"""Snapshots in the lifecycle service: the node's layer store, the controller, the API routes.

Only the local runtime as root takes and restores snapshots (``LocalSnapshots``: frozen jails,
id-mapped layers); on any other runtime the routes still answer and a snapshot fails with
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
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.driver import Driver
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.runtime.local_driver import LocalDriver
from sandpod_lifecycle.runtime.localsnap import LocalSnapshots
from sandpod_lifecycle.runtime.snaplayers import LayerStore
from sandpod_lifecycle.snapshots.api import SnapshotApi, SnapshotQuota, Wait
from sandpod_lifecycle.snapshots.controller import SnapshotController, Templates
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
    local: LocalSnapshots | None = None
    restores: Restores | None = None
    if isinstance(driver, LocalDriver) and os.geteuid() == 0:
        blobs: BlobStore
        if s3 is not None:
            store_s3 = S3BlobStore(s3)
            try:
                await store_s3.ensure_bucket()
            except SandpodError as exc:  # a bucket made by its owner: it may still work
                log.warning("snapshot_bucket_not_created", bucket=s3.bucket, error=str(exc))
            blobs = store_s3
        else:
            blobs = JetStreamBlobStore(await bus.objects(subjects.storage("snapshots")))
        layers = LayerStore(state_dir / "snapshots", blobs)
        local = LocalSnapshots(driver.runtime, layers)
        restores = Restores(store, templates, local)
        driver.restores = restores
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
