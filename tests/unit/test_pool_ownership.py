"""Pool membership is ownership, not labels: a Sandbox carrying a pool's labels (as tenant B
made them, copying ``sandpod.dev/pool`` and ``sandpod.dev/template-hash`` off a member) but no
owner reference from the pool is never counted, deleted or bound by the pool service (the real
pool code on the in-memory store; tests/integration/test_reserved_metadata.py attacks through
the gateway and the bus)."""

from __future__ import annotations

import dataclasses
from typing import Any

from test_pool_reconciler import Rig, _session_daemons  # noqa: F401

from sandpod_contract.pooling import CLAIM_LABEL, HASH_LABEL, POOL_LABEL, ClaimReason, ClaimSpec
from sandpod_pool.cache import Mirror
from sandpod_pool.claims import CLAIM, Claims
from sandpod_pool.members import SANDBOX, MemberState, is_deleting, member_state
from sandpod_store import ObjectMeta, OwnerReference, Resource

__all__: list[str] = []


def _claims(rig: Rig) -> Claims:
    async def configure(_name: str, _env: dict[str, str], _gen: int) -> bool:
        return True

    def background(coro: Any, _name: str) -> None:
        coro.close()

    return Claims(
        store=rig.store,
        pools=rig.pools,
        sandboxes=rig.sandboxes,
        claims=Mirror(rig.store, CLAIM),
        templates=rig.templates,
        configure=configure,
        recover_after=60.0,
        background=background,
    )


async def _forge(rig: Rig, name: str, owners: tuple[OwnerReference, ...] = ()) -> Resource:
    """A Running, Ready Sandbox with pool ``py``'s labels (its members' hash), ``owners``."""
    digest = rig.members()[0].metadata.labels[HASH_LABEL]
    meta = ObjectMeta(
        name=name, labels={POOL_LABEL: "py", HASH_LABEL: digest}, owner_references=owners
    )
    created = await rig.store.create(Resource("sandpod.dev/v1alpha1", SANDBOX, meta, spec={}))
    rig.sandboxes.observe(created)
    await rig.set_phase(created, "Running", ready=True)
    forged = rig.sandboxes.get("default", name)
    assert forged is not None and member_state(forged) is MemberState.READY
    return forged


async def _claim(claims: Claims, name: str) -> tuple[Resource, ClaimReason]:
    claim = Resource(
        "sandpod.dev/v1alpha1", CLAIM, ObjectMeta(name=name), spec={"poolRef": {"name": "py"}}
    )
    binding = await claims.resolve("default", ClaimSpec.from_dict(claim.spec))
    return await claims._bind(claim, binding)


async def test_a_labelled_sandbox_without_the_pools_owner_reference_is_never_bound() -> None:
    """Two real members and two look-alikes (no owner reference; a reference naming the pool
    with another uid): three claims bind the two members warm and then create cold; neither
    look-alike is ever bound or counted in the pool's status. The pool leaves the unowned one
    alone and deletes the other as a deleted pool's member (Kubernetes' garbage collection)."""
    rig = Rig()
    await rig.pool(2)
    await rig.pass_()
    await rig.ready_all()
    real = {m.metadata.name for m in rig.members()}
    pool = rig.pools.get("default", "py")
    assert pool is not None
    wrong_uid = OwnerReference("sandpod.dev/v1alpha1", "SandboxWarmPool", "py", "0" * 32, True)
    forged = {
        (await _forge(rig, "beta--evil")).metadata.name,
        (await _forge(rig, "beta--evil2", (wrong_uid,))).metadata.name,
    }
    claims = _claims(rig)
    bound = [await _claim(claims, f"c{i}") for i in range(3)]
    warm = {s.metadata.name for s, reason in bound if reason is ClaimReason.WARM}
    assert warm == real, f"bound {[(s.metadata.name, r) for s, r in bound]}"
    assert bound[2][1] is ClaimReason.POOL_EXHAUSTED
    for name in forged:
        obj = await rig.store.get(SANDBOX, "default", name)
        assert CLAIM_LABEL not in obj.metadata.labels and not is_deleting(obj)
    # The pool counts its own (none free now), refills 2, and leaves the look-alikes alone.
    await rig.pass_()
    pool = await rig.store.get("SandboxWarmPool", "default", "py")
    assert pool.status["replicas"] == 2 and pool.status["readyReplicas"] == 0
    assert not is_deleting(await rig.store.get(SANDBOX, "default", "beta--evil"))
    assert is_deleting(await rig.store.get(SANDBOX, "default", "beta--evil2"))
    # Nothing else harmed: the claimed members kept their claims, and gave up the pool's
    # owner reference (a claimed sandbox is the claim's, not deleted with its pool).
    for s, _ in bound[:2]:
        obj = await rig.store.get(SANDBOX, "default", s.metadata.name)
        assert obj.metadata.labels[CLAIM_LABEL] and obj.metadata.owner_references == ()


async def test_members_of_a_deleted_pool_do_not_join_its_successor() -> None:
    """A pool deleted and recreated under the same name has a new uid: the old pool's free
    members are deleted, not counted or bound as the new pool's."""
    rig = Rig()
    await rig.pool(1)
    await rig.pass_()
    await rig.ready_all()
    (old,) = rig.members()
    await rig.store.delete("SandboxWarmPool", "default", "py")
    rig.pools.forget("default", "py")
    await rig.pool(1)
    await rig.pass_()
    assert is_deleting(await rig.store.get(SANDBOX, "default", old.metadata.name))
    fresh = [m for m in rig.members() if m.metadata.name != old.metadata.name]
    assert len(fresh) == 1
    pool = rig.pools.get("default", "py")
    assert pool is not None and fresh[0].metadata.owner_references[0].uid == pool.metadata.uid


def test_owner_references_round_trip_and_survive_an_update_by_read_modify_write() -> None:
    """The store model carries ownerReferences in the Kubernetes wire shape."""
    ref = OwnerReference("sandpod.dev/v1alpha1", "SandboxWarmPool", "py", "u-1", True)
    obj = Resource("sandpod.dev/v1alpha1", SANDBOX, ObjectMeta(name="s", owner_references=(ref,)))
    wire = obj.to_dict()
    assert wire["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "sandpod.dev/v1alpha1",
            "kind": "SandboxWarmPool",
            "name": "py",
            "uid": "u-1",
            "controller": True,
        }
    ]
    back = Resource.from_dict(wire)
    assert back == obj and back.metadata.controller() == ref
    assert dataclasses.replace(back.metadata, owner_references=()).controller() is None
