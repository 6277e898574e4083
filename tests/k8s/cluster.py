"""A Kubernetes-mode installation for tests: lifecycle/pool processes on the real API server,
the fake kubelet, and a store client, on a private subject prefix in the ``default`` namespace
(the SDK creates there). :meth:`Cluster.cleanup` deletes every object and Pod it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from conftest import NatsServer
from k8s.envtest import ControlPlane
from k8s.kubelet import FakeKubelet
from sandpod import AsyncSandbox
from sandpod.errors import SandboxError
from sandpod_kube import KubeSettings, KubeStore, PodApi, delete_all
from sandpod_kube.podspec import INSTALLATION_LABEL
from sandpod_store import Resource
from svcprocs import ServiceProc

__all__ = ["LEASE_DURATION", "NS", "Cluster", "cluster_setup", "kube_env", "ready"]

NS = "default"
LEASE_DURATION = 3  # seconds: a SIGKILLed leader is replaced after about this long
LEADER_ENV = {
    "SANDPOD_LEADER_LEASE_DURATION": str(LEASE_DURATION),
    "SANDPOD_LEADER_RENEW_DEADLINE": "2",
    "SANDPOD_LEADER_RETRY_PERIOD": "0.25",
}
KINDS = ("SandboxClaim", "SandboxWarmPool", "Sandbox", "SandboxTemplate")


def kube_env(plane: ControlPlane) -> dict[str, str]:
    """The services' settings for the test API server (admin client certificate), with a short
    leader-election Lease (in ``default``, named after the test's prefix)."""
    cert, key = plane.admin_cert
    return {
        "SANDPOD_STORE": "kube",
        "SANDPOD_KUBE_SERVER": plane.url,
        "SANDPOD_KUBE_CA_FILE": str(plane.ca_file),
        "SANDPOD_KUBE_CLIENT_CERT": str(cert),
        "SANDPOD_KUBE_CLIENT_KEY": str(key),
        "SANDPOD_KUBE_NAMESPACE": NS,
        **LEADER_ENV,
    }


def _ensure(create: Callable[[], object]) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


def cluster_setup(settings: KubeSettings, nats_url: str) -> None:
    """The NATS Secret execd reads its URL from, a RuntimeClass for templates to name, and the
    namespace's ``default`` ServiceAccount (the ServiceAccount admission plugin refuses Pods
    without it; kube-controller-manager, absent here, creates it in a real cluster)."""
    with settings.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        secret = client.V1Secret(
            metadata=client.V1ObjectMeta(name="sandpod-nats"), string_data={"url": nats_url}
        )
        try:
            core.create_namespaced_secret(NS, secret)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_secret("sandpod-nats", NS, secret)
        _ensure(
            lambda: core.create_namespaced_service_account(
                NS, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
            )
        )
        node = client.NodeV1Api(api_client)
        _ensure(
            lambda: node.create_runtime_class(
                client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="gvisor"), handler="runsc")
            )
        )


class Cluster:
    """Services on a private prefix over the API server, the fake kubelet, and a store client."""

    def __init__(self, plane: ControlPlane, nats: NatsServer, state: Path) -> None:
        self.plane, self.nats, self.state = plane, nats, state
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.procs: list[ServiceProc] = []
        self.kubelet = FakeKubelet(plane.settings, NS, state)
        self.store: KubeStore
        # module -> how its service authenticates (default: the admin client certificate)
        self.credentials: dict[str, dict[str, str]] = {}

    def service(self, module: str, replica: str | None = None, **extra: str) -> ServiceProc:
        """Start a replica of ``module`` (``<service>0`` unless named: its lease identity)."""
        env = {**kube_env(self.plane), **self.credentials.get(module, {}), **extra}
        replica = replica or f"{module[8:]}0"
        proc = ServiceProc(module, self.nats, self.state, self.prefix, replica, wrap=(), **env)
        self.procs.append(proc)
        return proc

    async def answering(self, timeout: float = 90) -> None:
        """Until the lifecycle API answers (the service starts concurrently with the test); a
        service that exits, or one still silent after ``timeout``, fails with its log."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await AsyncSandbox.list(nats_url=self.nats.url, prefix=self.prefix)
                return
            except SandboxError:  # no responders yet
                pass
            if dead := [why for p in self.procs if (why := p.exited())]:
                pytest.fail("\n".join(dead))
            if asyncio.get_running_loop().time() > deadline:
                tails = "\n".join(f"{p.module} ({p.replica}):\n{p.tail()}" for p in self.procs)
                pytest.fail(f"no lifecycle API answers after {timeout:.0f} s:\n{tails}")
            await asyncio.sleep(0.05)

    async def create(
        self, template: str | None = None, *, wait: float = 300, **options: Any
    ) -> AsyncSandbox:
        """A sandbox of ``template`` through the SDK on this installation's bus and prefix."""
        return await AsyncSandbox.create(
            template, wait=wait, nats_url=self.nats.url, prefix=self.prefix, **options
        )

    async def pod_uids(self, name: str) -> list[str]:
        """Uids of the sandbox's Pods that are not being deleted (the kubelet confirms that)."""
        pods = PodApi(self.plane.settings)
        try:
            found = await pods.list(f"{INSTALLATION_LABEL}={self.prefix}", NS)
            return [p.uid for p in found if p.name == name and not p.deleting]
        finally:
            await pods.close()

    async def until(
        self, kind: str, name: str, done: Callable[[Resource | None], bool], timeout: float = 60
    ) -> Resource | None:
        """Watch ``kind/name`` until ``done(obj)`` (None: absent); fail after ``timeout``."""
        items, revision = await self.store.list(kind, NS)
        current = next((o for o in items if o.metadata.name == name), None)
        if done(current):
            return current
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                async for event in self.store.watch(kind, NS, revision):
                    if event.name == name:
                        current = event.resource
                        if done(current):
                            return current
        logs = "\n".join(f"--- {p.replica}\n{p.tail(20)}" for p in self.procs)
        pytest.fail(f"{kind} {name} never reached the state waited for; last: {current}\n{logs}")

    async def cleanup(self) -> None:
        for proc in self.procs:
            proc.stop()
        await asyncio.to_thread(delete_all, self.plane.settings, "SandboxClaim", [NS])
        for kind in KINDS:
            await asyncio.to_thread(delete_all, self.plane.settings, kind, [NS])
        pods = PodApi(self.plane.settings)
        try:
            for pod in await pods.list(f"{INSTALLATION_LABEL}={self.prefix}", NS):
                await pods.delete(NS, pod.name, 0)
        finally:
            await pods.close()


def ready(obj: Resource | None) -> bool:
    conditions = (obj.status.get("conditions") or []) if obj is not None else []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
