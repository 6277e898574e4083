"""Take the snapshots asked for, keep them as long as asked, and drop layers nothing shares.

Data flow: a store watch of SandboxSnapshots (and a periodic resync) puts ``namespace/name`` on a
keyed work queue; a worker takes a ``Pending`` one, checks its source (the same Sandbox object,
running or paused), captures it through the node's :class:`LocalSnapshots` (frozen, layered,
stored; in Kubernetes mode ``PodSnapshots``, through the Pod's execd) and writes ``Ready``
with the layer chain -- or ``Failed`` with the reason. A capture
that fails for a reason that may pass (a full disk, the object store down) is retried with
backoff, then fails. Only after ``Ready`` is written does the instance's capture record move on
(the next snapshot of it diffs from this one): a lifecycle killed mid-capture leaves a
``Pending`` snapshot, which the next one captures again from scratch (the staging debris is
removed at start; a blob stored but never named is collected), never a half-written one marked
usable.

Retention (each resync): a ``Ready`` snapshot past ``ttlSeconds`` is deleted, and so are the
older ones of a source beyond a snapshot's ``retainCount`` -- unless something restores from
it. Collection: a layer (here and in the object store) that no SandboxSnapshot lists is
removed; captures and collection never run at the same time (a captured layer is listed by its
snapshot before the lock is released).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from sandpod_contract.errors import (
    ResourceConflict,
    ResourceNotFound,
    SandpodError,
    SnapshotFailed,
)
from sandpod_contract.resources import Phase, SandboxSpec, SandboxTemplateSpec
from sandpod_contract.snapshots import (
    LayerRef,
    SnapshotPhase,
    SnapshotReason,
    SnapshotSpec,
    SnapshotStatus,
)
from sandpod_contract.times import from_rfc3339, to_rfc3339
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.objects import SANDBOX
from sandpod_lifecycle.runtime.base import InstanceNotFound, RuntimeFailure
from sandpod_lifecycle.runtime.podsnap import WORKSPACE_ONLY, PodCapture
from sandpod_lifecycle.runtime.snaplayers import LayerInfo, LayerStore
from sandpod_lifecycle.snapshots.objects import (
    HIBERNATION_LABEL,
    SNAPSHOT,
    dependents,
    with_phase,
)
from sandpod_lifecycle.snapshots.restore import Restores
from sandpod_service.clock import REAL, Clock
from sandpod_service.workqueue import WorkQueue
from sandpod_store import Resource, Store

__all__ = ["SnapshotController"]

log = structlog.get_logger("sandpod.lifecycle.snapshots")

RETRY = 2.0  # seconds before a capture that may pass is tried again
ADOPT_AFTER = 10.0  # seconds after which a snapshot the API never completed is taken anyway
MAX_ATTEMPTS = 5
UNSUPPORTED = (
    "this lifecycle's runtime cannot take snapshots (the local runtime as root and the "
    "kubernetes runtime can)"
)

Templates = Callable[[str, str | None], Awaitable[SandboxTemplateSpec]]


class Captured(Protocol):
    """What a capture returns (``localsnap.Capture``, ``podsnap.PodCapture``)."""

    @property
    def chain(self) -> tuple[LayerInfo, ...]: ...
    @property
    def new(self) -> tuple[LayerInfo, ...]: ...
    @property
    def previous(self) -> str | None: ...


class Snapshotter(Protocol):
    """A runtime's captures (``LocalSnapshots``: frozen jails; ``PodSnapshots``: through a
    Pod's execd)."""

    layers: LayerStore

    async def capture(self, sandbox_id: str, restored: tuple[LayerInfo, ...] = ()) -> Any:
        """A :class:`Captured` (Any: each runtime's commit takes its own)."""

    def commit(self, capture: Any, name: str) -> None: ...


class SnapshotController:
    def __init__(
        self,
        *,
        store: Store,
        events: Events,
        snapshots: Snapshotter | None,
        templates: Templates,
        restores: Restores | None = None,
        clock: Clock = REAL,
        resync: float = 30.0,
    ) -> None:
        self.store = store
        self.events = events
        self.snapshots = snapshots
        self.restores = restores
        self._templates = templates
        self._clock = clock
        self._resync = resync
        self._queue = WorkQueue("snapshots", self._handle, workers=2, clock=clock)
        self._attempts: dict[str, int] = {}
        self._lock = asyncio.Lock()  # captures vs collection
        self._collect = asyncio.Event()

    async def run(self) -> None:
        """Watch snapshots, capture, retain and collect until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(), name="snapshot-watch")
            tg.create_task(self._queue.run(), name="snapshot-captures")
            tg.create_task(self._periodic(), name="snapshot-retention")
            tg.create_task(self._collector(), name="snapshot-collector")

    def collect_soon(self) -> None:
        """A snapshot was deleted: collect the layers nothing lists any more."""
        self._collect.set()

    async def restored_chain(self, source: Resource) -> tuple[str | None, tuple[LayerRef, ...]]:
        """(snapshot name, its layers) the running instance of Sandbox ``source`` started from
        ((None, ()): none): the snapshot it hibernated into, its own ``snapshotRef``, else its
        template's."""
        ns = source.metadata.namespace
        spec = SandboxSpec.from_dict(source.spec)
        template = await self._templates(ns, spec.template_ref)
        if self.restores is not None:
            owner = Owner(ns, source.metadata.uid)
            name = await self.restores.source(owner, source.metadata.name, spec, template)
        else:
            name = spec.snapshot_ref or template.snapshot_ref
        if name is None:
            return None, ()
        obj = await self.store.get(SNAPSHOT, ns, name)
        return name, SnapshotStatus.from_dict(obj.status).layers

    # -- intake --------------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            try:
                items, revision = await self.store.list(SNAPSHOT, None)
                for obj in items:
                    self._queue.add(f"{obj.metadata.namespace}/{obj.metadata.name}")
                async for event in self.store.watch(SNAPSHOT, None, revision):
                    self._queue.add(f"{event.namespace}/{event.name}")
            except SandpodError as exc:
                log.warning("snapshot_watch_failed_restarting", error=exc.message)
                await self._clock.sleep(1.0)

    async def _periodic(self) -> None:
        while True:
            await self._clock.sleep(self._resync)
            try:
                await self.retain()
            except SandpodError as exc:
                log.warning("snapshot_retention_failed", error=exc.message)

    async def _collector(self) -> None:
        self._collect.set()  # once at start: a crash may have left an unnamed blob
        while True:
            await self._collect.wait()
            self._collect.clear()
            try:
                await self.collect()
            except (SandpodError, RuntimeFailure, OSError) as exc:
                log.warning("snapshot_collect_failed", error=str(exc))

    # -- capture -------------------------------------------------------------------------------

    async def _handle(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        try:
            obj = await self.store.get(SNAPSHOT, namespace, name)
        except ResourceNotFound:
            self._attempts.pop(key, None)
            return None
        status = SnapshotStatus.from_dict(obj.status)
        if status.phase is not SnapshotPhase.PENDING or HIBERNATION_LABEL in obj.metadata.labels:
            return None  # done, or a hibernation's (taken by the sandbox's own step)
        if not status.source_uid and self._age(obj) < ADOPT_AFTER:
            return ADOPT_AFTER  # the API writes the source's uid next (its update queues this)
        try:
            await self._capture(obj)
        except ResourceConflict:
            self._collect.set()  # the layers it stored are named by no snapshot now
            return RETRY
        except (SandpodError, RuntimeFailure, OSError) as exc:
            retryable = getattr(exc, "retryable", True)
            attempts = self._attempts[key] = self._attempts.get(key, 0) + 1
            log.warning("snapshot_capture_failed", snapshot=key, attempt=attempts, error=str(exc))
            if retryable and attempts < MAX_ATTEMPTS:
                return RETRY * attempts
            await self._fail(obj, SnapshotReason.CAPTURE_FAILED, f"the capture failed: {exc}")
        self._attempts.pop(key, None)
        return None

    def _age(self, obj: Resource) -> float:
        created = obj.metadata.creation_timestamp
        return self._clock.now() - from_rfc3339(created) if created else ADOPT_AFTER

    async def capture_now(self, obj: Resource) -> None:
        """Capture snapshot ``obj`` of its source now (a hibernation: the source is
        ``Hibernating``, its execd stopped), raising instead of recording a failure.

        Raises:
            SnapshotFailed: it cannot be taken (the reason says why). RuntimeFailure,
                SandpodError: the capture failed.
        """
        await self._capture(obj, hibernating=True)

    async def _capture(self, obj: Resource, *, hibernating: bool = False) -> None:
        spec = SnapshotSpec.from_dict(obj.spec)
        status = SnapshotStatus.from_dict(obj.status)
        ns = obj.metadata.namespace
        if self.snapshots is None:
            await self._fail(obj, SnapshotReason.UNSUPPORTED, UNSUPPORTED)
            return
        try:
            source = await self.store.get(SANDBOX, ns, spec.source_ref)
        except ResourceNotFound:
            source = None
        if source is None or (status.source_uid and source.metadata.uid != status.source_uid):
            await self._fail(obj, SnapshotReason.SOURCE_NOT_FOUND, f"no Sandbox {spec.source_ref}")
            return
        phase = (source.status or {}).get("phase")
        allowed = (
            (str(Phase.HIBERNATING),) if hibernating else (str(Phase.RUNNING), str(Phase.PAUSED))
        )
        if phase not in allowed:
            message = (
                f"Sandbox {spec.source_ref} is {phase or 'Pending'}: only a running or paused one"
            )
            await self._fail(obj, SnapshotReason.SOURCE_NOT_RUNNING, message)
            return
        sandbox_spec = SandboxSpec.from_dict(source.spec)
        restored_name, restored = await self.restored_chain(source)
        template = sandbox_spec.template_ref
        if restored_name is not None:
            base = await self.store.get(SNAPSHOT, ns, restored_name)
            template = SnapshotStatus.from_dict(base.status).template or template
        async with self._lock:
            try:
                cap = await self.snapshots.capture(
                    spec.source_ref, tuple(_info(x) for x in restored)
                )
            except InstanceNotFound as exc:
                await self._fail(obj, SnapshotReason.SOURCE_NOT_RUNNING, exc.message)
                return
            await self._ready(obj, cap, template, cap.previous or restored_name)
        self.snapshots.commit(cap, obj.metadata.name)
        await self.events.publish(
            name=spec.source_ref,
            namespace=ns,
            type_="snapshotted",
            phase=str(phase),
            reason=str(SnapshotReason.CAPTURED),
            message=obj.metadata.name,
        )
        if spec.retain_count is not None:
            await self._retain_source(ns, spec.source_ref, spec.retain_count)

    async def _ready(
        self, obj: Resource, cap: Captured, template: str | None, parent: str | None
    ) -> None:
        layers = tuple(_ref(x) for x in cap.chain)
        status = SnapshotStatus(
            source_uid=SnapshotStatus.from_dict(obj.status).source_uid,
            template=template,
            parent=parent,
            layers=layers,
            size_bytes=sum(x.size for x in cap.new),
            total_bytes=sum(x.size for x in layers),
            ready_time=to_rfc3339(self._clock.now()),
        )
        message = f"{len(cap.new)} new layer(s), {len(layers)} in all"
        if isinstance(cap, PodCapture):  # what differs from the local runtime's, said
            parts = WORKSPACE_ONLY if cap.workspace_only else "/workspace and root fs changes"
            message += f"; {parts}; commands frozen by {cap.mechanism or 'nothing'}"
        status = with_phase(
            status, SnapshotPhase.READY, SnapshotReason.CAPTURED, message, self._clock.now()
        )
        await self.store.update_status(dataclasses.replace(obj, status=status.to_dict()))
        log.info("snapshot_ready", snapshot=obj.metadata.name, layers=len(layers), new=len(cap.new))

    async def _fail(self, obj: Resource, reason: SnapshotReason, message: str) -> None:
        if HIBERNATION_LABEL in obj.metadata.labels:  # the hibernating step decides
            raise SnapshotFailed(message, snapshot=obj.metadata.name, reason=str(reason))
        status = with_phase(
            SnapshotStatus.from_dict(obj.status),
            SnapshotPhase.FAILED,
            reason,
            message,
            self._clock.now(),
        )
        await self.store.update_status(dataclasses.replace(obj, status=status.to_dict()))
        spec = SnapshotSpec.from_dict(obj.spec)
        await self.events.publish(
            name=spec.source_ref,
            namespace=obj.metadata.namespace,
            type_="snapshot_failed",
            phase="",
            reason=str(reason),
            message=f"{obj.metadata.name}: {message}",
        )

    # -- retention and collection ---------------------------------------------------------------

    async def retain(self) -> None:
        """Delete what ``ttlSeconds`` and ``retainCount`` no longer keep (never one in use)."""
        items, _ = await self.store.list(SNAPSHOT, None)
        now = self._clock.now()
        for obj in items:
            spec, status = SnapshotSpec.from_dict(obj.spec), SnapshotStatus.from_dict(obj.status)
            if status.phase is SnapshotPhase.READY and spec.ttl_seconds and status.ready_time:
                if from_rfc3339(status.ready_time) + spec.ttl_seconds <= now:
                    await self._drop(obj, "ttl")
            elif status.phase is SnapshotPhase.READY and spec.retain_count:
                await self._retain_source(
                    obj.metadata.namespace, spec.source_ref, spec.retain_count
                )

    async def _retain_source(self, namespace: str, source: str, keep: int) -> None:
        items, _ = await self.store.list(SNAPSHOT, namespace)
        ready = [
            o
            for o in items
            if SnapshotSpec.from_dict(o.spec).source_ref == source
            and SnapshotStatus.from_dict(o.status).phase is SnapshotPhase.READY
        ]
        ready.sort(key=lambda o: SnapshotStatus.from_dict(o.status).ready_time or "", reverse=True)
        for obj in ready[keep:]:
            await self._drop(obj, "retainCount")

    async def _drop(self, obj: Resource, why: str) -> None:
        ns, name = obj.metadata.namespace, obj.metadata.name
        if await dependents(self.store, ns, name):
            return
        try:
            await self.store.delete(SNAPSHOT, ns, name, obj.metadata.resource_version)
        except (ResourceNotFound, ResourceConflict):
            return
        log.info("snapshot_retired", snapshot=name, why=why)
        self._collect.set()

    async def collect(self) -> int:
        """Remove every layer no SandboxSnapshot lists (here and in the object store); the
        number removed."""
        if self.snapshots is None:
            return 0
        async with self._lock:
            items, _ = await self.store.list(SNAPSHOT, None)
            listed = {x.digest for o in items for x in SnapshotStatus.from_dict(o.status).layers}
            layers = self.snapshots.layers
            stored = set(layers.local()) | set(await layers.stored())
            removed = 0
            for digest in sorted(stored - listed):
                await layers.remove(digest)
                removed += 1
        if removed:
            log.info("snapshot_layers_collected", removed=removed)
        return removed


def _info(ref: LayerRef) -> LayerInfo:
    return LayerInfo(
        digest=ref.digest, size=ref.size, part=ref.part, owner=ref.owner, unpacked=ref.unpacked
    )


def _ref(info: LayerInfo) -> LayerRef:
    return LayerRef(
        digest=info.digest, size=info.size, part=info.part, owner=info.owner, unpacked=info.unpacked
    )
