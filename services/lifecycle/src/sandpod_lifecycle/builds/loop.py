"""Reconcile SandboxTemplates that have a ``spec.build``: build each generation once.

Data flow: a store watch on templates (plus the initial list) puts ``namespace/name`` on a
keyed work queue; a pass takes the template's lease, and if its status has not settled this
generation (``observedGeneration`` behind, or never built) writes ``phase: Building``, runs
:class:`~sandpod_lifecycle.builds.executor.Builder`, and writes ``Ready`` (the result key and
layers, condition ``Built=True``) or ``Failed`` (``Built=False``, the error's code as reason and
the failing step). A template changed during its build is left to the next pass (the watch saw
the change): only the generation built is ever reported.

Build logs go on the core NATS subject ``<prefix>.events.template.<name>.build`` (a
:class:`SandboxEvent` per line, ``type`` ``build``), then one ``built`` or ``build_failed``
event: the SDK subscribes before applying and follows them. The event stream captures those
subjects too, so the last lines stay readable there (its per-subject limit).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from sandpod_bus import Bus
from sandpod_contract.builds import BUILT, BuildPhase, BuildStatus
from sandpod_contract.errors import (
    ResourceConflict,
    ResourceInvalid,
    ResourceNotFound,
    SandpodError,
)
from sandpod_contract.resources import Condition, SandboxTemplateSpec
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.builds.events import publish_build_event
from sandpod_lifecycle.builds.results import BuildOwner, BuildResult, BuiltRef, Log
from sandpod_lifecycle.objects import TEMPLATE
from sandpod_lifecycle.runtime.base import RuntimeFailure
from sandpod_service.clock import REAL, Clock
from sandpod_service.leases import LeaseKeeper
from sandpod_service.workqueue import WorkQueue
from sandpod_store import Resource, Store
from sandpod_store.views import built_template, set_condition

__all__ = ["TemplateBuilder", "TemplateBuilds"]

log = structlog.get_logger("sandpod.lifecycle.builds")

RETRY = 5.0  # seconds before a build that failed for a passing reason is tried again


class TemplateBuilder(Protocol):
    """What builds a template: ``executor.Builder`` (local runtime, builder sandboxes on this
    node) or ``kube.PodBuilds`` (Kubernetes mode: a builder Pod, the image pushed)."""

    async def build(
        self,
        name: str,
        template: SandboxTemplateSpec,
        template_result: Callable[[str], Awaitable[BuiltRef]],
        emit: Log,
        owner: BuildOwner | None = None,
    ) -> BuildResult: ...

    async def forget(self, name: str) -> None: ...


class TemplateBuilds:
    def __init__(
        self,
        *,
        store: Store,
        builder: TemplateBuilder,
        leases: LeaseKeeper,
        bus: Bus,
        subjects: Subjects,
        clock: Clock = REAL,
    ) -> None:
        self.store = store
        self.builder = builder
        self.leases = leases
        self._bus = bus
        self._subjects = subjects
        self._clock = clock
        self._queue = WorkQueue("templates", self._handle, workers=2, clock=clock)
        self._resync = asyncio.Event()

    async def run(self) -> None:
        """Watch templates and build them until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(), name="template-watch")
            tg.create_task(self._resyncs(), name="template-resync")
            tg.create_task(self._queue.run(), name="template-builds")

    def resync_soon(self) -> None:
        """Queue every template again (this replica just became the leader: templates it saw
        before, when it could not act on them, must not wait for their next change)."""
        self._resync.set()

    async def _resyncs(self) -> None:
        while True:
            await self._resync.wait()
            self._resync.clear()
            try:
                items, _ = await self.store.list(TEMPLATE, None)
            except SandpodError as exc:
                log.warning("template_resync_failed", error=exc.message)
                self._resync.set()
                await self._clock.sleep(1.0)
                continue
            for obj in items:
                self._queue.add(f"{obj.metadata.namespace}/{obj.metadata.name}")

    async def _watch(self) -> None:
        while True:
            try:
                items, revision = await self.store.list(TEMPLATE, None)
                for obj in items:
                    self._queue.add(f"{obj.metadata.namespace}/{obj.metadata.name}")
                async for event in self.store.watch(TEMPLATE, None, revision):
                    self._queue.add(f"{event.namespace}/{event.name}")
            except SandpodError as exc:
                log.warning("template_watch_failed_restarting", error=exc.message)
                await self._clock.sleep(1.0)

    async def _handle(self, key: str) -> float | None:
        namespace, _, name = key.partition("/")
        lease = f"{TEMPLATE}.{namespace}.{name}"
        if not await self.leases.acquire(lease):
            return None
        try:
            return await self._reconcile(namespace, name)
        except (SandpodError, RuntimeFailure) as exc:
            log.warning("template_build_retry", template=key, error=str(exc))
            return RETRY

    async def _reconcile(self, namespace: str, name: str) -> float | None:
        try:
            obj = await self.store.get(TEMPLATE, namespace, name)
        except ResourceNotFound:  # deleted: its base image's layers may go at the next prune
            await self.builder.forget(name)
            return None
        spec = SandboxTemplateSpec.from_dict(obj.spec)
        status = BuildStatus.from_dict(obj.status)
        generation = obj.metadata.generation
        if spec.build is None or (
            status.observed_generation == generation
            and status.phase in (BuildPhase.READY, BuildPhase.FAILED)
        ):
            return None
        obj = await self._write(obj, BuildStatus(phase=BuildPhase.BUILDING), "Building", "")
        try:
            result = await self.builder.build(
                name,
                spec,
                lambda other: self._result_of(namespace, other),
                self._emitter(name),
                BuildOwner(namespace, name, obj.metadata.uid),
            )
        except SandpodError as exc:
            if exc.retryable:
                raise
            await self._failed(namespace, name, generation, exc)
            return None
        await self._ready(namespace, name, generation, result)
        return None

    async def _result_of(self, namespace: str, name: str) -> BuiltRef:
        try:
            other = built_template(await self.store.get(TEMPLATE, namespace, name))
        except ResourceNotFound:
            raise ResourceInvalid(
                f"the base template {name!r} does not exist", field="spec.build.from.template"
            ) from None
        if other.build is None or not other.build.result:
            raise ResourceInvalid(
                f"the base template {name!r} is not built (a template with a build, Ready)",
                field="spec.build.from.template",
            )
        return BuiltRef(other.build.result, other.build.image)

    async def _ready(self, namespace: str, name: str, generation: int, result: BuildResult) -> None:
        status = BuildStatus(
            phase=BuildPhase.READY,
            result_key=result.key,
            layers=result.layers,
            observed_generation=generation,
            image=result.image,
        )
        if await self._settle(namespace, name, generation, status, "Built", ""):
            await self._event(name, "built", BuildPhase.READY, "", f"built {result.key[:12]}")
            log.info(
                "template_built", template=name, key=result.key, ran=result.ran, image=result.image
            )

    async def _failed(self, namespace: str, name: str, generation: int, exc: SandpodError) -> None:
        step = exc.details.get("step")
        status = BuildStatus(
            phase=BuildPhase.FAILED,
            observed_generation=generation,
            failed_step=step if isinstance(step, int) else None,
        )
        if await self._settle(namespace, name, generation, status, exc.code, exc.message):
            await self._event(name, "build_failed", BuildPhase.FAILED, exc.code, exc.message)
            log.info("template_build_failed", template=name, error=exc.message)

    async def _settle(  # noqa: PLR0917 - the object's key, then what to write
        self,
        namespace: str,
        name: str,
        generation: int,
        status: BuildStatus,
        reason: str,
        message: str,
    ) -> bool:
        """Write the outcome of building ``generation``, unless the template moved on."""
        for _ in range(10):
            obj = await self.store.get(TEMPLATE, namespace, name)
            if obj.metadata.generation != generation:
                return False
            try:
                await self._write(obj, status, reason, message)
                return True
            except ResourceConflict:
                continue
        return False

    async def _write(
        self, obj: Resource, status: BuildStatus, reason: str, message: str
    ) -> Resource:
        ready = status.phase is BuildPhase.READY
        cond = Condition(
            BUILT,
            "True" if ready else "False",
            reason,
            message,
            observed_generation=obj.metadata.generation,
        )
        old = [Condition.from_dict(c) for c in obj.status.get("conditions") or ()]
        conditions = set_condition(old, cond, self._clock.now())
        raw = {**status.to_dict(), "conditions": [c.to_dict() for c in conditions]}
        return await self.store.update_status(dataclasses.replace(obj, status=raw))

    def _emitter(self, name: str) -> Callable[[str], Awaitable[None]]:
        async def emit(line: str) -> None:
            await self._event(name, "build", BuildPhase.BUILDING, "", line)

        return emit

    async def _event(
        self, name: str, type_: str, phase: BuildPhase, reason: str, message: str
    ) -> None:
        await publish_build_event(self._bus, self._subjects, name, type_, phase, reason, message)
