"""Drive every Sandbox to its spec: intake and scheduling of the lifecycle state machine.

Data flow: a store watch of Sandboxes, one of SandboxTemplates (a template's change, e.g. its
egress policy, queues the sandboxes made from it), a periodic resync and per-object timers (for
expiry and idle checks) put object names on a keyed work queue
(:class:`~sandpod_service.workqueue.WorkQueue`); workers take one name at a time -- never the
same name in two workers, so events for one object are handled in order while different objects
run in parallel -- acquire the object's lease (multi-replica safety), read it, and hand it to
:class:`~sandpod_lifecycle.steps.Steps`, which takes the one step its state calls for (the table
is there). Timers, the resync period and the watch's restart pause run on the injected
:class:`~sandpod_service.clock.Clock`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from sandpod_contract.errors import ResourceConflict, ResourceNotFound, SandpodError
from sandpod_contract.network import Rule
from sandpod_contract.pooling import BOUND_AT_ANNOTATION
from sandpod_contract.resources import OperatingMode, Phase
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.driver import Driver, ReportsLoss
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.hibernation import Hibernator
from sandpod_lifecycle.lifetime import Failures, bound_at
from sandpod_lifecycle.objects import SANDBOX, TEMPLATE
from sandpod_lifecycle.steps import Configure, Outcome, Probe, StepConfig, Steps, Templates
from sandpod_lifecycle.volumes import StaleHolders, Volumes
from sandpod_service.clock import REAL, Clock
from sandpod_service.leases import LeaseKeeper
from sandpod_service.workqueue import WorkQueue
from sandpod_store import EventType, Resource, SandboxView, Store

__all__ = ["Outcome", "Reconciler"]

log = structlog.get_logger("sandpod.lifecycle.reconciler")

RETRY_DELAY = 0.5  # seconds before a pass that asked to retry runs again, at the least


class Reconciler:
    def __init__(
        self,
        *,
        store: Store,
        driver: Driver,
        leases: LeaseKeeper,
        events: Events,
        templates: Templates,
        ready_probe: Callable[[str, float], Awaitable[bool]],
        idle_probe: Probe,
        configure: Configure | None = None,
        subjects: Subjects | None = None,
        workers: int = 8,
        max_failures: int = 5,
        resync: float = 10.0,
        ready_timeout: float = 30.0,
        bind_settle: float = 0.25,
        clock: Clock = REAL,
        keep: Callable[[], set[str]] | None = None,
        always_allowed: Sequence[Rule] = (),
        hibernator: Hibernator | None = None,
    ) -> None:
        self.store = store
        self._keep = keep  # instance ids with no Sandbox object that are not orphans (builders)
        self.driver = driver
        self.leases = leases
        self.events = events
        self.subjects = subjects or Subjects()
        self._resync = resync
        self._bind_settle = bind_settle
        self._clock = clock
        self._queue = WorkQueue("sandboxes", self._handle, workers=workers, clock=clock)
        self._failures: dict[str, Failures] = {}
        config = StepConfig(
            store=store,
            driver=driver,
            leases=leases,
            events=events,
            subjects=self.subjects,
            templates=templates,
            ready_probe=ready_probe,
            idle_probe=idle_probe,
            configure=configure,
            max_failures=max_failures,
            ready_timeout=ready_timeout,
            bind_settle=bind_settle,
            clock=clock,
            wake_at=self._wake_at,
            forget=self._queue.forget,
            always_allowed=tuple(always_allowed),
            hibernator=hibernator,
        )
        self._steps = Steps(config, self._failures)
        self._stale_holders = StaleHolders(Volumes(store, None, events))
        self._resync_now = asyncio.Event()
        self.reconciled = 0  # for tests and metrics
        if isinstance(driver, ReportsLoss):
            driver.on_lost(self._instance_lost)

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, name: str, namespace: str = "default") -> None:
        """Reconcile Sandbox ``namespace/name`` soon (once, however often it is asked)."""
        self._queue.add(_key(namespace, name))

    def _wake_at(self, name: str, when: float) -> None:
        """Reconcile ``name`` again at wall time ``when`` (the earliest timer wins)."""
        self._queue.add_after(name, when - self._clock.now())

    async def run(self) -> None:
        """Watch, resync and work until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(), name="watch")
            tg.create_task(self._watch_templates(), name="watch-templates")
            tg.create_task(self._resync_loop(), name="resync")
            tg.create_task(self._queue.run(), name="work")

    async def _watch(self) -> None:
        while True:
            try:
                items, revision = await self.store.list(SANDBOX, None)
                log.debug("watch_listed", count=len(items), revision=revision)
                for obj in items:
                    self.enqueue(obj.metadata.name, obj.metadata.namespace)
                async for event in self.store.watch(SANDBOX, None, revision):
                    settles = self._settles(event.resource)
                    if settles is not None:  # a claim's bind: nothing to do until it settled
                        self._wake_at(_key(event.namespace, event.name), settles)
                    else:
                        self.enqueue(event.name, event.namespace)
                    if event.type is EventType.DELETED:
                        self._failures.pop(_key(event.namespace, event.name), None)
            except SandpodError as exc:
                log.warning("watch_failed_restarting", error=exc.message)
                await self._clock.sleep(1.0)

    async def _watch_templates(self) -> None:
        """A template changed: queue the sandboxes made from it (their effective egress
        policy may follow it; a pass with nothing to do costs one read)."""
        while True:
            try:
                _, revision = await self.store.list(TEMPLATE, None)
                async for event in self.store.watch(TEMPLATE, None, revision):
                    items, _ = await self.store.list(SANDBOX, event.namespace)
                    for obj in items:
                        if (obj.spec.get("templateRef") or {}).get("name") == event.name:
                            self.enqueue(obj.metadata.name, obj.metadata.namespace)
            except SandpodError as exc:
                log.warning("template_watch_failed_restarting", error=exc.message)
                await self._clock.sleep(1.0)

    def _settles(self, obj: Resource | None) -> float | None:
        """When a just-bound running sandbox's pass is due (see ``_observe_generation``), if
        the change is only that bind; None: reconcile it now."""
        if obj is None or not obj.metadata.annotations.get(BOUND_AT_ANNOTATION):
            return None  # the common case, decided without building a view
        try:
            view = SandboxView.of(obj)
        except SandpodError:
            return None
        bound = bound_at(view)
        if bound is None:
            return None
        settles = bound + self._bind_settle
        quiet = (
            not view.deleting
            and view.status.phase is Phase.RUNNING
            and view.spec.operating_mode is OperatingMode.RUNNING
            and view.status.observed_generation != obj.metadata.generation
        )
        return settles if quiet and self._clock.now() < settles else None

    def _instance_lost(self, sandbox_id: str) -> None:
        """The driver saw an instance die: look at every object now (its namespace is not
        known here), rather than at the next period; its pass then fails it."""
        log.info("instance_lost_noticed", sandbox=sandbox_id)
        self.resync_soon()

    def resync_soon(self) -> None:
        """Resync now rather than at the next period (this replica just became the leader)."""
        self._resync_now.set()

    async def _resync_loop(self) -> None:
        while True:
            await self._clock.wait(self._resync_now, self._resync)
            self._resync_now.clear()
            try:
                await self.resync_once()
            except SandpodError as exc:
                log.warning("resync_failed", error=exc.message)

    async def resync_once(self) -> None:
        """Renew leases, queue every object, destroy instances whose object is gone."""
        await self.leases.renew_all()
        # Instances first, objects second: an instance is made only after its object exists,
        # so one missing from a *later* list is a true orphan. The other order destroyed
        # sandboxes created between the two calls.
        instances = set(await self.driver.list())
        items, _ = await self.store.list(SANDBOX, None)
        names = {o.metadata.name for o in items}  # instance ids: names, all namespaces
        for obj in items:
            self.enqueue(obj.metadata.name, obj.metadata.namespace)
        if not self.leases.active():
            return  # a standby replica: the leader sweeps
        kept = self._keep() if self._keep is not None else set()
        for orphan in instances - names - kept:
            log.warning("orphan_instance_destroyed", sandbox=orphan)
            await self.driver.destroy(orphan)
        await self._stale_holders.sweep(SANDBOX)  # volumes held by Sandboxes that are gone

    async def _handle(self, name: str) -> float | None:
        """One pass over ``namespace/name`` for the work queue; seconds until the next (None:
        when something changes)."""
        log.debug("reconcile_start", sandbox=name)
        namespace, _, short = name.partition("/")
        try:
            outcome = await self.reconcile(short, namespace)
        except Exception:
            log.exception("reconcile_crashed", sandbox=name)
            outcome = Outcome.RETRY
        self.reconciled += 1
        log.debug("reconcile_done", sandbox=name, outcome=outcome.value)
        if outcome is not Outcome.RETRY:
            return None
        fail = self._failures.setdefault(name, Failures())
        return max(fail.next_try - self._clock.now(), RETRY_DELAY)

    # -- one step ------------------------------------------------------------------------------

    async def reconcile(self, name: str, namespace: str = "default") -> Outcome:
        key = f"{SANDBOX}.{namespace}.{name}"
        if not await self.leases.acquire(key):
            return Outcome.SKIPPED
        try:
            obj = await self.store.get(SANDBOX, namespace, name)
        except ResourceNotFound:
            if await self.driver.inspect(name) is not None:
                await self.driver.destroy(name)
            await self.leases.release(key)
            return Outcome.DONE
        view = SandboxView.of(obj)
        try:
            return await self._steps.step(view, key)
        except ResourceConflict:
            return Outcome.RETRY  # someone changed it meanwhile: read again


def _key(namespace: str, name: str) -> str:
    """The work-queue key of a Sandbox (timers and failure counts use it too)."""
    return f"{namespace}/{name}"
