"""One pass over one Sandbox: the lifecycle state machine's steps. No queue, no watch.

:class:`~sandpod_lifecycle.reconciler.Reconciler` takes a Sandbox's name off its work queue,
holds its lease, reads it, and hands it here; :meth:`Steps.step` takes the one step its state
calls for:

    delete requested           -> destroy instance, delete object           (event: deleted)
    now >= shutdownTime        -> destroy, Expired/LifetimeExceeded, delete  (event: expired)
    idle >= idleTimeoutSeconds -> destroy, Expired/IdleTimeout, delete       (event: idle_expired)
    no instance                -> create it, wait for execd, Ready/Running   (event: ready)
    effective policy changed   -> driver.apply_network, status.network      (event: network.updated)
    operatingMode differs      -> pause / resume                             (event: paused/resumed)
    generation not observed    -> push spec.env to execd (sys.configure), observe it
                                  (``bind_settle`` seconds after a claim's bind, not before)

Idle time is measured by asking the sandbox's execd (``sys.activity``) when the idle deadline
comes, so a long agent think-time within the limit never kills anything; a claim's bind
(``sandpod.dev/bound-at``) counts as activity; a paused sandbox is never idle-checked (only
Running ones are), and resuming counts as activity. Failures to create are retried with backoff
(:mod:`sandpod_lifecycle.lifetime`) and, after ``max_failures``, the Sandbox is ``Failed`` with
the reason. A runtime that says *why* an instance does not serve (``InstanceUnhealthy``, e.g. a
Pod that is Unschedulable or OOMKilled) is believed: terminal -> destroy, ``Failed`` with that
reason at once; transient -> keep the instance, ``Ready=False`` with the reason, look again
shortly (no backoff count, no re-create: the runtime applies its own start deadline).

Every time rule reads the injected :class:`~sandpod_service.clock.Clock`; a step that wants to
look again later asks ``wake_at`` (wall time), which the reconciler turns into a queue timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
from collections.abc import Awaitable, Callable, Mapping

import structlog

from sandpod_contract.errors import ResourceNotFound, SandpodError
from sandpod_contract.network import Rule
from sandpod_contract.resources import (
    Condition,
    ConditionReason,
    ConditionType,
    IdlePolicy,
    NetworkStatus,
    OperatingMode,
    Phase,
    SandboxTemplateSpec,
)
from sandpod_contract.subjects import Subjects
from sandpod_contract.times import to_rfc3339
from sandpod_lifecycle.driver import Driver, Instance, Owner, RenewsCredentials
from sandpod_lifecycle.egress import announce_applied, apply_egress
from sandpod_lifecycle.events import Events
from sandpod_lifecycle.hibernation import FILES_ONLY, Hibernator
from sandpod_lifecycle.lifetime import (
    Failures,
    bound_at,
    expires_at,
    idle_after,
    lifetime_over,
)
from sandpod_lifecycle.network.secretstore import placeholder_env
from sandpod_lifecycle.objects import SANDBOX, same_status, transition, with_condition
from sandpod_lifecycle.runtime.base import InstanceUnhealthy, RuntimeFailure
from sandpod_lifecycle.volumes import Volumes
from sandpod_service.clock import Clock
from sandpod_service.leases import LeaseKeeper
from sandpod_store import Resource, SandboxView, Store

__all__ = ["Configure", "Outcome", "Probe", "Steps", "Templates"]

# While execd has not answered yet, how often the instance is checked for having ended.
PROBE_ALIVE_EVERY = 1.0
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


@dataclasses.dataclass(frozen=True, slots=True)
class StepConfig:
    """What the steps need besides the object: the seams, the limits, the clock."""

    store: Store
    driver: Driver
    leases: LeaseKeeper
    events: Events
    subjects: Subjects
    templates: Templates
    ready_probe: Callable[[str, float], Awaitable[bool]]
    idle_probe: Probe
    configure: Configure | None
    max_failures: int
    ready_timeout: float
    bind_settle: float
    clock: Clock
    wake_at: Callable[[str, float], None]  # queue key, wall time: look again then
    forget: Callable[[str], None]  # queue key: the object is gone, drop its timer
    always_allowed: tuple[Rule, ...] = ()  # the platform's rules in every effective policy
    hibernator: Hibernator | None = None  # idlePolicy Hibernate (None: this runtime cannot)


class Steps:
    def __init__(self, config: StepConfig, failures: dict[str, Failures]) -> None:
        c = config
        self.store, self.driver, self.leases, self.events = c.store, c.driver, c.leases, c.events
        self.subjects = c.subjects
        self._templates = c.templates
        self._ready_probe = c.ready_probe
        self._idle_probe = c.idle_probe
        self._configure = c.configure
        self._max_failures = c.max_failures
        self._ready_timeout = c.ready_timeout
        self._bind_settle = c.bind_settle
        self._clock = c.clock
        self._wake_at = c.wake_at
        self._forget = c.forget
        self._always_allowed = c.always_allowed
        self._hibernator = c.hibernator
        self._failures = failures

    async def step(self, view: SandboxView, key: str) -> Outcome:
        """Take the one step ``view``'s state calls for (``key``: its lease)."""
        return await self._step(view, key)

    async def _step(self, view: SandboxView, key: str) -> Outcome:
        if view.deleting:
            return await self._finish(
                view, key, "deleted", ConditionReason.DELETED, "deleted on request"
            )
        if lifetime_over(view, self._clock.now()):
            why = f"shutdownTime {view.spec.shutdown_time} passed"
            return await self._finish(view, key, "expired", ConditionReason.LIFETIME_EXCEEDED, why)
        if view.status.phase in (Phase.FAILED, Phase.HIBERNATED):
            # Failed: given up, kept for people to read until deleted or expired; Hibernated:
            # no instance until a wake sets it Pending
            return Outcome.DONE
        if view.status.phase is Phase.HIBERNATING:  # a pass (or a lifecycle) died half-way
            return await self._hibernate(view, key)
        return await self._live(view, key)

    async def _live(self, view: SandboxView, key: str) -> Outcome:
        """A sandbox that should have an instance: make it, fail it, or keep it."""
        instance = await self.driver.inspect(view.name)
        if instance is not None and instance.terminal:
            reason = instance.reason or ConditionReason.INSTANCE_LOST
            return await self._fail(view, reason, instance.detail)
        if instance is None or view.status.phase is Phase.PENDING:
            # Pending with an instance: an earlier pass created it but lost the race to record
            # it (a status conflict); ensure() adopts it and this pass finishes the job.
            return await self._create(view, key)
        return await self._steady(view, key, instance)

    async def _steady(self, view: SandboxView, key: str, instance: Instance) -> Outcome:
        """A sandbox whose instance runs: upkeep (credentials, idle), pause/resume, spec."""
        outcome, view = await self._maintain(view, key)
        if outcome is not None:
            return outcome
        applied = await self._egress(view)
        if applied is None:
            return Outcome.RETRY
        view = applied
        want_paused = view.spec.operating_mode is OperatingMode.PAUSED
        how: ConditionReason | None = None
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
                Condition(ConditionType.PAUSED, "True", reason, PAUSE_MESSAGES.get(reason, ""))
                if want_paused
                else Condition(ConditionType.PAUSED, "False", ConditionReason.RESUMED)
            )
            await self._set(view, phase, "paused" if want_paused else "resumed", cond)
        elif view.status.observed_generation != view.obj.metadata.generation and not (
            await self._observe_generation(view)
        ):
            return Outcome.RETRY
        elif instance.address and instance.address != view.status.endpoint.get("address"):
            await self._set(view, phase, None, None, address=instance.address)  # a new Pod IP
        end = expires_at(view)
        if end is not None:
            self._wake_at(view.key, end)
        return Outcome.DONE

    async def _egress(self, view: SandboxView) -> SandboxView | None:
        """The effective egress policy applied and recorded (``status.network``); None: the
        runtime failed to apply it (retry the pass). A template that is gone leaves the policy
        as it was (logged): the sandbox keeps running under what was applied."""
        try:
            template = await self._templates(view.namespace, view.spec.template_ref)
        except SandpodError as exc:
            log.warning("network_template_unavailable", sandbox=view.name, error=str(exc))
            return view
        try:
            network = await apply_egress(
                view,
                template,
                self.driver,
                self.events,
                always_allowed=self._always_allowed,
                announce=False,
            )
        except RuntimeFailure as exc:
            log.warning("network_apply_failed", sandbox=view.name, error=exc.message)
            return None
        if network is None:
            return view
        status = dataclasses.replace(view.status, network=network)
        updated = SandboxView.of(await self.store.update_status(view.with_status(status)))
        before = view.status.network
        if before is None or (before.policy, before.source) != (network.policy, network.source):
            await announce_applied(self.events, view, network)
        return updated

    async def _observe_generation(self, view: SandboxView) -> bool:
        """A spec change: env (a claim's) reaches the running sandbox's new commands, with the
        placeholders of the secrets its enforced policy injects (one added at runtime gets its
        variable too). False: its execd did not take it (retry)."""
        settled = (bound_at(view) or 0.0) + self._bind_settle
        if self._clock.now() < settled:
            # Just bound by a claim: the pool service has given execd the claim's env already;
            # this pass (the same env again, observedGeneration) waits until the claimant's
            # first commands had the machine (bench/claim_latency.py).
            self._wake_at(view.key, settled)
            return True
        env = {e.name: e.value for e in view.spec.env}
        network = view.status.network
        if network is not None and network.enforced and network.policy.inject:
            env = {**placeholder_env(network.policy), **env}
        generation = view.obj.metadata.generation
        if self._configure is not None and not await self._configure(view.name, env, generation):
            return False
        await self._set(view, view.status.phase, None, None)
        return True

    async def _create(self, view: SandboxView, key: str) -> Outcome:
        fail = self._failures.setdefault(view.key, Failures())
        if self._clock.now() < fail.next_try:
            return Outcome.RETRY
        try:
            template = await self._templates(view.namespace, view.spec.template_ref)
            started = view.status.phase in (Phase.RUNNING, Phase.PAUSED)
            owner = Owner(view.namespace, view.obj.metadata.uid, started=started)
            if view.spec.volumes:  # the API claimed them (a no-op again); a Sandbox written to
                # the store directly (kubectl, a pool) is held to the same rules here
                volumes = Volumes(self.store, None, self.events)
                await volumes.claim(view.namespace, view.name, view.spec.volumes)
            instance = await self.driver.ensure(view.name, view.spec, template, owner)

            async def ensure_again() -> None:
                await self.driver.ensure(view.name, view.spec, template, owner)

            if not await self._probe_while_alive(view.name, ensure_again):
                raise TimeoutError(f"execd did not answer within {self._ready_timeout:g}s")
            # Ready only with its egress policy applied (never a window of the wrong one); a
            # re-created instance gets it too, whatever status.network says of the last one.
            network = await apply_egress(
                view,
                template,
                self.driver,
                self.events,
                fresh=True,
                always_allowed=self._always_allowed,
            )
        except InstanceUnhealthy as exc:
            return await self._unhealthy(view, exc, fail)
        except (SandpodError, RuntimeFailure, OSError, TimeoutError) as exc:
            return await self._create_failed(view, key, fail, exc)
        self._failures.pop(view.key, None)
        isolated = self._isolation(instance.protections)
        ready = Condition(ConditionType.READY, "True", ConditionReason.EXECD_READY, "execd answers")
        updated = await self._set(
            view,
            Phase.RUNNING,
            "ready",
            ready,
            extra=(isolated,),
            network=network,
            address=instance.address,
        )
        if view.spec.operating_mode is OperatingMode.PAUSED:
            return await self._step(SandboxView.of(updated), "")
        return Outcome.DONE

    async def _probe_while_alive(
        self, name: str, ensure_again: Callable[[], Awaitable[None]]
    ) -> bool:
        """execd's first answer, raced against the instance ending: a container that starts and
        exits at once (a real kubelet reports it Ready for that moment) is diagnosed by the
        driver's ``ensure`` (InstanceUnhealthy) within a second, not after the ready timeout."""
        probe = asyncio.ensure_future(self._ready_probe(name, self._ready_timeout))
        try:
            while True:
                done, _ = await asyncio.wait({probe}, timeout=PROBE_ALIVE_EVERY)
                if done:
                    return probe.result()
                if await self.driver.inspect(name) is None:
                    await ensure_again()  # raises for an instance that ended
        finally:
            if not probe.done():
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe

    async def _fail(self, view: SandboxView, reason: ConditionReason, message: str) -> Outcome:
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
        self, view: SandboxView, key: str, fail: Failures, exc: Exception
    ) -> Outcome:
        """A create that failed without a reason from the runtime: backoff, then give up."""
        if key and not self.leases.holds(key):
            # Lost the lease while waiting (a leader that stepped down): the new holder
            # may have adopted this instance, so it is not ours to destroy or count.
            log.warning("instance_create_abandoned", sandbox=view.name, error=str(exc))
            return Outcome.SKIPPED
        fail.failed(self._clock.now())
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
        self, view: SandboxView, exc: InstanceUnhealthy, fail: Failures
    ) -> Outcome:
        if exc.terminal:
            return await self._fail(view, exc.reason, exc.message)
        fail.next_try = self._clock.now() + UNHEALTHY_RECHECK  # no count: the runtime's deadline
        await self._waiting(view, exc.reason, exc.message)
        return Outcome.RETRY

    async def _waiting(self, view: SandboxView, reason: ConditionReason, message: str) -> None:
        """``Ready=False`` with a transient reason; written only when it changed (no churn)."""
        ready = view.condition(ConditionType.READY)
        if (
            view.status.phase is Phase.PENDING
            and ready is not None
            and (ready.status, ready.reason, ready.message) == ("False", reason, message)
        ):
            return
        log.info("instance_waiting", sandbox=view.name, reason=reason, message=message)
        waiting = Condition(ConditionType.READY, "False", reason, message)
        await self._set(view, Phase.PENDING, None, waiting)

    def _isolation(self, own: Mapping[str, str] | None = None) -> Condition:
        protections = dict(own) if own is not None else self.driver.protections()
        degraded = {p: s for p, s in protections.items() if s != "active"}
        if not degraded:
            full = ", ".join(sorted(protections))
            return Condition(ConditionType.ISOLATED, "True", ConditionReason.FULL_ISOLATION, full)
        reason = (
            ConditionReason.NO_ISOLATION
            if len(degraded) == len(protections)
            else ConditionReason.DEGRADED
        )
        text = "; ".join(f"{p}: {s}" for p, s in sorted(degraded.items()))
        return Condition(ConditionType.ISOLATED, "False", reason, text)

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
        not_before = idle_after(view, limit, self._clock.now())
        if not_before is not None:
            self._wake_at(view.key, not_before + 0.05)
            return None, view
        idle = await self._idle_probe(view.name)
        if idle is None:
            return None, view  # execd unreachable: the instance check handles it next pass
        now = self._clock.now()
        bound = bound_at(view)
        if bound is not None:  # a claim's bind is activity (the pool does not tell execd)
            idle = min(idle, max(now - bound, 0.0))
        if idle >= limit:
            why = f"no activity for {idle:.0f}s (limit {limit}s)"
            if view.spec.idle_policy is IdlePolicy.HIBERNATE:
                return await self._hibernate(view, key), view
            reason = ConditionReason.IDLE_TIMEOUT
            return await self._finish(view, key, "idle_expired", reason, why), view
        last = now - idle
        stamp = to_rfc3339(last)
        if view.status.last_activity_time != stamp:
            status = dataclasses.replace(view.status, last_activity_time=stamp)
            view = SandboxView.of(await self.store.update_status(view.with_status(status)))
        self._wake_at(view.key, last + limit + 0.05)
        return None, view

    async def _hibernate(self, view: SandboxView, key: str) -> Outcome:
        """Idle with ``idlePolicy: Hibernate``: files into a snapshot, instance gone (see
        ``hibernation.py``); a runtime that cannot keeps the sandbox running and says so."""
        if self._hibernator is None:
            cond = Condition(
                ConditionType.HIBERNATED,
                "False",
                ConditionReason.HIBERNATE_UNSUPPORTED,
                "this runtime cannot hibernate (local as root and Pods can): it keeps running",
            )
            await self._set(view, view.status.phase, None, cond)
            return Outcome.DONE
        busy = Condition(
            ConditionType.HIBERNATED, "False", ConditionReason.FILES_ONLY, "hibernating"
        )
        view = SandboxView.of(await self._set(view, Phase.HIBERNATING, None, busy))
        try:
            name = await self._hibernator.hibernate(view)
        except (SandpodError, RuntimeFailure, OSError) as exc:
            log.warning("hibernate_failed", sandbox=view.name, error=str(exc))
            failed = Condition(
                ConditionType.HIBERNATED,
                "False",
                ConditionReason.FILES_ONLY,
                f"could not hibernate, serving again: {exc}",
            )
            await self._set(view, Phase.PENDING, None, failed)  # the create step adopts it
            return Outcome.RETRY
        done = Condition(
            ConditionType.HIBERNATED,
            "True",
            ConditionReason.FILES_ONLY,
            FILES_ONLY.format(name=name),
        )
        await self._set(view, Phase.HIBERNATED, "hibernated", done)
        return Outcome.DONE

    async def _finish(
        self, view: SandboxView, key: str, event: str, reason: ConditionReason, msg: str
    ) -> Outcome:
        await self.driver.destroy(view.name)
        if self._hibernator is not None:
            await self._hibernator.forget(view)
        if reason is not ConditionReason.DELETED:
            expired = Condition(ConditionType.EXPIRED, "True", reason, msg)
            await self._set(view, Phase.TERMINATED, None, expired)
        if view.spec.volumes:  # its instance is gone: others may mount them now (before the
            # object goes, so whoever waits for the object to be gone finds them free)
            names = [v.name for v in view.spec.volumes]
            await Volumes(self.store, None, self.events).release(view.namespace, view.name, names)
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
        self._forget(view.key)
        await self.leases.release(key)
        return Outcome.DONE

    async def _set(
        self,
        view: SandboxView,
        phase: Phase,
        event: str | None,
        cond: Condition | None,
        extra: tuple[Condition, ...] = (),
        *,
        network: NetworkStatus | None = None,
        address: str | None = None,
    ) -> Resource:
        endpoint = {"subjectPrefix": self.subjects.sandbox_prefix(view.name)}
        # Where the gateway reaches the sandbox's ports: the instance's, or the one recorded.
        where = address or view.status.endpoint.get("address")
        if where and phase in (Phase.RUNNING, Phase.PAUSED):
            endpoint["address"] = where
        status = dataclasses.replace(
            view.status,
            network=network or view.status.network,
            phase=phase,
            observed_generation=view.obj.metadata.generation,
            shutdown_time=view.spec.shutdown_time,
            endpoint=endpoint,
        )
        now = self._clock.now()
        for c in (*(() if cond is None else (cond,)), *extra):
            status = with_condition(status, c, now)
        if phase is Phase.RUNNING:
            ready = Condition(ConditionType.READY, "True", ConditionReason.EXECD_READY)
            status = with_condition(status, ready, now)
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
