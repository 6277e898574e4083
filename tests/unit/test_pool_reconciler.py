"""The pool state machine, pass by pass, against the in-memory store (fast layer; the real
services run in tests/integration/test_pools.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_reconciler import Always  # the one fake lease keeper of the unit tests

from sandpod_contract.pooling import CLAIM_LABEL, HASH_LABEL, POOL_LABEL
from sandpod_pool.cache import Mirror
from sandpod_pool.members import POOL_KIND, SANDBOX, TEMPLATE, MemberState, member_state
from sandpod_pool.pools import PoolReconciler
from sandpod_store import MemoryStore, ObjectMeta, Resource


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: the pool reconciler runs on the memory store here."""


class Rig:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.pools = Mirror(self.store, POOL_KIND)
        self.templates = Mirror(self.store, TEMPLATE)
        self.sandboxes = Mirror(self.store, SANDBOX, keep=lambda o: POOL_LABEL in o.metadata.labels)
        self.rec = PoolReconciler(
            store=self.store,
            leases=Always(),
            pools=self.pools,
            sandboxes=self.sandboxes,
            templates=self.templates,
            create_rate=100.0,
            member_grace=60.0,
        )

    async def put(self, kind: str, name: str, spec: dict[str, Any], mirror: Mirror) -> None:
        obj = Resource("sandpod.dev/v1alpha1", kind, ObjectMeta(name=name), spec=spec)
        try:
            current = await self.store.get(kind, "default", name)
            meta = dataclasses.replace(
                obj.metadata, resource_version=current.metadata.resource_version
            )
            saved = await self.store.update(dataclasses.replace(obj, metadata=meta))
        except Exception:
            saved = await self.store.create(obj)
        mirror.observe(saved)

    async def pool(
        self, replicas: int, strategy: str = "RollingUpdate", template: str | None = None
    ) -> None:
        spec: dict[str, Any] = {"replicas": replicas, "updateStrategy": {"type": strategy}}
        if template:
            spec["templateRef"] = {"name": template}
        await self.put(POOL_KIND, "py", spec, self.pools)

    async def template(self, value: str) -> None:
        await self.put(TEMPLATE, "tpl", {"env": [{"name": "V", "value": value}]}, self.templates)

    async def set_phase(self, obj: Resource, phase: str, ready: bool) -> None:
        reason = "ExecdReady" if ready else "InstanceFailed"
        cond = {"type": "Ready", "status": str(ready), "reason": reason, "message": "boom"}
        status = {"phase": phase, "conditions": [cond]}
        current = await self.store.get(SANDBOX, "default", obj.metadata.name)
        self.sandboxes.observe(
            await self.store.update_status(dataclasses.replace(current, status=status))
        )

    def members(self) -> list[Resource]:
        return [m for m in self.sandboxes.values() if m.metadata.labels.get(POOL_LABEL) == "py"]

    def state(self, s: MemberState) -> list[Resource]:
        return [m for m in self.members() if member_state(m) is s]

    async def ready_all(self) -> None:
        for m in self.state(MemberState.STARTING):
            await self.set_phase(m, "Running", ready=True)

    async def claim(self, member: Resource) -> None:
        current = await self.store.get(SANDBOX, "default", member.metadata.name)
        meta = dataclasses.replace(
            current.metadata, labels={**current.metadata.labels, CLAIM_LABEL: "c"}
        )
        self.sandboxes.observe(await self.store.update(dataclasses.replace(current, metadata=meta)))

    async def pass_(self) -> float | None:
        return await self.rec.reconcile("default/py")


async def test_fill_creates_the_difference_once_and_never_overshoots() -> None:
    """An empty pool of 3 creates 3; passes while they start create nothing more."""
    rig = Rig()
    await rig.pool(3)
    await rig.pass_()
    assert len(rig.state(MemberState.STARTING)) == 3
    for _ in range(3):
        await rig.pass_()
    assert len(rig.members()) == 3 and rig.rec.created == 3


async def test_a_claimed_member_is_replaced_by_exactly_one() -> None:
    """Claiming one of 3 ready members makes the next pass create exactly one."""
    rig = Rig()
    await rig.pool(3)
    await rig.pass_()
    await rig.ready_all()
    await rig.claim(rig.members()[0])
    await rig.pass_()
    await rig.pass_()
    assert len(rig.state(MemberState.CLAIMED)) == 1
    assert len(rig.state(MemberState.READY)) + len(rig.state(MemberState.STARTING)) == 3
    assert rig.rec.created == 4


async def test_scale_down_deletes_the_extra_unready_first_and_status_counts() -> None:
    """replicas 3 -> 1: two members are marked for deletion, an unready one first; the status
    reports replicas, ready and available."""
    rig = Rig()
    await rig.pool(3)
    await rig.pass_()
    members = rig.members()
    for m in members[:2]:
        await rig.set_phase(m, "Running", ready=True)
    await rig.pool(1)
    await rig.pass_()
    assert [m.metadata.name for m in rig.state(MemberState.DELETING)].count(
        members[2].metadata.name
    ) == 1
    assert len(rig.state(MemberState.DELETING)) == 2
    status = (await rig.store.get(POOL_KIND, "default", "py")).status
    assert (status["replicas"], status["readyReplicas"], status["availableReplicas"]) == (1, 1, 1)


async def test_a_failed_member_is_deleted_and_creation_backs_off() -> None:
    """A Failed member is deleted, ReplicaFailure is set with its message, and no new member is
    created until the backoff passes (the pass asks to be called back later)."""
    rig = Rig()
    await rig.pool(1)
    await rig.pass_()
    await rig.set_phase(rig.members()[0], "Failed", ready=False)
    again = await rig.pass_()
    assert again is not None and again > 1.0
    assert rig.rec.created == 1 and len(rig.state(MemberState.DELETING)) == 1
    conds = {
        c["type"]: c for c in (await rig.store.get(POOL_KIND, "default", "py")).status["conditions"]
    }
    assert conds["ReplicaFailure"]["status"] == "True"
    assert (
        conds["ReplicaFailure"]["reason"] == "MembersFailing"
        and "boom" in conds["ReplicaFailure"]["message"]
    )
    assert conds["Ready"]["reason"] == "MembersFailing"


async def test_rolling_update_surges_by_one_and_deletes_stale_as_fresh_become_ready() -> None:
    """Template change with RollingUpdate: a bounded surge of fresh members; a stale one goes
    only when a fresh one is ready; in the end every free member is fresh."""
    rig = Rig()
    await rig.template("1")
    await rig.pool(2, template="tpl")
    await rig.pass_()
    await rig.ready_all()
    old_hash = rig.members()[0].metadata.labels[HASH_LABEL]
    await rig.template("2")
    await rig.pass_()
    fresh = [m for m in rig.members() if m.metadata.labels[HASH_LABEL] != old_hash]
    assert len(fresh) == 1 and not rig.state(MemberState.DELETING)  # surge of 1, nothing gone
    for _ in range(4):
        await rig.ready_all()
        await rig.pass_()
    free = [
        m for m in rig.members() if member_state(m) in (MemberState.READY, MemberState.STARTING)
    ]
    assert len(free) == 2 and all(m.metadata.labels[HASH_LABEL] != old_hash for m in free)


async def test_recreate_deletes_stale_members_at_once() -> None:
    """Template change with Recreate: every stale free member is deleted in one pass."""
    rig = Rig()
    await rig.template("1")
    await rig.pool(2, strategy="Recreate", template="tpl")
    await rig.pass_()
    await rig.ready_all()
    await rig.template("2")
    await rig.pass_()
    assert len(rig.state(MemberState.DELETING)) == 2
    assert len(rig.state(MemberState.STARTING)) == 2


async def test_a_deleted_pool_deletes_free_members_and_keeps_claimed_ones() -> None:
    """Without its pool object, free members are deleted; a claimed member is left alone."""
    rig = Rig()
    await rig.pool(2)
    await rig.pass_()
    await rig.ready_all()
    await rig.claim(rig.members()[0])
    await rig.store.delete(POOL_KIND, "default", "py")
    rig.pools.forget("default", "py")
    await rig.pass_()
    assert len(rig.state(MemberState.DELETING)) == 1 and len(rig.state(MemberState.CLAIMED)) == 1
