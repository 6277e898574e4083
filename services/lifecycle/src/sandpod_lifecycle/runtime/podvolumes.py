"""The lifecycle API's ``VolumeBackend`` on Kubernetes: a SandboxVolume is a PVC.

``provision`` applies the volume's PersistentVolumeClaim (``sandpod_kube.volumes``: its size,
its StorageClass or the installation's ``SANDPOD_POD_VOLUME_STORAGE_CLASS``) in the volume's
namespace; ``remove`` deletes it (the PersistentVolume then follows its reclaim policy:
``Delete``, the dynamic provisioners' default, frees the disk). Sandbox Pods mount the claim
(``PodDriver``: ``SandboxPod.volumes``). Usage is not measured here (the kubelet's volume stats
are per node): ``usage`` is None.
"""

from __future__ import annotations

from sandpod_contract.volumes import SandboxVolumeSpec
from sandpod_kube import PodApi
from sandpod_kube.podspec import PodSettings
from sandpod_kube.volumes import pvc_manifest, pvc_name

__all__ = ["PvcVolumeBackend"]


class PvcVolumeBackend:
    def __init__(self, pods: PodApi, settings: PodSettings) -> None:
        self.pods = pods
        self.settings = settings

    async def provision(self, namespace: str, name: str, spec: SandboxVolumeSpec) -> None:
        manifest = pvc_manifest(
            namespace,
            name,
            spec.size,
            spec.storage_class_name or self.settings.volume_storage_class,
            self.settings.volume_access_mode,
        )
        await self.pods.apply_pvc(manifest)

    async def remove(self, namespace: str, name: str) -> None:
        await self.pods.delete_pvc(namespace, pvc_name(name))

    async def usage(self, namespace: str, name: str) -> int | None:
        return None
