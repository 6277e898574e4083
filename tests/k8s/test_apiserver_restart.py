"""The Kubernetes store survives an API server restart: a watch carries on, calls work again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from conftest import free_port
from k8s.envtest import REPO, ControlPlane, missing_binaries
from sandpod_contract.errors import ResourceExpired
from sandpod_kube import KubeStore, apply_crds, ensure_namespace
from sandpod_pool.cache import Mirror
from sandpod_store import ObjectMeta, Resource


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of this test's own (it restarts the API server)."""
    if problem := missing_binaries():
        pytest.fail(problem)
    cp = ControlPlane(tmp_path, (free_port(), free_port(), free_port()))
    try:
        cp.start()
        manifests = [
            yaml.safe_load(p.read_text())
            for p in sorted((REPO / "schemas" / "crds").glob("*.yaml"))
        ]
        apply_crds(cp.settings, manifests)
        ensure_namespace(cp.settings, "restart")
        yield cp
    finally:
        cp.stop()


@pytest.fixture
async def store(plane: ControlPlane) -> AsyncIterator[KubeStore]:
    s = await KubeStore.connect(plane.settings)
    yield s
    await s.close()


async def _drain(events: AsyncIterator[object]) -> None:
    """Read until the watch ends with an error (events from before the restart may come first)."""
    while True:
        await asyncio.wait_for(anext(events), 60)


def _sandbox(name: str) -> Resource:
    return Resource(
        "sandpod.dev/v1alpha1",
        "Sandbox",
        ObjectMeta(name=name, namespace="restart"),
        spec={"permanent": True},
    )


async def test_list_watch_consumers_survive_an_api_server_restart(
    plane: ControlPlane, store: KubeStore
) -> None:
    """A raw watch resumed across the restart gets ResourceExpired (the new API server's watch
    cache starts after it: 410), never a silent gap; a list+watch consumer (the pool service's
    mirror) re-lists and sees objects written after the restart; reads work again."""
    _, revision = await store.list("Sandbox", "restart")
    events = store.watch("Sandbox", "restart", revision)
    mirror = Mirror(store, "Sandbox")
    follow = asyncio.create_task(mirror.run())
    try:
        await store.create(_sandbox("before"))
        assert (await asyncio.wait_for(anext(events), 30)).name == "before"
        await asyncio.to_thread(plane.restart_apiserver)
        await store.create(_sandbox("after"))
        with pytest.raises(ResourceExpired):
            await _drain(events)
        seen = await mirror.wait_for("restart", "after", lambda o: o is not None, 60)
        assert seen is not None and mirror.get("restart", "before") is not None
        assert (await store.get("Sandbox", "restart", "before")).metadata.name == "before"
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        await events.aclose()  # type: ignore[attr-defined]
