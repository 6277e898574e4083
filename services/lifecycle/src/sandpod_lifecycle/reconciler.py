"""Drive every Sandbox to its spec: the lifecycle state machine.

Data flow: a store watch (and a periodic resync, and per-object timers for expiry and idle
checks) put object names on a keyed work queue; workers take one name at a time — never the same
name in two workers, so events for one object are handled in order while different objects run
in parallel — acquire the object's lease (multi-replica safety), read it, and take the one step
its state calls for:

    delete requested           -> destroy instance, delete object           (event: deleted)
    now >= shutdownTime        -> destroy, Expired/LifetimeExceeded, delete  (event: expired)
    idle >= idleTimeoutSeconds -> destroy, Expired/IdleTimeout, delete       (event: idle_expired)
    no instance                -> create it, wait for execd, Ready/Running   (event: ready)
    operatingMode differs      -> pause / resume                             (event: paused/resumed)
    generation not observed    -> push spec.env to execd (sys.configure), observe it
                                  (``bind_settle`` seconds after a claim's bind, not before)

Idle time is measured by asking the sandbox's execd (``sys.activity``) when the idle deadline
comes, so a long agent think-time within the limit never kills anything; a claim's bind
(``sandpod.dev/bound-at``) counts as activity; a paused sandbox is never idle-checked (only
Running ones are), and resuming counts as activity. Failures to create are retried with backoff
and, after ``max_failures``, the Sandbox is ``Failed`` with the reason. A runtime that says
*why* an instance does not serve (``InstanceUnhealthy``, e.g. a Pod that is Unschedulable or
OOMKilled) is believed: terminal -> destroy, ``Failed`` with that reason at once; transient ->
keep the instance, ``Ready=False`` with the reason, look again shortly (no backoff count, no
re-create: the runtime applies its own start deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import enum
import time
from collections.abc import Awaitable, Callable, Mapping

import structlog

from sandpod_contract.errors import ResourceConflict, ResourceNotFound, SandpodError
from sandpod_contract.pooling import BOUND_AT_ANNOTATION
from sandpod_contract.resources import (
    Condition,
    ConditionReason,
    ConditionType,
    OperatingMode,
    Phase,
    SandboxTemplateSpec,
)
from sandpod_contract.subjects import Subjects
from sandpod_lifecycle.driver import Driver, Instance, Owner, RenewsCredentials, ReportsLoss
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.objects import (
    SANDBOX,
    SandboxView,
    iso,
    parse_time,
    same_status,
    transition,
    with_condition,
)
from sandpod_lifecycle.runtime.base import InstanceUnhealthy, RuntimeFailure
from sandpod_service.leases import LeaseKeeper
from sandpod_store import EventType, Resource, Store

__all__ = ["Outcome", "Reconciler"]

log = structlog.get_logger("sandpod.lifecycle.reconciler")

UNHEALTHY_RECHECK = 2.0  # seconds between looks at an instance that waits on a transient problem
PAUSE_MESSAGES: dict[str, str] = {
    ConditionReason.CGROUP_FROZEN: "execd froze its commands' cgroup (invisible to them)",
    ConditionReason.SIGNAL_STOPPED: "execd stopped every process it started with SIGSTOP; "
    "the processes can observe it (SIGCHLD, waitpid WUNTRACED, /proc state T)",
}

Probe = Callable[[str], Awaitable[float | None]]  # sandbox id -> seconds idle (None: unreachable)
Templates = Callable[[str, str | None], Awaitable[SandboxTemplateSpec]]
# sandbox id, env, generation -> whether the sandbox's execd applied it (sys.configure)
Configure = Callable[[str, dict[str, str], int], Awaitable[bool]]


class Outcome(enum.Enum):
    DONE = "done"
    RETRY = "retry"
    SKIPPED = "skipped"  # another replica holds the lease


@dataclasses.dataclass
class _Failures:
    count: int = 0
    next_try: float = 0.0


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
    ) -> None:
        self.store = store
        self.driver = driver
        self.leases = leases
        self.events = events
        self.subjects = subjects or Subjects()
        self._templates = templates
        self._ready_probe = ready_probe
        self._idle_probe = idle_probe
        self._configure = configure
        self._workers = workers
        self._max_failures = max_failures
        self._resync = resync
        self._ready_timeout = ready_timeout
        self._bind_settle = bind_settle
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, _Failures] = {}
        self._resync_now = asyncio.Event()
        self.reconciled = 0  # for tests and metrics
        if isinstance(driver, ReportsLoss):
            driver.on_lost(self._instance_lost)

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, name: str, namespace: str = "default") -> None:
        """Reconcile Sandbox ``namespace/name`` soon (once, however often it is asked)."""
        self._enqueue(_key(namespace, name))

    def _enqueue(self, name: str) -> None:
        if name in self._active:
            self._dirty.add(name)  # handled again right after the current pass
        elif name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)

    def _wake_at(self, name: str, when: float) -> None:
        """Reconcile ``name`` again at monotonic-equivalent wall time ``when`` (earliest wins)."""
        loop = asyncio.get_running_loop()
        delay = max(when - time.time(), 0.0)
        old = self._timers.get(name)
        if old is not None and old.when() <= loop.time() + delay:
            return
        if old is not None:
            old.cancel()
        self._timers[name] = loop.call_later(delay, self._fire, name)

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        self._enqueue(name)

    async def run(self) -> None:
        """Watch, resync and work until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(), name="watch")
            tg.create_task(self._resync_loop(), name="resync")
            for i in range(self._workers):
                tg.create_task(self._worker(), name=f"worker-{i}")

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
                await asyncio.sleep(1.0)

    def _settles(self, obj: Resource | None) -> float | None:
        """When a just-bound running sandbox's pass is due (see ``_observe_generation``), if
        the change is only that bind; None: reconcile it now."""
        bound = obj.metadata.annotations.get(BOUND_AT_ANNOTATION) if obj is not None else None
        if obj is None or not bound:
            return None
        try:
            view, settles = SandboxView.of(obj), float(bound) + self._bind_settle
        except (SandpodError, ValueError):
            return None
        quiet = (
            not view.deleting
            and view.status.phase is Phase.RUNNING
            and view.spec.operating_mode is OperatingMode.RUNNING
            and view.status.observed_generation != obj.metadata.generation
        )
        return settles if quiet and time.time() < settles else None

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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resync_now.wait(), self._resync)
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
        for orphan in instances - names:
            log.warning("orphan_instance_destroyed", sandbox=orphan)
            await self.driver.destroy(orphan)

    async def _worker(self) -> None:
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            self._active.add(name)
            log.debug("reconcile_start", sandbox=name)
            namespace, _, short = name.partition("/")
            try:
                outcome = await self.reconcile(short, namespace)
            except Exception:
                log.exception("reconcile_crashed", sandbox=name)
                outcome = Outcome.RETRY
            finally:
                self._active.discard(name)
            self.reconciled += 1
            log.debug("reconcile_done", sandbox=name, outcome=outcome.value)
            if outcome is Outcome.RETRY:
                fail = self._failures.setdefault(name, _Failures())
                self._wake_at(name, max(fail.next_try, time.time() + 0.5))
            if name in self._dirty:
                self._dirty.discard(name)
                self._enqueue(name)

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
            return await self._step(view, key)
        except ResourceConflict:
            return Outcome.RETRY  # someone changed it meanwhile: read again

    async def _step(self, view: SandboxView, key: str) -> Outcome:
        if view.deleting:
            return await self._finish(view, key, "deleted", "Deleted", "deleted on request")
        t = time.time()
        shutdown = view.spec.shutdown_time
        if shutdown and parse_time(shutdown).timestamp() <= t:
            return await self._finish(
                view, key, "expired", "LifetimeExceeded", f"shutdownTime {shutdown} passed"
            )
        if view.status.phase is Phase.FAILED:
            return Outcome.DONE  # given up: kept for people to read until deleted or expired
        instance = await self.driver.inspect(view.name)
        if instance is not None and instance.terminal:
            return await self._fail(view, instance.reason, instance.detail)
        if instance is None or view.status.phase is Phase.PENDING:
            # Pending with an instance: an earlier pass created it but lost the race to record
            # it (a status conflict); ensure() adopts it and this pass finishes the job.
            return await self._create(view, key)
        return await self._steady(view, key, instance)

    async def _steady(self, view: SandboxView, key: str, instance: Instance) -> Outcome:
        """A sandbox whose instance runs: upkeep (credentials, idle), pause/resume, spec."""
        shutdown = view.spec.shutdown_time
        outcome, view = await self._maintain(view, key)
        if outcome is not None:
            return outcome
        want_paused = view.spec.operating_mode is OperatingMode.PAUSED
        how: str | None = None
        if want_paused and not instance.paused:
            how = await self.driver.pause(view.name)
        elif not want_paused and instance.paused:
            await self.driver.resume(view.name)
        # The phase follows what the instance is, so a pass that froze the jail but lost the
        # race to record it (a status conflict) is corrected by the next one.
        phase = Phase.PAUSED if want_paused else Phase.RUNNING
        if phase is not view.status.phase:
            reason = how or ConditionReason.REQUESTED
            cond = (
                Condition("Paused", "True", reason, PAUSE_MESSAGES.get(reason, ""))
                if want_paused
                else Condition("Paused", "False", "Resumed")
            )
            await self._set(view, phase, "paused" if want_paused else "resumed", cond)
        elif view.status.observed_generation != view.obj.metadata.generation and not (
            await self._observe_generation(view)
        ):
            return Outcome.RETRY
        if shutdown:
            self._wake_at(view.key, parse_time(shutdown).timestamp())
        return Outcome.DONE

    async def _observe_generation(self, view: SandboxView) -> bool:
        """A spec change: env (a claim's) reaches the running sandbox's new commands. False:
        its execd did not take it (retry)."""
        settled = (_bound_at(view) or 0.0) + self._bind_settle
        if time.time() < settled:
            # Just bound by a claim: the pool service has given execd the claim's env already;
            # this pass (the same env again, observedGeneration) waits until the claimant's
            # first commands had the machine (bench/claim_latency.py).
            self._wake_at(view.key, settled)
            return True
        env = {e.name: e.value for e in view.spec.env}
        generation = view.obj.metadata.generation
        if self._configure is not None and not await self._configure(view.name, env, generation):
            return False
        await self._set(view, view.status.phase, None, None)
        return True

    async def _create(self, view: SandboxView, key: str) -> Outcome:
        fail = self._failures.setdefault(view.key, _Failures())
        if time.time() < fail.next_try:
            return Outcome.RETRY
        try:
            template = await self._templates(view.namespace, view.spec.template_ref)
            started = view.status.phase in (Phase.RUNNING, Phase.PAUSED)
            owner = Owner(view.namespace, view.obj.metadata.uid, started=started)
            instance = await self.driver.ensure(view.name, view.spec, template, owner)
            if not await self._ready_probe(view.name, self._ready_timeout):
                raise TimeoutError(f"execd did not answer within {self._ready_timeout:g}s")
        except InstanceUnhealthy as exc:
            return await self._unhealthy(view, exc, fail)
        except (SandpodError, RuntimeFailure, OSError, TimeoutError) as exc:
            return await self._create_failed(view, key, fail, exc)
        self._failures.pop(view.key, None)
        isolated = self._isolation(instance.protections)
        ready = Condition(ConditionType.READY, "True", ConditionReason.EXECD_READY, "execd answers")
        updated = await self._set(view, Phase.RUNNING, "ready", ready, extra=(isolated,))
        if view.spec.operating_mode is OperatingMode.PAUSED:
            return await self._step(SandboxView.of(updated), "")
        return Outcome.DONE

    async def _fail(self, view: SandboxView, reason: str, message: str) -> Outcome:
        """Give up: destroy the instance, ``Failed`` with the runtime's reason (kept until the
        Sandbox is deleted or its lifetime ends)."""
        log.warning("instance_failed", sandbox=view.name, reason=reason, error=message)
        # Recorded first: if the write conflicts, the next pass finds the instance (and its
        # reason) again -- destroying first would let that pass make a fresh one.
        failed = Condition(ConditionType.FAILED, "True", reason, message)
        ready = Condition(ConditionType.READY, "False", reason, message)
        await self._set(view, Phase.FAILED, "failed", failed, extra=(ready,))
        await self.driver.destroy(view.name)
        self._failures.pop(view.key, None)
        return Outcome.DONE

    async def _create_failed(
        self, view: SandboxView, key: str, fail: _Failures, exc: Exception
    ) -> Outcome:
        """A create that failed without a reason from the runtime: backoff, then give up."""
        if key and not self.leases.holds(key):
            # Lost the lease while waiting (a leader that stepped down): the new holder
            # may have adopted this instance, so it is not ours to destroy or count.
            log.warning("instance_create_abandoned", sandbox=view.name, error=str(exc))
            return Outcome.SKIPPED
        fail.count += 1
        fail.next_try = time.time() + min(2.0**fail.count, 60.0)
        message = str(exc)
        log.warning("instance_create_failed", sandbox=view.name, attempt=fail.count, error=message)
        await self.driver.destroy(view.name)
        if fail.count >= self._max_failures:
            cond = Condition(ConditionType.FAILED, "True", ConditionReason.INSTANCE_FAILED, message)
            await self._set(view, Phase.FAILED, "failed", cond)
            return Outcome.DONE
        await self._set(
            view,
            Phase.PENDING,
            None,
            Condition(ConditionType.READY, "False", ConditionReason.INSTANCE_STARTING, message),
        )
        return Outcome.RETRY

    async def _unhealthy(
        self, view: SandboxView, exc: InstanceUnhealthy, fail: _Failures
    ) -> Outcome:
        if exc.terminal:
            return await self._fail(view, exc.reason, exc.message)
        fail.next_try = time.time() + UNHEALTHY_RECHECK  # no count: the runtime's deadline
        await self._waiting(view, exc.reason, exc.message)
        return Outcome.RETRY

    async def _waiting(self, view: SandboxView, reason: str, message: str) -> None:
        """``Ready=False`` with a transient reason; written only when it changed (no churn)."""
        ready = next((c for c in view.status.conditions if c.type == "Ready"), None)
        if (
            view.status.phase is Phase.PENDING
            and ready is not None
            and (ready.status, ready.reason, ready.message) == ("False", reason, message)
        ):
            return
        log.info("instance_waiting", sandbox=view.name, reason=reason, message=message)
        await self._set(view, Phase.PENDING, None, Condition("Ready", "False", reason, message))

    def _isolation(self, own: Mapping[str, str] | None = None) -> Condition:
        protections = dict(own) if own is not None else self.driver.protections()
        degraded = {p: s for p, s in protections.items() if s != "active"}
        if not degraded:
            return Condition("Isolated", "True", "FullIsolation", ", ".join(sorted(protections)))
        reason = "NoIsolation" if len(degraded) == len(protections) else "Degraded"
        text = "; ".join(f"{p}: {s}" for p, s in sorted(degraded.items()))
        return Condition("Isolated", "False", reason, text)

    async def _maintain(self, view: SandboxView, key: str) -> tuple[Outcome | None, SandboxView]:
        """A live instance's upkeep: its credentials renewed when due (the driver's call: a
        renew moved ``shutdownTime``, or they aged), its idle timeout checked."""
        if isinstance(self.driver, RenewsCredentials):
            try:
                owner = Owner(view.namespace, view.obj.metadata.uid)
                await self.driver.renew_credentials(view.name, view.spec, owner)
            except RuntimeFailure as exc:
                log.warning("credentials_renew_failed", sandbox=view.name, error=str(exc))
                return Outcome.RETRY, view
        idle_limit = view.spec.idle_timeout_seconds or 0
        if idle_limit > 0 and view.status.phase is Phase.RUNNING:
            return await self._check_idle(view, key, idle_limit)
        return None, view

    async def _check_idle(
        self, view: SandboxView, key: str, limit: int
    ) -> tuple[Outcome | None, SandboxView]:
        """(an outcome if the sandbox expired, the view as it now is).

        The recorded ``lastActivityTime`` is a lower bound of the last activity (activity
        never un-happens): until ``limit`` seconds after it, the sandbox cannot be idle, so
        passes triggered by other changes (a claim's bind) skip asking its execd.
        """
        known = _latest(_bound_at(view), view.status.last_activity_time)
        if known is not None and time.time() < known + limit:
            self._wake_at(view.key, known + limit + 0.05)
            return None, view
        idle = await self._idle_probe(view.name)
        if idle is None:
            return None, view  # execd unreachable: the instance check handles it next pass
        bound = _bound_at(view)
        if bound is not None:  # a claim's bind is activity (the pool does not tell execd)
            idle = min(idle, max(time.time() - bound, 0.0))
        if idle >= limit:
            why = f"no activity for {idle:.0f}s (limit {limit}s)"
            return await self._finish(view, key, "idle_expired", "IdleTimeout", why), view
        last = time.time() - idle
        if view.status.last_activity_time != iso_ts(last):
            view = SandboxView.of(
                await self.store.update_status(
                    view.with_status(
                        dataclasses.replace(view.status, last_activity_time=iso_ts(last))
                    )
                )
            )
        self._wake_at(view.key, last + limit + 0.05)
        return None, view

    async def _finish(
        self, view: SandboxView, key: str, event: str, reason: str, msg: str
    ) -> Outcome:
        await self.driver.destroy(view.name)
        if event != "deleted":
            await self._set(view, Phase.TERMINATED, None, Condition("Expired", "True", reason, msg))
        with contextlib.suppress(ResourceNotFound):
            await self.store.delete(SANDBOX, view.namespace, view.name)
        await self.events.publish(
            name=view.name,
            namespace=view.namespace,
            type_=event,
            phase=str(Phase.TERMINATED),
            reason=reason,
            message=msg,
            generation=view.obj.metadata.generation,
        )
        timer = self._timers.pop(view.key, None)
        if timer is not None:
            timer.cancel()
        await self.leases.release(key)
        return Outcome.DONE

    async def _set(
        self,
        view: SandboxView,
        phase: Phase,
        event: str | None,
        cond: Condition | None,
        extra: tuple[Condition, ...] = (),
    ) -> Resource:
        status = dataclasses.replace(
            view.status,
            phase=phase,
            observed_generation=view.obj.metadata.generation,
            shutdown_time=view.spec.shutdown_time,
            endpoint={"subjectPrefix": self.subjects.sandbox_prefix(view.name)},
        )
        for c in (*(() if cond is None else (cond,)), *extra):
            status = with_condition(status, c)
        if phase is Phase.RUNNING:
            status = with_condition(
                status, Condition(ConditionType.READY, "True", ConditionReason.EXECD_READY)
            )
        if same_status(view.status, status):
            return view.obj  # nothing changed: no write (whose watch event loops back), no event
        updated = await self.store.update_status(view.with_status(status))
        if event is not None and transition(view.status, phase, cond):
            await self.events.publish(
                name=view.name,
                namespace=view.namespace,
                type_=event,
                phase=str(phase),
                reason=cond.reason if cond else "",
                message=cond.message if cond else "",
                generation=view.obj.metadata.generation,
            )
        return updated


def _key(namespace: str, name: str) -> str:
    """The work-queue key of a Sandbox (timers and failure counts use it too)."""
    return f"{namespace}/{name}"


def iso_ts(ts: float) -> str:
    return iso(datetime.datetime.fromtimestamp(ts, datetime.UTC))


def _bound_at(view: SandboxView) -> float | None:
    """When a claim bound this sandbox (the pool's annotation), if it did."""
    raw = view.obj.metadata.annotations.get(BOUND_AT_ANNOTATION)
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _latest(bound: float | None, last_activity: str | None) -> float | None:
    """The latest known moment of activity: a bind, or the recorded lastActivityTime."""
    times = [t for t in (bound,) if t is not None]
    if last_activity:
        with contextlib.suppress(ValueError):
            times.append(parse_time(last_activity).timestamp())
    return max(times) if times else None
