"""Fixtures for tests on the real API server: a connected KubeStore, a fresh namespace each, and
a Kubernetes-mode installation (``cluster``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conftest import NatsServer
from k8s.cluster import Cluster, cluster_setup
from k8s.envtest import ControlPlane
from sandpod_kube import KubeStore, ensure_namespace


@pytest.fixture
async def namespace(kube_apiserver: ControlPlane) -> str:
    """A namespace of this test's own (no controller-manager here to delete it: it stays)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await asyncio.to_thread(ensure_namespace, kube_apiserver.settings, name)
    return name


@pytest.fixture
async def kube(kube_apiserver: ControlPlane) -> AsyncIterator[KubeStore]:
    """A KubeStore with the admin credential."""
    store = await KubeStore.connect(kube_apiserver.settings)
    yield store
    await store.close()


@pytest.fixture
async def cluster(
    kube_apiserver: ControlPlane, kube: KubeStore, nats: NatsServer, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """A Kubernetes-mode installation (k8s/cluster.py) with its fake kubelet running; the test
    starts the services it needs (``cluster.service``). Everything is deleted afterwards."""
    await asyncio.to_thread(cluster_setup, kube_apiserver.settings, nats.url)
    c = Cluster(kube_apiserver, nats, tmp_path)
    c.store = kube
    async with c.kubelet:
        try:
            yield c
        finally:
            await c.cleanup()
