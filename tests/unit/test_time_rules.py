"""The control loops' time rules on a fake clock: lifetime, idle timeout, renew, backoff, claim
recovery and the loop's own timers (sandpod_service.clock.FakeClock; nothing here waits for
real time, so a 60-second backoff or a 15-minute idle timeout is checked at once).

The reconciler and the pool run against the in-memory store and a fake driver; the same rules
run for real in tests/integration/test_lifecycle.py and test_pools.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from test_reconciler import Always  # the one fake lease keeper of the unit tests

from sandpod_contract.messages.sandboxes import Renew
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.pooling import POOL_LABEL
from sandpod_contract.resources import (
    ConditionReason,
    ConditionType,
    Phase,
    SandboxSpec,
    SandboxTemplateSpec,
)
from sandpod_contract.times import from_rfc3339, to_rfc3339
from sandpod_lifecycle.api import LifecycleApi
from sandpod_lifecycle.driver import Instance
from sandpod_lifecycle.lifetime import BACKOFF_CAP, backoff
from sandpod_lifecycle.reconciler import Outcome, Reconciler
from sandpod_lifecycle.runtime.base import CreateFailed, NetworkEnforcement
from sandpod_pool.cache import Mirror
from sandpod_pool.claim_recovery import ClaimRecovery
from sandpod_pool.claims import CLAIM, Claims
from sandpod_pool.members import POOL_KIND, SANDBOX, TEMPLATE
from sandpod_pool.pools import MAX_BACKOFF, PoolReconciler
from sandpod_service.clock import FakeClock
from sandpod_store import MemoryStore, ObjectMeta, Resource, SandboxView


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: the loops run on fakes and a fake clock here."""


class Driver:
    """An instance per sandbox, made at once (or failing, while ``failing``)."""

    name = "fake"

    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}
        self.ensures = 0
        self.failing = False

    def protections(self) -> dict[str, str]:
        return {"jail": "active"}

    async def ensure(
        self, sid: str, spec: SandboxSpec, template: SandboxTemplateSpec, owner: object = None
    ) -> Instance:
        self.ensures += 1
        if self.failing:
            raise CreateFailed(f"no instance for {sid} (attempt {self.ensures})")
        return self.instances.setdefault(sid, Instance(sid, running=True, paused=False, pid=1))

    async def inspect(self, sid: str) -> Instance | None:
        return self.instances.get(sid)

    async def pause(self, sid: str) -> None: ...

    async def resume(self, sid: str) -> None: ...

    async def destroy(self, sid: str) -> None:
        self.instances.pop(sid, None)

    async def apply_network(self, sid: str, policy: NetworkPolicy) -> NetworkEnforcement:
        return NetworkEnforcement(False, "fake runtime: nothing enforced")

    async def list(self) -> list[str]:
        return sorted(self.instances)


class Events:
    """The events published, and a way to wait for one (no polling)."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self._news = asyncio.Condition()

    async def publish(self, **kw: Any) -> None:
        self.published.append(kw)
        async with self._news:
            self._news.notify_all()

    async def publish_network(self, **kw: Any) -> None:
        """Egress applied: not a lifecycle transition these tests count."""

    def types(self) -> list[str]:
        return [str(e["type_"]) for e in self.published]

    async def wait_for(self, type_: str) -> None:
        async with self._news:
            await self._news.wait_for(lambda: type_ in self.types())


class Rig:
    """A lifecycle reconciler on a fake clock; ``idle`` says how long the sandbox has been
    idle (as its execd's ``sys.activity`` would), from the last activity the test set."""

    def __init__(self, max_failures: int = 5) -> None:
        self.clock = FakeClock()
        self.store = MemoryStore(now=self.clock.now)
        self.driver = Driver()
        self.events = Events()
        self.last_activity = self.clock.now()
        self.rec = Reconciler(
            store=self.store,
            driver=self.driver,
            leases=Always(),
            events=self.events,  # type: ignore[arg-type]
            templates=self._template,
            ready_probe=self._ready,
            idle_probe=self._idle,
            max_failures=max_failures,
            clock=self.clock,
        )
        self.api = LifecycleApi(self.store, self.events, clock=self.clock)  # type: ignore[arg-type]

    async def _template(self, ns: str, name: str | None) -> SandboxTemplateSpec:
        return SandboxTemplateSpec()

    async def _ready(self, sid: str, timeout: float) -> bool:
        return True

    async def _idle(self, sid: str) -> float | None:
        return self.clock.now() - self.last_activity

    async def sandbox(self, **spec: Any) -> None:
        obj = Resource("sandpod.dev/v1alpha1", "Sandbox", ObjectMeta(name="s1"), spec)
        await self.store.create(obj)

    async def view(self) -> SandboxView | None:
        items, _ = await self.store.list("Sandbox", None)
        return SandboxView.of(items[0]) if items else None

    def at(self, seconds: float) -> None:
        """Move the clock to ``seconds`` after the rig was made."""
        self.clock.advance(seconds - self.clock.monotonic())


def _in(clock: FakeClock, seconds: float) -> str:
    return to_rfc3339(clock.now() + seconds)


async def test_a_sandbox_lives_until_its_shutdown_time_and_not_a_second_less() -> None:
    """TTL: the pass one second before shutdownTime keeps it; the pass at shutdownTime
    destroys it, marks it Expired/LifetimeExceeded and deletes the object."""
    rig = Rig()
    await rig.sandbox(shutdownTime=_in(rig.clock, 30))
    assert await rig.rec.reconcile("s1") is Outcome.DONE
    assert "s1" in rig.driver.instances
    rig.at(29)
    await rig.rec.reconcile("s1")
    assert "s1" in rig.driver.instances and await rig.view() is not None
    rig.at(30)
    assert await rig.rec.reconcile("s1") is Outcome.DONE
    assert rig.driver.instances == {} and await rig.view() is None
    expired = rig.events.published[-1]
    assert (expired["type_"], expired["reason"]) == ("expired", ConditionReason.LIFETIME_EXCEEDED)


async def test_the_running_loop_expires_a_sandbox_on_its_timer_with_no_real_wait() -> None:
    """The loop itself (watch, work queue, timers) on the fake clock: a sandbox made Running
    is expired by the timer its pass set for shutdownTime once the clock gets there, and
    not before (the timers the loop waits on are the clock's)."""
    rig = Rig()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(rig.rec.run())
        await rig.sandbox(shutdownTime=_in(rig.clock, 3600))
        await asyncio.wait_for(rig.events.wait_for("ready"), 10)
        # The pass after Running sets a timer for shutdownTime: the loop now waits on it.
        await asyncio.wait_for(rig.clock.scheduled(3600.0), 10)
        rig.at(3599)
        assert "expired" not in rig.events.types()
        rig.at(3600)
        await asyncio.wait_for(rig.events.wait_for("expired"), 10)
        task.cancel()
    assert rig.driver.instances == {}


async def test_an_idle_sandbox_expires_at_its_idle_timeout_and_activity_postpones_it() -> None:
    """Idle: with idleTimeoutSeconds=60, a pass at 30 s idle keeps it; activity at 50 s moves
    the deadline to 110 s (a pass at 60 s keeps it); at 110 s it is Expired/IdleTimeout."""
    rig = Rig()
    await rig.sandbox(shutdownTime=_in(rig.clock, 3600), idleTimeoutSeconds=60)
    await rig.rec.reconcile("s1")
    rig.at(30)
    await rig.rec.reconcile("s1")
    view = await rig.view()
    assert view is not None and view.status.phase is Phase.RUNNING
    rig.last_activity = rig.clock.now() + 20  # a command at 50 s
    rig.at(60)
    await rig.rec.reconcile("s1")
    assert "s1" in rig.driver.instances
    rig.at(109)
    await rig.rec.reconcile("s1")
    assert "s1" in rig.driver.instances
    rig.at(110)
    await rig.rec.reconcile("s1")
    assert rig.driver.instances == {}
    expired = rig.events.published[-1]
    assert (expired["type_"], expired["reason"]) == ("idle_expired", ConditionReason.IDLE_TIMEOUT)


async def test_a_renewed_sandbox_outlives_its_old_shutdown_time() -> None:
    """Renew: at 20 s of a 30 s lifetime, renew(seconds=60) moves shutdownTime to 80 s; the
    pass at 30 s keeps the sandbox, the pass at 80 s expires it."""
    rig = Rig()
    await rig.sandbox(shutdownTime=_in(rig.clock, 30))
    await rig.rec.reconcile("s1")
    rig.at(20)
    await rig.api.renew(Renew(name="s1", seconds=60))
    view = await rig.view()
    assert view is not None and view.spec.shutdown_time == _in(rig.clock, 60)
    rig.at(30)
    await rig.rec.reconcile("s1")
    assert "s1" in rig.driver.instances
    rig.at(79)
    await rig.rec.reconcile("s1")
    assert "s1" in rig.driver.instances
    rig.at(80)
    await rig.rec.reconcile("s1")
    assert rig.driver.instances == {}


async def _next_try(rig: Rig) -> float:
    """Advance to the moment the reconciler tries to create again; the delay it waited."""
    start, before = rig.clock.monotonic(), rig.driver.ensures
    step = 0.25
    while rig.driver.ensures == before:
        rig.clock.advance(step)
        await rig.rec.reconcile("s1")
        assert rig.clock.monotonic() - start <= 2 * BACKOFF_CAP, "never tried again"
    return rig.clock.monotonic() - start


async def test_failed_creates_back_off_doubling_up_to_the_cap_then_give_up() -> None:
    """Backoff: after the n-th failed create the next try waits 2**n s (2, 4, ... capped at
    60 s), no earlier; after max_failures the Sandbox is Failed/InstanceFailed."""
    rig = Rig(max_failures=9)
    rig.driver.failing = True
    await rig.sandbox(shutdownTime=_in(rig.clock, 36000))
    assert await rig.rec.reconcile("s1") is Outcome.RETRY
    delays = [await _next_try(rig) for _ in range(8)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert [backoff(n) for n in range(1, 9)] == delays
    view = await rig.view()
    assert view is not None and view.status.phase is Phase.FAILED
    failed = view.condition(ConditionType.FAILED)
    assert failed is not None and failed.reason == ConditionReason.INSTANCE_FAILED


# -- the pool ----------------------------------------------------------------------------------


class PoolRig:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = MemoryStore(now=self.clock.now)
        self.pools = Mirror(self.store, POOL_KIND)
        self.templates = Mirror(self.store, TEMPLATE)
        self.sandboxes = Mirror(self.store, SANDBOX, keep=lambda o: True)
        self.claims = Mirror(self.store, CLAIM)
        self.rec = PoolReconciler(
            store=self.store,
            leases=Always(),
            pools=self.pools,
            sandboxes=self.sandboxes,
            templates=self.templates,
            create_rate=100.0,
            member_grace=60.0,
            clock=self.clock,
        )

    async def pool(self, replicas: int) -> None:
        obj = Resource(
            "sandpod.dev/v1alpha1", POOL_KIND, ObjectMeta(name="py"), {"replicas": replicas}
        )
        self.pools.observe(await self.store.create(obj))

    def members(self) -> list[Resource]:
        return [m for m in self.sandboxes.values() if m.metadata.labels.get(POOL_LABEL) == "py"]

    async def fail_all(self) -> None:
        for m in self.members():
            status = {"phase": "Failed", "conditions": []}
            current = await self.store.get(SANDBOX, "default", m.metadata.name)
            updated = dataclasses.replace(current, status=status)
            self.sandboxes.observe(await self.store.update_status(updated))


async def test_a_failing_pool_backs_off_doubling_up_to_the_cap() -> None:
    """Pool backoff: each pass that finds its members failed deletes them and waits 2, 4, 8
    ... up to 60 s before creating again; a pass before that creates nothing."""
    rig = PoolRig()
    await rig.pool(1)
    assert await rig.rec.reconcile("default/py") is None
    delays = []
    for _ in range(7):
        await rig.fail_all()
        delay = await rig.rec.reconcile("default/py")
        assert delay is not None
        delays.append(delay)
        created = rig.rec.created
        rig.clock.advance(delay - 0.5)
        assert await rig.rec.reconcile("default/py") is not None
        assert rig.rec.created == created, "created again before the backoff ended"
        rig.clock.advance(0.5)
        await rig.rec.reconcile("default/py")
        assert rig.rec.created == created + 1
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert MAX_BACKOFF == 60.0


async def test_a_claim_whose_handler_died_is_taken_over_after_recover_after() -> None:
    """Claim takeover: a Pending claim nobody bound (its handler's replica died) is left alone
    while younger than recover_after (the pass says when to look again), then the reconciler
    binds it itself (a cold create, no pool)."""
    rig = PoolRig()
    claims = ClaimRecovery(
        Claims(
            store=rig.store,
            pools=rig.pools,
            sandboxes=rig.sandboxes,
            claims=rig.claims,
            templates=rig.templates,
            configure=_configured,
            recover_after=30.0,
            background=lambda coro, name: coro.close(),
            clock=rig.clock,
        )
    )
    claim = Resource("sandpod.dev/v1alpha1", CLAIM, ObjectMeta(name="c1"), {})
    rig.claims.observe(await rig.store.create(claim))
    rig.clock.advance(10)
    assert await claims.reconcile("default/c1") == 20.0
    assert list(rig.sandboxes.values()) == []
    rig.clock.advance(20)
    assert await claims.reconcile("default/c1") is None
    (sandbox,) = rig.sandboxes.values()
    stored = await rig.store.get(CLAIM, "default", "c1")
    assert stored.status["sandbox"] == sandbox.metadata.name
    lifetime = from_rfc3339(stored.status["shutdownTime"]) - rig.clock.now()
    assert lifetime == SandboxTemplateSpec().default_lifetime_seconds


async def _configured(sid: str, env: dict[str, str], generation: int) -> bool:
    return True


async def test_the_fake_clock_fires_timers_in_order_and_never_waits() -> None:
    """FakeClock: advance() fires due timers in deadline order at their own time, a sleep
    returns once the clock passes it, and wait() gives up at its timeout, fake time only."""
    clock = FakeClock()
    fired: list[tuple[str, float]] = []
    clock.call_later(5, lambda: fired.append(("b", clock.monotonic())))
    clock.call_later(2, lambda: fired.append(("a", clock.monotonic())))
    cancelled = clock.call_later(3, lambda: fired.append(("x", clock.monotonic())))
    cancelled.cancel()
    assert clock.advance(10) == 2
    assert fired == [("a", 2.0), ("b", 5.0)]
    sleeper = asyncio.ensure_future(clock.sleep(60))
    await clock.scheduled(70.0)  # the sleeper waits on its timer now
    assert not sleeper.done()
    clock.advance(60)
    await sleeper
    event = asyncio.Event()
    waiter = asyncio.ensure_future(clock.wait(event, 5))
    await clock.scheduled(75.0)
    clock.advance(5)
    assert await waiter is False
    assert clock.monotonic() == 75.0
