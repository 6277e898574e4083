"""KubeStore behaviour beyond the shared contract: what only a real API server can show."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncGenerator
from typing import cast

from k8s.envtest import ControlPlane
from sandpod_kube import KubeStore
from sandpod_store import EventType, ObjectMeta, Resource, WatchEvent


def sandbox(name: str, namespace: str) -> Resource:
    return Resource(
        api_version="sandpod.dev/v1alpha1",
        kind="Sandbox",
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec={"templateRef": {"name": "python"}},
    )


async def test_watch_outlives_the_api_servers_watch_timeout(
    kube_apiserver: ControlPlane, namespace: str
) -> None:
    """With 1 s server-side watches, the watch re-opens from its last revision: no gap or repeat."""
    store = await KubeStore.connect(dataclasses.replace(kube_apiserver.settings, watch_timeout=1))
    loop = asyncio.get_running_loop()
    try:
        _, revision = await store.list("Sandbox", namespace)
        # KubeStore.watch is an async generator (typed as the Store protocol's AsyncIterator)
        watch = cast(
            "AsyncGenerator[WatchEvent, None]", store.watch("Sandbox", namespace, revision)
        )
        async with contextlib.aclosing(watch) as events:
            seen: list[str] = []
            deadline = loop.time() + 3.5  # spans three server-side timeouts
            while loop.time() < deadline:
                created = await store.create(sandbox(f"s{len(seen)}", namespace))
                event = await asyncio.wait_for(anext(events), 10)
                assert (event.type, event.name) == (EventType.ADDED, created.metadata.name)
                assert event.revision == int(created.metadata.resource_version)
                seen.append(event.name)
                await asyncio.sleep(0.25)  # pacing: spread the writes over the timeouts
        assert len(seen) >= 10
    finally:
        await store.close()


async def test_update_without_resource_version_is_last_writer_wins(
    kube: KubeStore, namespace: str
) -> None:
    """An update that names no resourceVersion is applied to whatever is stored (no conflict)."""
    v1 = await kube.create(sandbox("s", namespace))
    await kube.update(dataclasses.replace(v1, spec={**v1.spec, "idleTimeoutSeconds": 1}))
    blind = dataclasses.replace(
        v1,
        metadata=dataclasses.replace(v1.metadata, resource_version="", labels={"a": "b"}),
        spec={**v1.spec, "idleTimeoutSeconds": 2},
    )
    v3 = await kube.update(blind)
    assert v3.spec["idleTimeoutSeconds"] == 2 and v3.metadata.labels == {"a": "b"}
    assert v3.metadata.generation == 3


async def test_close_stops_open_watches(kube_apiserver: ControlPlane, namespace: str) -> None:
    """close() ends every watch still open, so no reader thread outlives the store."""
    store = await KubeStore.connect(kube_apiserver.settings)
    events = store.watch("Sandbox", namespace)
    pending = asyncio.ensure_future(anext(events))
    created = await store.create(sandbox("s", namespace))
    first = await asyncio.wait_for(pending, 10)
    assert first.name == created.metadata.name
    await store.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("sandpod-kube-watch")]
    await events.aclose()  # type: ignore[attr-defined]  # an async generator
