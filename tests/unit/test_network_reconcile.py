"""The reconciler keeps a running sandbox's egress policy applied: the fast layer.

A real :class:`Reconciler` runs its watches on a memory store with no resync sweep (an hour),
against a driver that records every ``apply_network`` call; the control-plane handlers
(:class:`LifecycleApi`) make the changes. The same behaviour on a real lifecycle process and
NATS is in ``tests/integration/test_network_api.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest
from test_reconciler import Always, Events, FakeDriver, _idle, _ready

from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.messages.sandboxes import NetworkUpdate, Ref
from sandpod_contract.network import NetworkPolicy, Rule
from sandpod_contract.resources import SandboxStatus
from sandpod_lifecycle.api import LifecycleApi
from sandpod_lifecycle.reconciler import Reconciler
from sandpod_lifecycle.runtime.base import NetworkEnforcement, RuntimeFailure
from sandpod_store import MemoryStore, ObjectMeta, Resource

DEADLINE = 10.0  # a bound on waiting for a watch event, never a sleep


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd here (overrides the root conftest's autouse one)."""


class RecordingDriver(FakeDriver):
    """Every apply_network call in a queue; ``failing`` makes the next ones fail."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: asyncio.Queue[tuple[str, NetworkPolicy]] = asyncio.Queue(maxsize=100)
        self.failing = False

    async def apply_network(self, sid: str, policy: NetworkPolicy) -> NetworkEnforcement:
        if self.failing:
            raise RuntimeFailure("the firewall refused the batch")
        self.applied.put_nowait((sid, policy))
        return NetworkEnforcement(True)

    async def next(self) -> tuple[str, NetworkPolicy]:
        return await asyncio.wait_for(self.applied.get(), DEADLINE)


@dataclasses.dataclass
class Rig:
    store: MemoryStore
    driver: RecordingDriver
    events: Events
    api: LifecycleApi


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    store, driver, events = MemoryStore(), RecordingDriver(), Events()
    api = LifecycleApi(store, events)  # type: ignore[arg-type]
    rec = Reconciler(
        store=store,
        driver=driver,
        leases=Always(),
        events=events,  # type: ignore[arg-type]
        templates=api.template,
        ready_probe=_ready,
        idle_probe=_idle,
        resync=3600.0,
    )
    task = asyncio.create_task(rec.run())
    try:
        yield Rig(store, driver, events, api)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _sandbox(store: MemoryStore, name: str, **spec: object) -> Resource:
    meta = ObjectMeta(name=name)
    return await store.create(
        Resource("sandpod.dev/v1alpha1", "Sandbox", meta, {"permanent": True, **spec})
    )


async def _template(store: MemoryStore, name: str, network: dict[str, object]) -> None:
    obj = Resource(
        "sandpod.dev/v1alpha1", "SandboxTemplate", ObjectMeta(name=name), {"network": network}
    )
    try:
        current = await store.get("SandboxTemplate", "default", name)
    except ResourceNotFound:  # absent: create it
        await store.create(obj)
        return
    await store.update(dataclasses.replace(current, spec=obj.spec))


async def _status(store: MemoryStore, name: str) -> tuple[SandboxStatus, int]:
    obj = await store.get("Sandbox", "default", name)
    return SandboxStatus.from_dict(obj.status), obj.metadata.generation


async def test_a_new_sandbox_is_ready_only_with_its_policy_applied(rig: Rig) -> None:
    """The first apply happens before Ready, with the template's policy (public by default)."""
    await _sandbox(rig.store, "s1")
    sid, policy = await rig.driver.next()
    assert (sid, policy) == ("s1", NetworkPolicy())
    state = await rig.api.network(Ref(name="s1"))
    assert state.policy == NetworkPolicy().to_dict() and state.source == "template"


async def test_an_update_reaches_the_driver_through_the_watch(rig: Rig) -> None:
    """set_network -> the watch -> apply_network with the new policy; status.network records
    it for the new generation; the same update again calls nothing and keeps the generation."""
    await _sandbox(rig.store, "s1")
    await rig.driver.next()
    wire = {"mode": "allowlist", "allow": ["a.test:443", "10.0.0.0/8"], "deny": ["b.a.test"]}
    reply = await rig.api.set_network(NetworkUpdate(name="s1", policy=wire, wait=DEADLINE))
    sid, policy = await rig.driver.next()
    assert sid == "s1" and policy == NetworkPolicy.from_dict(wire)
    assert reply.applied_generation == reply.generation == 2 and reply.enforced
    status, generation = await _status(rig.store, "s1")
    assert status.network is not None and status.network.policy == policy
    assert status.network.observed_generation == generation == 2
    assert status.network.source == "sandbox"
    assert rig.events.network[-1]["type_"] == "updated"
    again = await rig.api.set_network(NetworkUpdate(name="s1", policy=wire))
    assert again.generation == 2
    await rig.api.set_network(NetworkUpdate(name="s1", policy={"mode": "deny-all"}))
    _, policy = await rig.driver.next()  # the next call is this one: the repeat made none
    assert policy.mode.value == "deny-all"


async def test_a_template_change_reaches_the_sandboxes_that_follow_it(rig: Rig) -> None:
    """Only the template watch can queue the sandbox here (no sweep): its effective policy
    follows the template; a sandbox with its own policy is not touched."""
    await _template(rig.store, "web", {"mode": "allowlist", "allow": ["one.test"]})
    await _sandbox(rig.store, "follows", templateRef={"name": "web"})
    _, first = await rig.driver.next()
    assert [r.text for r in first.allow] == ["one.test"]
    await _sandbox(rig.store, "own", templateRef={"name": "web"}, network={"mode": "deny-all"})
    sid, policy = await rig.driver.next()
    assert (sid, policy.mode.value) == ("own", "deny-all")
    await _template(rig.store, "web", {"mode": "allowlist", "allow": ["two.test"]})
    sid, policy = await rig.driver.next()
    assert sid == "follows" and [r.text for r in policy.allow] == ["two.test"]
    status, _ = await _status(rig.store, "own")
    assert status.network is not None and status.network.policy.mode.value == "deny-all"


async def test_a_failed_apply_is_retried_and_never_recorded_as_applied(rig: Rig) -> None:
    """A driver failure leaves status.network on the old policy (the reply says it is not
    applied yet) and the pass is retried until the runtime takes it."""
    await _sandbox(rig.store, "s1")
    await rig.driver.next()
    rig.driver.failing = True
    reply = await rig.api.set_network(NetworkUpdate(name="s1", policy={"mode": "deny-all"}))
    assert reply.applied_generation < reply.generation
    status, _ = await _status(rig.store, "s1")
    assert status.network is not None and status.network.policy == NetworkPolicy()
    rig.driver.failing = False
    _, policy = await rig.driver.next()  # the retry (no new change was made)
    assert policy.mode.value == "deny-all"


async def test_bad_policies_name_the_field_and_change_nothing(rig: Rig) -> None:
    """ResourceInvalid with the field of the bad rule; the generation stays."""
    await _sandbox(rig.store, "s1")
    await rig.driver.next()
    with pytest.raises(ResourceInvalid) as err:
        await rig.api.set_network(
            NetworkUpdate(name="s1", policy={"mode": "allowlist", "allow": ["x.test", "a b"]})
        )
    assert err.value.details["field"] == "spec.network.allow[1]"
    assert (await _status(rig.store, "s1"))[1] == 1


async def test_a_recreated_instance_gets_its_policy_again() -> None:
    """An instance made again (the last one died) has nothing applied, whatever status.network
    says of the last one: the create applies the policy again before Ready."""
    store, driver, events = MemoryStore(), RecordingDriver(), Events()
    api = LifecycleApi(store, events)  # type: ignore[arg-type]
    rec = Reconciler(
        store=store,
        driver=driver,
        leases=Always(),
        events=events,  # type: ignore[arg-type]
        templates=api.template,
        ready_probe=_ready,
        idle_probe=_idle,
        resync=3600.0,
    )
    await _sandbox(store, "s1", network={"mode": "deny-all"})
    await rec.reconcile("s1")
    assert driver.applied.get_nowait()[1].mode.value == "deny-all"
    driver.instances.clear()  # the instance died; its Sandbox still says Running
    await rec.reconcile("s1")
    assert "s1" in driver.instances
    sid, policy = driver.applied.get_nowait()
    assert (sid, policy.mode.value) == ("s1", "deny-all")


async def test_the_platforms_always_allowed_rules_join_every_effective_policy() -> None:
    """With always-allowed rules set, the driver, status.network and the network request all
    see them at the end of ``allow``: after an allowlist's own rules, kept below its deny
    rules, and never added to a deny-all policy."""
    store, driver, events = MemoryStore(), RecordingDriver(), Events()
    extra = (Rule.parse("always", "mirror.test:443"), Rule.parse("always", "10.9.0.0/16"))
    api = LifecycleApi(store, events, always_allowed=extra)  # type: ignore[arg-type]
    rec = Reconciler(
        store=store,
        driver=driver,
        leases=Always(),
        events=events,  # type: ignore[arg-type]
        templates=api.template,
        ready_probe=_ready,
        idle_probe=_idle,
        resync=3600.0,
        always_allowed=extra,
    )
    own = {"mode": "allowlist", "allow": ["a.test"], "deny": ["mirror.test"]}
    await _sandbox(store, "s1", network=own)
    await _sandbox(store, "s2", network={"mode": "deny-all"})
    for name in ("s1", "s2"):
        await rec.reconcile(name)
    applied = dict([driver.applied.get_nowait(), driver.applied.get_nowait()])
    s1 = applied["s1"]
    assert [r.text for r in s1.allow] == ["a.test", "mirror.test:443", "10.9.0.0/16"]
    assert not s1.name_verdict("mirror.test", 443).allowed  # its deny rule still wins
    assert s1.address_verdict("10.9.1.2", 80).allowed
    assert applied["s2"] == NetworkPolicy.from_dict({"mode": "deny-all"})
    status, _ = await _status(store, "s1")
    assert status.network is not None and status.network.policy == s1
    state = await api.network(Ref(name="s1"))
    assert state.policy["allow"] == ["a.test", "mirror.test:443", "10.9.0.0/16"]
    assert state.applied == state.policy
