"""The reconciler's state machine against the in-memory store and a fake driver (fast layer;
the real thing runs in tests/integration/test_lifecycle.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from sandpod_contract.messages.sandboxes import NETWORK_EVENT_TYPES, SANDBOX_EVENT_TYPES
from sandpod_contract.network import NetworkPolicy
from sandpod_contract.resources import (
    ConditionReason,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
)
from sandpod_lifecycle.driver import Instance
from sandpod_lifecycle.reconciler import Outcome, Reconciler
from sandpod_lifecycle.runtime.base import InstanceUnhealthy, NetworkEnforcement
from sandpod_store import MemoryStore, ObjectMeta, Resource


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: the reconciler runs on fakes here."""


class FakeDriver:
    name = "fake"

    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}
        self.calls: list[str] = []
        self.networks: list[tuple[str, NetworkPolicy]] = []  # apply_network calls, in order

    def protections(self) -> dict[str, str]:
        return {"jail": "active"}

    async def ensure(
        self, sid: str, spec: SandboxSpec, template: SandboxTemplateSpec, owner: object = None
    ) -> Instance:
        self.calls.append(f"ensure {sid}")
        self.instances.setdefault(sid, Instance(sid, running=True, paused=False, pid=1))
        return self.instances[sid]

    async def inspect(self, sid: str) -> Instance | None:
        return self.instances.get(sid)

    async def pause(self, sid: str) -> None:
        self.calls.append(f"pause {sid}")
        self.instances[sid] = dataclasses.replace(self.instances[sid], paused=True)

    async def resume(self, sid: str) -> None:
        self.calls.append(f"resume {sid}")
        self.instances[sid] = dataclasses.replace(self.instances[sid], paused=False)

    async def destroy(self, sid: str) -> None:
        self.calls.append(f"destroy {sid}")
        self.instances.pop(sid, None)

    async def list(self) -> list[str]:
        return sorted(self.instances)

    async def apply_network(self, sid: str, policy: NetworkPolicy) -> NetworkEnforcement:
        self.networks.append((sid, policy))
        return NetworkEnforcement(False, "fake runtime: nothing enforced")


class Always:
    """A lease keeper (sandpod_service.leases.LeaseKeeper): this replica holds every object
    while ``leading`` (always, unless a test makes it a standby)."""

    def __init__(self, leading: bool = True) -> None:
        self.leading = leading

    async def acquire(self, key: str) -> bool:
        return self.leading

    def holds(self, key: str) -> bool:
        return self.leading

    def active(self) -> bool:
        return self.leading

    async def release(self, key: str) -> None: ...

    async def release_all(self) -> None: ...

    async def renew_all(self) -> None: ...


class Events:
    def __init__(self) -> None:
        self.types: list[str] = []
        self.network: list[dict[str, object]] = []

    async def publish(self, **kw: object) -> None:
        assert kw["type_"] in SANDBOX_EVENT_TYPES, f"event type {kw['type_']} not in the contract"
        self.types.append(str(kw["type_"]))

    async def publish_network(self, **kw: object) -> None:
        assert kw["type_"] in NETWORK_EVENT_TYPES, f"event type {kw['type_']} not in the contract"
        self.network.append(kw)


async def _template(ns: str, name: str | None) -> SandboxTemplateSpec:
    return SandboxTemplateSpec()


async def _ready(sid: str, timeout: float) -> bool:
    return True


async def _idle(sid: str) -> float | None:
    return 0.0


def _reconciler(
    store: MemoryStore,
    driver: FakeDriver,
    events: Events,
    leases: Always | None = None,
    resync: float = 10.0,
) -> Reconciler:
    return Reconciler(
        store=store,
        driver=driver,
        leases=leases or Always(),
        events=events,  # type: ignore[arg-type]
        templates=_template,
        ready_probe=_ready,
        idle_probe=_idle,
        resync=resync,
    )


async def _sandbox(store: MemoryStore, **spec: object) -> Resource:
    obj = Resource(
        "sandpod.dev/v1alpha1", "Sandbox", ObjectMeta(name="s1"), {"permanent": True, **spec}
    )
    return await store.create(obj)


async def test_create_then_ready_then_pause_resume() -> None:
    """A new Sandbox gets an instance and Running; pause/resume follow operatingMode."""
    store, driver, events = MemoryStore(), FakeDriver(), Events()
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    assert await rec.reconcile("s1") is Outcome.DONE
    obj = await store.get("Sandbox", "default", "s1")
    assert SandboxStatus.from_dict(obj.status).phase.value == "Running"
    assert obj.status["endpoint"] == {"subjectPrefix": "sandpod.sbx.s1"}
    await store.update(dataclasses.replace(obj, spec={**obj.spec, "operatingMode": "Paused"}))
    await rec.reconcile("s1")
    obj = await store.get("Sandbox", "default", "s1")
    assert SandboxStatus.from_dict(obj.status).phase.value == "Paused"
    assert driver.instances["s1"].paused and events.types[-1] == "paused"
    await store.update(dataclasses.replace(obj, spec={**obj.spec, "operatingMode": "Running"}))
    await rec.reconcile("s1")
    assert not driver.instances["s1"].paused and events.types[-1] == "resumed"


async def test_a_frozen_instance_with_a_stale_phase_is_corrected() -> None:
    """If a pass froze the instance but lost the race to record it, the next pass records
    Paused instead of leaving the phase Running forever (and does not pause twice)."""
    store, driver, events = MemoryStore(), FakeDriver(), Events()
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    await rec.reconcile("s1")
    obj = await store.get("Sandbox", "default", "s1")
    await store.update(dataclasses.replace(obj, spec={**obj.spec, "operatingMode": "Paused"}))
    driver.instances["s1"] = dataclasses.replace(driver.instances["s1"], paused=True)
    await rec.reconcile("s1")
    obj = await store.get("Sandbox", "default", "s1")
    assert SandboxStatus.from_dict(obj.status).phase.value == "Paused"
    assert "pause s1" not in driver.calls


async def test_deleted_objects_lose_their_instance(tmp_path: Path) -> None:
    """An instance whose object is gone is destroyed; a delete request removes both."""
    store, driver, events = MemoryStore(), FakeDriver(), Events()
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    await rec.reconcile("s1")
    obj = await store.get("Sandbox", "default", "s1")
    meta = dataclasses.replace(obj.metadata, annotations={"sandpod.dev/delete-requested": "true"})
    await store.update(dataclasses.replace(obj, metadata=meta))
    await rec.reconcile("s1")
    assert "destroy s1" in driver.calls and events.types[-1] == "deleted"
    driver.instances["orphan"] = Instance("orphan", running=True, paused=False)
    await rec.reconcile("orphan")
    assert "orphan" not in driver.instances


class CreatingDuringList(MemoryStore):
    """A store whose list answers from before a sandbox (object and instance) was created while
    the list was in flight: what a fast create racing the resync looks like."""

    def __init__(self, driver: FakeDriver) -> None:
        super().__init__()
        self.driver = driver

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | None = None,
    ) -> tuple[list[Resource], int]:
        before = await super().list(kind, namespace, selector)
        if kind == "Sandbox" and "fresh" not in self.driver.instances:
            await self.create(
                Resource(
                    "sandpod.dev/v1alpha1", "Sandbox", ObjectMeta(name="fresh"), {"permanent": True}
                )
            )
            await self.driver.ensure("fresh", SandboxSpec(), SandboxTemplateSpec())
        return before


async def test_resync_never_destroys_an_instance_created_while_it_listed() -> None:
    """An instance whose object appeared during the resync's list is not an orphan (the
    resync lists instances before objects); a real orphan is still destroyed."""
    driver = FakeDriver()
    store, events = CreatingDuringList(driver), Events()
    rec = _reconciler(store, driver, events)
    driver.instances["ghost"] = Instance("ghost", running=True, paused=False, pid=2)
    await rec.resync_once()
    assert "fresh" in driver.instances
    assert "destroy fresh" not in driver.calls and "destroy ghost" in driver.calls


async def test_a_standby_neither_reconciles_nor_sweeps_until_it_leads() -> None:
    """Without the lease (a standby replica) nothing is created and no orphan destroyed; once it
    leads, ``resync_soon`` resyncs at once (not after the period): the orphan goes, the
    Sandbox gets its instance."""
    store, driver, events = MemoryStore(), FakeDriver(), Events()
    leases = Always(leading=False)
    rec = _reconciler(store, driver, events, leases, resync=3600)
    await _sandbox(store)
    driver.instances["ghost"] = Instance("ghost", running=True, paused=False, pid=2)
    assert await rec.reconcile("s1") is Outcome.SKIPPED
    await rec.resync_once()
    assert driver.calls == []
    task = asyncio.create_task(rec.run(), name="reconciler")
    try:
        leases.leading = True
        rec.resync_soon()
        async with asyncio.timeout(10):
            while "ensure s1" not in driver.calls or "destroy ghost" not in driver.calls:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_create_that_outlives_the_lease_leaves_the_instance_alone() -> None:
    """Leadership lost while waiting for a new instance to answer: the failed wait neither
    destroys the instance (the new leader may have adopted it) nor counts as a failure."""
    store, driver, events = MemoryStore(), FakeDriver(), Events()
    leases = Always()

    async def lost_while_waiting(sid: str, timeout: float) -> bool:
        leases.leading = False
        return False

    rec = Reconciler(
        store=store,
        driver=driver,
        leases=leases,
        events=events,  # type: ignore[arg-type]
        templates=_template,
        ready_probe=lost_while_waiting,
        idle_probe=_idle,
    )
    await _sandbox(store)
    assert await rec.reconcile("s1") is Outcome.SKIPPED
    assert driver.calls == ["ensure s1"]
    obj = await store.get("Sandbox", "default", "s1")
    assert "conditions" not in obj.status


class UnhealthyDriver(FakeDriver):
    """ensure() raises what a runtime raises for an instance that does not serve."""

    def __init__(self, reason: ConditionReason, terminal: bool) -> None:
        super().__init__()
        self.reason, self.terminal = reason, terminal
        self.started: list[bool] = []

    async def ensure(
        self, sid: str, spec: SandboxSpec, template: SandboxTemplateSpec, owner: object = None
    ) -> Instance:
        self.calls.append(f"ensure {sid}")
        self.started.append(bool(getattr(owner, "started", False)))
        self.instances.setdefault(sid, Instance(sid, running=False, paused=False))
        raise InstanceUnhealthy(
            f"{self.reason} says the Pod", reason=self.reason, terminal=self.terminal
        )


def _conditions(obj: Resource) -> dict[str, dict[str, object]]:
    return {c["type"]: c for c in obj.status["conditions"]}


async def test_a_transient_problem_keeps_the_instance_and_writes_its_reason_once() -> None:
    """A transient InstanceUnhealthy: Pending, Ready=False with the reason and message, the
    instance kept (no destroy, no re-create) and the status written once however often the
    same problem is seen."""
    store, driver, events = (
        MemoryStore(),
        UnhealthyDriver(ConditionReason.UNSCHEDULABLE, False),
        Events(),
    )
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    assert await rec.reconcile("s1") is Outcome.RETRY
    obj = await store.get("Sandbox", "default", "s1")
    ready = _conditions(obj)["Ready"]
    assert obj.status["phase"] == "Pending"
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")
    assert ready["message"] == "Unschedulable says the Pod"
    rec._failures.clear()  # the recheck delay, skipped
    assert await rec.reconcile("s1") is Outcome.RETRY
    again = await store.get("Sandbox", "default", "s1")
    assert again.metadata.resource_version == obj.metadata.resource_version  # no churn
    assert not any(c.startswith("destroy") for c in driver.calls)
    assert driver.calls == ["ensure s1", "ensure s1"] and driver.started == [False, False]


async def test_a_terminal_problem_fails_the_sandbox_with_its_reason_and_stays_failed() -> None:
    """A terminal InstanceUnhealthy: the instance is destroyed, the Sandbox Failed with the
    runtime's reason (Failed and Ready), a failed event; later passes change nothing."""
    store, driver, events = (
        MemoryStore(),
        UnhealthyDriver(ConditionReason.OOM_KILLED, True),
        Events(),
    )
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    assert await rec.reconcile("s1") is Outcome.DONE
    obj = await store.get("Sandbox", "default", "s1")
    assert obj.status["phase"] == "Failed" and events.types == ["failed"]
    conditions = _conditions(obj)
    assert (conditions["Failed"]["status"], conditions["Failed"]["reason"]) == ("True", "OOMKilled")
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "OOMKilled")
    assert driver.calls == ["ensure s1", "destroy s1"]
    assert await rec.reconcile("s1") is Outcome.DONE
    assert driver.calls == ["ensure s1", "destroy s1"]


async def test_a_running_sandbox_whose_instance_turns_terminal_fails() -> None:
    """inspect() reporting a terminal problem on a running sandbox's instance fails it; a lost
    instance is re-ensured with ``Owner.started`` so the runtime can tell lost from new."""
    store, driver, events = MemoryStore(), FakeDriver(), Events()
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    await rec.reconcile("s1")
    driver.instances["s1"] = Instance(
        "s1",
        running=True,
        paused=False,
        detail="CrashLoopBackOff",
        reason=ConditionReason.CRASH_LOOP,
        terminal=True,
    )
    assert await rec.reconcile("s1") is Outcome.DONE
    obj = await store.get("Sandbox", "default", "s1")
    assert obj.status["phase"] == "Failed"
    assert _conditions(obj)["Failed"]["message"] == "CrashLoopBackOff"


async def test_a_lost_instance_of_a_running_sandbox_is_ensured_as_started() -> None:
    """The instance of a Running sandbox vanished: ensure() is told the sandbox had started."""
    store, driver, events = (
        MemoryStore(),
        UnhealthyDriver(ConditionReason.POD_DELETED, True),
        Events(),
    )
    rec = _reconciler(store, driver, events)
    await _sandbox(store)
    await FakeDriver.ensure(driver, "s1", SandboxSpec(), SandboxTemplateSpec())
    obj = await store.get("Sandbox", "default", "s1")
    status = {"phase": "Running", "conditions": []}
    await store.update_status(dataclasses.replace(obj, status=status))
    driver.instances.clear()
    assert await rec.reconcile("s1") is Outcome.DONE
    assert driver.started == [True]
    assert (await store.get("Sandbox", "default", "s1")).status["phase"] == "Failed"
