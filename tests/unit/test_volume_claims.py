"""SandboxVolume API rules on the in-memory store: exclusivity, input, tenancy, deletion.

The lifecycle API claims a Sandbox's volumes in the volume's status with the store's
optimistic concurrency before the Sandbox is written (``sandpod_lifecycle/volumes.py``). These
tests drive :class:`LifecycleApi` and :class:`Volumes` as the API server does (the tenant from
the request's context), against :class:`MemoryStore` and a recording storage backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from test_reconciler import Events, FakeDriver, _reconciler

from sandpod_contract.errors import (
    BadRequest,
    ResourceInvalid,
    ResourceNotFound,
    SandpodError,
    VolumeInUse,
    VolumeQuotaExceeded,
)
from sandpod_contract.messages.sandboxes import (
    VOLUME_EVENT_TYPES,
    ObjectRequest,
    Ref,
    Selection,
)
from sandpod_contract.volumes import SandboxVolumeSpec, SandboxVolumeStatus, VolumeMount
from sandpod_lifecycle.api import LifecycleApi
from sandpod_lifecycle.volumes import VOLUME, StaleHolders, VolumeLimits, Volumes
from sandpod_service import api as service_api
from sandpod_store import MemoryStore, ObjectMeta, Resource


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd here (overrides the root conftest's autouse one)."""


class Backend:
    def __init__(self) -> None:
        self.made: set[tuple[str, str]] = set()
        self.removed: list[tuple[str, str]] = []

    async def provision(self, namespace: str, name: str, spec: SandboxVolumeSpec) -> None:
        self.made.add((namespace, name))

    async def remove(self, namespace: str, name: str) -> None:
        self.made.discard((namespace, name))
        self.removed.append((namespace, name))

    async def usage(self, namespace: str, name: str) -> int | None:
        return 4096 if (namespace, name) in self.made else None


class InterleavingStore(MemoryStore):
    """Yields to the loop after every read, so concurrent claims interleave between reading a
    volume's holders and writing them (what a real store's round trips do)."""

    async def get(self, kind: str, namespace: str, name: str) -> Resource:
        obj = await super().get(kind, namespace, name)
        await asyncio.sleep(0)
        return obj


class ReconcilerEvents(Events):
    async def publish_volume(self, **kw: str) -> None:
        assert kw["type_"] in VOLUME_EVENT_TYPES, kw


class VolumeEvents:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (volume, type, sandbox)

    async def publish_volume(self, **kw: str) -> None:
        assert kw["type_"] in VOLUME_EVENT_TYPES, kw
        self.seen.append((kw["name"], kw["type_"], kw.get("sandbox", "")))


@dataclasses.dataclass
class Rig:
    store: MemoryStore
    backend: Backend
    volumes: Volumes
    api: LifecycleApi
    events: VolumeEvents


@pytest.fixture
def rig() -> Rig:
    store, backend, events = InterleavingStore(), Backend(), VolumeEvents()
    volumes = Volumes(store, backend, events)
    api = LifecycleApi(store, Events(), volumes=volumes)  # type: ignore[arg-type]
    return Rig(store, backend, volumes, api, events)


@contextlib.contextmanager
def tenant(name: str | None) -> Iterator[None]:
    token = service_api._TENANT.set(name)
    try:
        yield
    finally:
        service_api._TENANT.reset(token)


async def _volume(rig: Rig, name: str, size: str = "1Gi") -> dict[str, Any]:
    obj = {"metadata": {"name": name}, "spec": {"size": size}}
    return (await rig.volumes.create(ObjectRequest(object=obj))).object


async def _sandbox(rig: Rig, name: str, *mounts: tuple[str, str, bool]) -> dict[str, Any]:
    vols = [{"name": n, "mountPath": p, "readOnly": ro} for n, p, ro in mounts]
    obj = {"metadata": {"name": name}, "spec": {"volumes": vols}}
    return (await rig.api.create(ObjectRequest(object=obj))).object


async def _status(rig: Rig, name: str) -> SandboxVolumeStatus:
    obj = await rig.store.get(VOLUME, "default", name)
    return SandboxVolumeStatus.from_dict(obj.status)


async def test_one_writer_at_a_time_and_the_refusal_names_the_holder(rig: Rig) -> None:
    """A second read-write mount, and a read-only one, are refused while a writer holds the
    volume (store.in_use naming it); the refused Sandbox is never written."""
    await _volume(rig, "data")
    await _sandbox(rig, "a", ("data", "/data", False))
    assert (await _status(rig, "data")).writer == "a"
    for ro in (False, True):
        with pytest.raises(VolumeInUse) as caught:
            await _sandbox(rig, f"b{int(ro)}", ("data", "/data", ro))
        assert caught.value.details == {"name": "data", "holders": "a"}
        assert "a" in caught.value.message
    names = [o.metadata.name for o in (await rig.store.list("Sandbox", None))[0]]
    assert names == ["a"]


async def test_readers_share_and_keep_a_writer_out(rig: Rig) -> None:
    """Any number of read-only mounts at once; a read-write one waits until they are gone."""
    await _volume(rig, "data")
    await _sandbox(rig, "r1", ("data", "/data", True))
    await _sandbox(rig, "r2", ("data", "/mnt/data", True))
    assert (await _status(rig, "data")).readers == ("r1", "r2")
    with pytest.raises(VolumeInUse):
        await _sandbox(rig, "w", ("data", "/data", False))
    await rig.volumes.release("default", "r1", ["data"])
    await rig.volumes.release("default", "r2", ["data"])
    status = await _status(rig, "data")
    assert status.holders == () and status.phase == "Available"
    await _sandbox(rig, "w", ("data", "/data", False))
    assert (await _status(rig, "data")).writer == "w"


async def test_concurrent_creates_never_both_write(rig: Rig) -> None:
    """Ten creates asking for the same volume read-write at once: exactly one wins."""
    await _volume(rig, "data")
    results = await asyncio.gather(
        *(_sandbox(rig, f"s{i}", ("data", "/data", False)) for i in range(10)),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, dict)]
    assert len(won) == 1
    assert all(isinstance(r, VolumeInUse) for r in results if not isinstance(r, dict))
    assert (await _status(rig, "data")).writer == won[0]["metadata"]["name"]


async def test_a_claim_is_all_or_nothing(rig: Rig) -> None:
    """A Sandbox naming a free volume and a held one gets neither."""
    await _volume(rig, "free")
    await _volume(rig, "held")
    await _sandbox(rig, "a", ("held", "/held", False))
    with pytest.raises(VolumeInUse):
        await _sandbox(rig, "b", ("free", "/free", False), ("held", "/held", False))
    assert (await _status(rig, "free")).holders == ()


async def test_deleting_a_held_volume_is_refused_and_delete_frees_its_storage(rig: Rig) -> None:
    """Delete is store.in_use while held; once released the object and its storage go."""
    await _volume(rig, "data")
    await _sandbox(rig, "a", ("data", "/data", False))
    with pytest.raises(VolumeInUse):
        await rig.volumes.delete(Ref(name="data"))
    assert ("default", "data") in rig.backend.made
    await rig.volumes.release("default", "a", ["data"])
    await rig.volumes.delete(Ref(name="data"))
    assert rig.backend.removed == [("default", "data")]
    assert rig.events.seen == [
        ("data", "created", ""),
        ("data", "claimed", "a"),
        ("data", "released", "a"),
        ("data", "deleted", ""),
    ]
    with pytest.raises(ResourceNotFound):
        await rig.volumes.get(Ref(name="data"))


async def test_get_reports_usage_and_list_shows_volumes(rig: Rig) -> None:
    """get fills status.usedBytes from the backend; list returns the volumes."""
    await _volume(rig, "data")
    got = (await rig.volumes.get(Ref(name="data"))).object
    assert got["status"]["usedBytes"] == 4096 and got["status"]["phase"] == "Available"
    items = (await rig.volumes.list(Selection())).items
    assert [i["metadata"]["name"] for i in items] == ["data"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.size"),
        ({"size": "lots"}, "spec.size"),
        ({"size": "1Mi"}, "spec.size"),
        ({"size": 5}, "spec.size"),
        ({"size": "1Gi", "storageClassName": "Bad Class"}, "spec.storageClassName"),
    ],
)
async def test_bad_volume_specs_name_the_field(rig: Rig, spec: dict[str, Any], field: str) -> None:
    """Bad sizes and storage classes are ResourceInvalid naming the field; nothing is made."""
    with pytest.raises(ResourceInvalid) as caught:
        await rig.volumes.create(ObjectRequest(object={"metadata": {"name": "v"}, "spec": spec}))
    assert caught.value.details["field"] == field
    assert rig.backend.made == set()


@pytest.mark.parametrize(
    "path",
    [
        "data",
        "../data",
        "/data/../etc",
        "/data/./x",
        "//data",
        "/data/",
        "/",
        "/proc",
        "/proc/x",
        "/dev/shm/x",
        "/sys",
        "/workspace",
        "/workspace/sub",
        "/tmp",
        "/run/x",
        "/a b",
        "/a,b",
        "/a:b",
        "/x" * 120,
    ],
)
async def test_hostile_mount_paths_are_typed_errors(rig: Rig, path: str) -> None:
    """Relative, unnormalised, reserved and mount-option-breaking paths are ResourceInvalid
    naming spec.volumes[0].mountPath, and claim nothing."""
    await _volume(rig, "data")
    with pytest.raises(ResourceInvalid) as caught:
        await _sandbox(rig, "a", ("data", path, False))
    assert caught.value.details["field"] == "spec.volumes[0].mountPath"
    assert (await _status(rig, "data")).holders == ()


async def test_unknown_or_duplicate_volumes_are_typed_errors(rig: Rig) -> None:
    """A missing volume, the same volume twice, and nested mount paths name their field."""
    await _volume(rig, "data")
    await _volume(rig, "more")
    cases = [
        ((("nope", "/data", False),), "spec.volumes[0].name"),
        ((("data", "/a", True), ("data", "/b", True)), "spec.volumes[1].name"),
        ((("data", "/a", False), ("more", "/a/b", False)), "spec.volumes[1].mountPath"),
    ]
    for mounts, field in cases:
        with pytest.raises(ResourceInvalid) as caught:
            await _sandbox(rig, "a", *mounts)
        assert caught.value.details["field"] == field


async def test_tenants_cannot_see_delete_or_mount_each_others_volumes(rig: Rig) -> None:
    """Tenant acme's volume is invisible to tenant zeta: get, delete and mount by its name or
    its id answer like a missing volume, and zeta's list is empty."""
    with tenant("acme"):
        made = await _volume(rig, "data")
        assert made["metadata"]["name"] == "acme--data"
        await _sandbox(rig, "mine", ("data", "/data", True))
    with tenant("zeta"):
        for name in ("data", "acme--data"):
            with pytest.raises(ResourceNotFound):
                await rig.volumes.get(Ref(name=name))
            with pytest.raises(ResourceNotFound):
                await rig.volumes.delete(Ref(name=name))
        assert (await rig.volumes.list(Selection())).items == ()
        with pytest.raises(ResourceInvalid) as caught:
            await _sandbox(rig, "theirs", ("data", "/data", True))
        assert "unknown SandboxVolume" in caught.value.message
        with pytest.raises(ResourceInvalid):
            await _sandbox(rig, "theirs2", ("acme--data", "/data", True))
    assert (await _status(rig, "acme--data")).readers == ("acme--mine",)


async def test_a_runtime_without_volume_storage_refuses_volumes(rig: Rig) -> None:
    """The process runtime has no backend: creating a volume is a typed bad request."""
    with pytest.raises(BadRequest) as caught:
        await Volumes(rig.store, None).create(
            ObjectRequest(object={"metadata": {"name": "v"}, "spec": {"size": "1Gi"}})
        )
    assert isinstance(caught.value, SandpodError)


async def test_a_holder_whose_sandbox_is_gone_is_released_after_two_sweeps(rig: Rig) -> None:
    """A claim left by a create that never wrote its Sandbox (a crashed replica) is released
    by the second sweep that finds no such Sandbox, never by the first (a create in flight);
    a live Sandbox's claim is kept."""
    await _volume(rig, "data")
    await _volume(rig, "more")
    await rig.volumes.claim("default", "crashed", [VolumeMount("data", "/data")])
    await _sandbox(rig, "alive", ("more", "/more", False))
    sweeper = StaleHolders(rig.volumes)
    await sweeper.sweep("Sandbox")
    assert (await _status(rig, "data")).writer == "crashed"
    await sweeper.sweep("Sandbox")
    assert (await _status(rig, "data")).holders == ()
    assert (await _status(rig, "more")).writer == "alive"
    await _sandbox(rig, "next", ("data", "/data", False))


async def test_a_tenants_volumes_are_bounded_in_count_and_bytes(rig: Rig) -> None:
    """With quotas of 2 volumes and 3Gi: a third volume, or one that would pass 3Gi in all, is
    store.quota_exceeded naming the quota and its setting, and nothing is made; another tenant
    has its own quota; deleting a volume makes room again."""
    rig.volumes.limits = VolumeLimits(max_count=2, max_bytes=3 << 30)
    with tenant("acme"):
        await _volume(rig, "one", "1Gi")
        with pytest.raises(VolumeQuotaExceeded) as caught:
            await _volume(rig, "big", "3Gi")
        assert caught.value.details == {
            "quota": "volume_bytes",
            "limit": 3 << 30,
            "setting": "SANDPOD_VOLUME_MAX_BYTES",
        }
        await _volume(rig, "two", "2Gi")
        with pytest.raises(VolumeQuotaExceeded) as caught:
            await _volume(rig, "three", "16Mi")
        assert caught.value.details["quota"] == "volumes"
        assert ("default", "acme--three") not in rig.backend.made
    with tenant("zeta"):
        await _volume(rig, "one", "3Gi")
    with tenant("acme"):
        await rig.volumes.delete(Ref(name="two"))
        await _volume(rig, "three", "1Gi")


async def test_a_templates_volumes_are_resolved_into_the_sandbox(rig: Rig) -> None:
    """A template's volumes are mounted by its sandboxes (resolved into spec.volumes and
    claimed); a sandbox's own entry for the same mount path wins; a tenant's sandbox of the
    template gets the tenant's own volume of that name."""
    template = Resource(
        "sandpod.dev/v1alpha1",
        "SandboxTemplate",
        ObjectMeta(name="with-data"),
        {"volumes": [{"name": "data", "mountPath": "/data", "readOnly": True}]},
    )
    await rig.store.create(template)
    await _volume(rig, "data")
    await _volume(rig, "other")
    obj = {"metadata": {"name": "t1"}, "spec": {"templateRef": {"name": "with-data"}}}
    made = (await rig.api.create(ObjectRequest(object=obj))).object
    assert made["spec"]["volumes"] == [{"name": "data", "mountPath": "/data", "readOnly": True}]
    assert (await _status(rig, "data")).readers == ("t1",)
    own = [{"name": "other", "mountPath": "/data"}]
    obj = {
        "metadata": {"name": "t2"},
        "spec": {"templateRef": {"name": "with-data"}, "volumes": own},
    }
    made = (await rig.api.create(ObjectRequest(object=obj))).object
    assert [v["name"] for v in made["spec"]["volumes"]] == ["other"]
    with tenant("acme"):
        await _volume(rig, "data")
        obj = {"metadata": {"name": "t3"}, "spec": {"templateRef": {"name": "with-data"}}}
        made = (await rig.api.create(ObjectRequest(object=obj))).object
    assert made["spec"]["volumes"][0]["name"] == "acme--data"
    assert (await _status(rig, "acme--data")).readers == ("acme--t3",)


async def test_a_sandbox_written_around_the_api_is_held_to_the_same_rules(rig: Rig) -> None:
    """A Sandbox written straight to the store (kubectl, a pool) naming a volume another holds
    gets no instance: the reconciler's claim fails (store.in_use naming the holder: a failed
    create, retried with backoff, then Failed); one naming a free volume is claimed by the
    reconciler before its instance is made."""
    driver = FakeDriver()
    rec = _reconciler(rig.store, driver, ReconcilerEvents())
    await _volume(rig, "data")
    await _volume(rig, "free")
    await _sandbox(rig, "holder", ("data", "/data", False))
    for name, vol in (("sneaky", "data"), ("direct", "free")):
        spec = {"permanent": True, "volumes": [{"name": vol, "mountPath": "/v"}]}
        await rig.store.create(
            Resource("sandpod.dev/v1alpha1", "Sandbox", ObjectMeta(name=name), spec)
        )
        await rec.reconcile(name)
    assert "ensure sneaky" not in driver.calls and "ensure direct" in driver.calls
    assert (await _status(rig, "data")).writer == "holder"
    assert (await _status(rig, "free")).writer == "direct"
