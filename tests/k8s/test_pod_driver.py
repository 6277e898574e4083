"""The ``kubernetes`` runtime driver on the real API server, without the services around it:
how ensure/inspect/list/destroy map onto Pods, with the fake kubelet making Pods Ready."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import client

from k8s.envtest import ControlPlane
from k8s.kubelet import FakeKubelet
from sandpod_contract.resources import SandboxSpec, SandboxTemplateSpec
from sandpod_kube import PodApi
from sandpod_kube.podspec import PodSettings
from sandpod_lifecycle.driver import Owner
from sandpod_lifecycle.runtime.base import RuntimeFailure
from sandpod_lifecycle.runtime.pod import PodDriver


def _service_account(plane: ControlPlane, namespace: str) -> None:
    """The namespace's default ServiceAccount (kube-controller-manager's job, absent here)."""
    with plane.settings.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        )


@pytest.fixture
async def pods(kube_apiserver: ControlPlane, namespace: str) -> AsyncIterator[PodApi]:
    await asyncio.to_thread(_service_account, kube_apiserver, namespace)
    api = PodApi(kube_apiserver.settings)
    yield api
    await api.close()


async def test_the_pod_driver_maps_instances_onto_pods_of_its_installation(
    kube_apiserver: ControlPlane, namespace: str, pods: PodApi, tmp_path: Path
) -> None:
    """ensure makes a Ready Pod (replacing one left by an older Sandbox of the same name),
    inspect/list see only this installation's live Pods, destroy deletes them."""
    installation = f"i{uuid.uuid4().hex[:6]}"
    driver = PodDriver(
        pods, PodSettings(), installation=installation, ready_timeout=30, namespace=namespace
    )
    other = PodDriver(
        pods, PodSettings(), installation="someone-else", ready_timeout=30, namespace=namespace
    )
    spec, template = SandboxSpec(), SandboxTemplateSpec()
    kubelet = FakeKubelet(kube_apiserver.settings, namespace, tmp_path)
    kubelet.run_execd = False  # Pods only: execd is the services' concern (test_pod_runtime)
    async with kubelet:
        with pytest.raises(RuntimeFailure, match="uid"):
            await driver.ensure("s1", spec, template)  # no owner: a Pod needs one
        await other.ensure("s0", spec, template, Owner(namespace, "uid-0"))
        old = await driver.ensure("s1", spec, template, Owner(namespace, "uid-old"))
        assert old.running and await driver.list() == ["s1"]
        # The Sandbox was deleted and made again under the same name: a new owner uid.
        new = await driver.ensure("s1", spec, template, Owner(namespace, "uid-new"))
        assert new.running
        (pod,) = await pods.list(f"sandpod.dev/sandbox=s1,sandpod.dev/installation={installation}")
        assert pod.owner_uid == "uid-new" and pod.ready
        assert await driver.inspect("s0") is None  # another installation's Pod
        assert await driver.inspect("s1") is not None
        await driver.destroy("s1")
        await kubelet.until("s1 deleted", lambda: "s1" not in kubelet.seen)
        assert await driver.inspect("s1") is None and await driver.list() == []
        assert await other.list() == ["s0"]
        await other.destroy("s0")
