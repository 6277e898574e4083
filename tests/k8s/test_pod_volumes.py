"""SandboxVolumes in Kubernetes mode: a PVC per volume on a real kube-apiserver, mounted by
the sandbox Pods the ``kubernetes`` runtime makes (the fake kubelet runs their execd).

The lifecycle service runs with ``SANDPOD_POD_VOLUME_STORAGE_CLASS``; the test reads the PVC
and the Pod back from the API server, checks the exclusivity answers, and that deleting the
volume deletes its claim.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s.cluster import NS, Cluster
from sandpod import AsyncSandbox, AsyncVolumes
from sandpod.errors import VolumeInUse
from sandpod_kube import KubeSettings


def _pvc(settings: KubeSettings, name: str) -> Any:
    with settings.api_client() as api_client:
        try:
            return client.CoreV1Api(api_client).read_namespaced_persistent_volume_claim(name, NS)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


async def test_a_volume_is_a_pvc_mounted_by_its_sandbox_pod(cluster: Cluster) -> None:
    """volumes.create makes PVC sandpod-vol-<name> (size, the installation's StorageClass, or
    the volume's own); a Sandbox mounting it read-write gets the claim in its Pod at the mount
    path; a second read-write mount is refused naming the holder; once the sandbox is gone,
    a read-only mount has readOnly claim and mount; deleting the volume deletes its claim."""
    vol, own = f"kv-{uuid.uuid4().hex[:6]}", f"kw-{uuid.uuid4().hex[:6]}"
    cluster.service(
        "sandpod_lifecycle",
        SANDPOD_RUNTIME="kubernetes",
        SANDPOD_RESYNC="0.5",
        SANDPOD_READY_TIMEOUT="30",
        SANDPOD_POD_NATS_CIDRS="127.0.0.1/32",
        SANDPOD_POD_VOLUME_STORAGE_CLASS="fast-ssd",
    )
    await cluster.answering()
    settings = cluster.plane.settings
    conn: dict[str, Any] = {"nats_url": cluster.nats.url, "prefix": cluster.prefix}
    volumes = await AsyncVolumes.connect(namespace=NS, **conn)
    try:
        await volumes.create(vol, size="2Gi")
        await volumes.create(own, size="1Gi", storage_class="slow-hdd")
        pvc = await asyncio.to_thread(_pvc, settings, f"sandpod-vol-{vol}")
        assert pvc is not None
        assert pvc.spec.resources.requests == {"storage": "2Gi"}
        assert pvc.spec.storage_class_name == "fast-ssd"
        assert pvc.spec.access_modes == ["ReadWriteOnce"]
        other = await asyncio.to_thread(_pvc, settings, f"sandpod-vol-{own}")
        assert other.spec.storage_class_name == "slow-hdd"

        writer = await AsyncSandbox.create(volumes=[f"{vol}:/data"], **conn)
        async with writer:
            pod = cluster.kubelet.seen[writer.id]
            claims = {v["name"]: v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
            # the API server leaves out readOnly: false
            assert [c["persistentVolumeClaim"] for c in claims.values()] == [
                {"claimName": f"sandpod-vol-{vol}"}
            ]
            mounts = pod["spec"]["containers"][0]["volumeMounts"]
            assert {"name": next(iter(claims)), "mountPath": "/data"} in mounts
            with pytest.raises(VolumeInUse) as held:
                await AsyncSandbox.create(volumes=[f"{vol}:/data"], **conn)
            assert held.value.details["holders"] == writer.id
            with pytest.raises(VolumeInUse):
                await volumes.delete(vol)
            await writer.kill()

        reader = await AsyncSandbox.create(volumes=[f"{vol}:/ro:ro"], **conn)
        async with reader:
            pod = cluster.kubelet.seen[reader.id]
            claim = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
            assert claim["persistentVolumeClaim"]["readOnly"] is True
            mount = next(
                m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/ro"
            )
            assert mount["readOnly"] is True
            await reader.kill()

        for name in (vol, own):
            await volumes.delete(name)
            pvc = await asyncio.to_thread(_pvc, settings, f"sandpod-vol-{name}")
            # Gone, or held only by the pvc-protection finalizer (no controller-manager here).
            assert pvc is None or pvc.metadata.deletion_timestamp is not None
    finally:
        await volumes.close()
