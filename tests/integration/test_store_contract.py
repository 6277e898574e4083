"""The store contract suite: every Store implementation (memory, JetStream KV, Kubernetes CRDs on a
real kube-apiserver) must pass the same tests, so services can rely on one set of semantics.

Objects here are valid against schemas/crds/ (the API server enforces it, and prunes fields the
schema does not declare), so spec fields are ones the Sandbox CRD has."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import nats as nats_client
import pytest

from conftest import NatsServer
from sandpod_bus import Bus, BusSettings
from sandpod_contract.errors import (
    ResourceConflict,
    ResourceExists,
    ResourceInvalid,
    ResourceNotFound,
)
from sandpod_store import EventType, KvStore, MemoryStore, ObjectMeta, Resource, Store, WatchEvent

NAMESPACES = ("default", "other")  # every namespace the tests below write to


@pytest.fixture(params=["memory", "kv", "kube"])
async def store(request: pytest.FixtureRequest, nats: NatsServer) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "kube":
        from sandpod_kube import KubeStore, delete_all, ensure_namespace

        settings = request.getfixturevalue("kube_apiserver").settings

        def reset() -> None:  # one API server for the session: each test starts empty
            for ns in NAMESPACES:
                ensure_namespace(settings, ns)
            delete_all(settings, "Sandbox")  # in every namespace: list(ns=None) sees them all

        await asyncio.to_thread(reset)
        kube = await KubeStore.connect(settings)
        yield kube
        await kube.close()
        # and leaves it empty: a later test's lifecycle on this API server would adopt a
        # Sandbox left here (with pytest-xdist, any test may come next)
        await asyncio.to_thread(reset)
        return
    bus = await Bus.connect(BusSettings(url=nats.url))
    yield await KvStore.open(bus, bucket=f"test-{uuid.uuid4().hex[:12]}")
    await bus.close()


def sandbox(name: str, labels: dict[str, str] | None = None, ns: str = "default") -> Resource:
    return Resource(
        api_version="sandpod.dev/v1alpha1",
        kind="Sandbox",
        metadata=ObjectMeta(name=name, namespace=ns, labels=labels or {}),
        spec={"templateRef": {"name": "python"}, "idleTimeoutSeconds": 300},
        status={"phase": "Ignored"},
    )


def _with(obj: Resource, **meta: object) -> Resource:
    return dataclasses.replace(obj, metadata=dataclasses.replace(obj.metadata, **meta))  # type: ignore[arg-type]


async def test_create_stamps_identity_and_drops_status(store: Store) -> None:
    """create assigns uid, generation 1, a timestamp and a resourceVersion; status is ignored."""
    created = await store.create(sandbox("a"))
    assert created.metadata.uid and created.metadata.creation_timestamp.endswith("Z")
    assert created.metadata.generation == 1 and created.metadata.resource_version
    assert created.status == {}
    assert await store.get("Sandbox", "default", "a") == created


async def test_create_twice_is_already_exists(store: Store) -> None:
    """A second create of the same name fails with ResourceExists."""
    await store.create(sandbox("a"))
    with pytest.raises(ResourceExists):
        await store.create(sandbox("a"))


@pytest.mark.parametrize(
    "bad",
    [
        sandbox("Bad_Name"),
        sandbox("a" * 64),
        sandbox("ok", ns="Bad NS"),
        sandbox("ok", labels={"bad key!": "x"}),
        sandbox("ok", labels={"k": "bad value!"}),
        dataclasses.replace(sandbox("ok"), kind="not-a-kind"),
    ],
)
async def test_invalid_objects_are_refused(store: Store, bad: Resource) -> None:
    """Names, namespaces, labels and kinds are validated before anything is stored."""
    with pytest.raises(ResourceInvalid):
        await store.create(bad)


async def test_missing_is_not_found(store: Store) -> None:
    """get/update/delete of a missing object raise ResourceNotFound."""
    with pytest.raises(ResourceNotFound):
        await store.get("Sandbox", "default", "nope")
    with pytest.raises(ResourceNotFound):
        await store.update(sandbox("nope"))
    with pytest.raises(ResourceNotFound):
        await store.delete("Sandbox", "default", "nope")


async def test_update_is_optimistic_and_generation_tracks_spec(store: Store) -> None:
    """Stale resourceVersion conflicts; generation grows only on spec changes; status stays."""
    v1 = await store.create(sandbox("a"))
    v1s = await store.update_status(dataclasses.replace(v1, status={"phase": "Running"}))
    assert v1s.metadata.generation == 1 and v1s.status == {"phase": "Running"}
    with pytest.raises(ResourceConflict) as info:
        await store.update(_with(v1, labels={"x": "1"}))  # v1 is stale now
    assert info.value.retryable
    v2 = await store.update(_with(v1s, labels={"x": "1"}))
    assert v2.metadata.generation == 1 and v2.metadata.labels == {"x": "1"}
    assert v2.status == {"phase": "Running"}
    v3 = await store.update(dataclasses.replace(v2, spec={**v2.spec, "idleTimeoutSeconds": 5}))
    assert v3.metadata.generation == 2 and v3.spec["idleTimeoutSeconds"] == 5
    assert int(v3.metadata.resource_version) > int(v2.metadata.resource_version)


async def test_status_update_touches_only_status(store: Store) -> None:
    """update_status ignores spec changes and conflicts on a stale version."""
    v1 = await store.create(sandbox("a"))
    v2 = await store.update_status(
        dataclasses.replace(
            v1, spec={"templateRef": {"name": "hacked"}}, status={"phase": "Pending"}
        )
    )
    assert v2.spec == v1.spec and v2.status == {"phase": "Pending"}
    with pytest.raises(ResourceConflict):
        await store.update_status(dataclasses.replace(v1, status={"phase": "Failed"}))


async def test_concurrent_read_modify_write_loses_nothing(store: Store) -> None:
    """20 writers each increment a counter with retry-on-conflict: the result is exactly 20."""
    await store.create(dataclasses.replace(sandbox("counter"), spec={"idleTimeoutSeconds": 0}))

    async def increment() -> None:  # the counter is a schema field: the API server prunes others
        while True:
            cur = await store.get("Sandbox", "default", "counter")
            spec = {**cur.spec, "idleTimeoutSeconds": int(cur.spec["idleTimeoutSeconds"]) + 1}
            try:
                await store.update(dataclasses.replace(cur, spec=spec))
                return
            except ResourceConflict:
                continue

    await asyncio.gather(*(increment() for _ in range(20)))
    final = await store.get("Sandbox", "default", "counter")
    assert final.spec["idleTimeoutSeconds"] == 20 and final.metadata.generation == 21


async def test_delete_with_version_guard(store: Store) -> None:
    """delete honours a resourceVersion precondition and then the object is gone."""
    v1 = await store.create(sandbox("a"))
    v2 = await store.update(_with(v1, labels={"a": "b"}))
    with pytest.raises(ResourceConflict):
        await store.delete("Sandbox", "default", "a", resource_version=v1.metadata.resource_version)
    await store.delete("Sandbox", "default", "a", resource_version=v2.metadata.resource_version)
    with pytest.raises(ResourceNotFound):
        await store.get("Sandbox", "default", "a")
    await store.create(sandbox("a"))  # the name is free again


async def test_list_filters_by_namespace_and_label_selector(store: Store) -> None:
    """Equality, inequality, set-based and existence selectors, per namespace or all."""
    await store.create(sandbox("a", {"app": "web", "tier": "front"}))
    await store.create(sandbox("b", {"app": "web", "tier": "back"}))
    await store.create(sandbox("c", {"app": "db"}))
    await store.create(sandbox("d", {"app": "web"}, ns="other"))

    async def names(selector: str | None = None, ns: str | None = "default") -> list[str]:
        items, _ = await store.list("Sandbox", ns, selector)
        return sorted(i.metadata.name for i in items)

    assert await names() == ["a", "b", "c"]
    assert await names(ns=None) == ["a", "b", "c", "d"]
    assert await names("app=web") == ["a", "b"]
    assert await names("app=web,tier!=back") == ["a"]
    assert await names("tier in (front,back)") == ["a", "b"]
    assert await names("app notin (web)") == ["c"]
    assert await names("tier") == ["a", "b"]
    assert await names("!tier") == ["c"]
    with pytest.raises(ResourceInvalid):
        await names("bad key!=x")


async def test_watch_from_a_list_revision_sees_every_later_change(store: Store) -> None:
    """list gives a revision; watch from it yields later ADDED/MODIFIED/DELETED in order."""
    await store.create(sandbox("before"))
    _, revision = await store.list("Sandbox")
    events: list[WatchEvent] = []

    async def collect() -> None:
        async for event in store.watch("Sandbox", None, revision):
            events.append(event)
            if event.type is EventType.DELETED:
                return

    watcher = asyncio.create_task(collect())
    created = await store.create(sandbox("after"))
    await store.update(_with(created, labels={"v": "2"}))
    await store.delete("Sandbox", "default", "after")
    await asyncio.wait_for(watcher, 10)
    assert [(e.type, e.name) for e in events] == [
        (EventType.ADDED, "after"),
        (EventType.MODIFIED, "after"),
        (EventType.DELETED, "after"),
    ]
    assert [e.revision for e in events] == sorted(e.revision for e in events)
    assert events[1].resource is not None and events[1].resource.metadata.labels == {"v": "2"}


async def test_watch_of_one_name_sees_only_that_objects_changes(store: Store) -> None:
    """watch(name=...) yields the named object's changes, none of its neighbours'."""
    _, revision = await store.list("Sandbox")
    events: list[WatchEvent] = []

    async def collect() -> None:
        async for event in store.watch("Sandbox", "default", revision, name="mine"):
            events.append(event)
            if event.type is EventType.DELETED:
                return

    watcher = asyncio.create_task(collect())
    await store.create(sandbox("other"))
    mine = await store.create(sandbox("mine"))
    await store.update(_with(await store.get("Sandbox", "default", "other"), labels={"v": "2"}))
    await store.update(_with(mine, labels={"v": "2"}))
    await store.delete("Sandbox", "default", "other")
    await store.delete("Sandbox", "default", "mine")
    await asyncio.wait_for(watcher, 10)
    assert [(e.type, e.name) for e in events] == [
        (EventType.ADDED, "mine"),
        (EventType.MODIFIED, "mine"),
        (EventType.DELETED, "mine"),
    ]


async def test_kv_a_closed_watch_leaves_no_consumer_behind(nats: NatsServer) -> None:
    """KV: each watch is a JetStream consumer and the server caps a stream's consumers (1000):
    a closed watch's consumer is removed within seconds (not a minute), so waits at a high rate
    do not pile up to the cap."""
    bus = await Bus.connect(BusSettings(url=nats.url))
    nc = await nats_client.connect(nats.url)  # the test's own look at the stream
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    try:
        kv = await KvStore.open(bus, bucket=bucket)
        for i in range(3):
            watch = cast(
                "AsyncGenerator[WatchEvent, None]", kv.watch("Sandbox", "default", 0, name=f"s{i}")
            )
            waiting = asyncio.ensure_future(anext(watch))
            await kv.create(sandbox(f"s{i}"))
            assert (await asyncio.wait_for(waiting, 10)).name == f"s{i}"
            await watch.aclose()
        js = nc.jetstream()
        async with asyncio.timeout(30):  # the old threshold (60 s) fails here
            while (await js.stream_info(f"KV_{bucket}")).state.consumer_count:
                await asyncio.sleep(0.2)
    finally:
        await nc.close()
        await bus.close()


async def test_kv_update_at_a_known_revision_skips_the_read_and_still_detects_conflicts(
    nats: NatsServer,
) -> None:
    """KV: an update carrying the resourceVersion the store last saw needs no read; a second
    writer holding the same (now old) version still gets ResourceConflict, and generation and
    status merge as if it had read."""
    bus = await Bus.connect(BusSettings(url=nats.url))
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    try:
        kv = await KvStore.open(bus, bucket=bucket)
        created = await kv.create(sandbox("a"))
        with_status = await kv.update_status(dataclasses.replace(created, status={"phase": "X"}))
        saved = kv.reads_saved
        spec = {**with_status.spec, "idleTimeoutSeconds": 7}
        first = await kv.update(dataclasses.replace(with_status, spec=spec))
        assert kv.reads_saved == saved + 1
        assert first.metadata.generation == 2 and first.status == {"phase": "X"}
        with pytest.raises(ResourceConflict):
            await kv.update(dataclasses.replace(with_status, spec={**spec, "permanent": True}))
        other = await KvStore.open(bus, bucket=bucket)  # another replica: nothing remembered
        assert (await other.get("Sandbox", "default", "a")) == first
    finally:
        await bus.close()
