"""Fixtures for tests on the real API server: a connected KubeStore and a fresh namespace each."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

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
