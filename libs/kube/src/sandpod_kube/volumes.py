"""SandboxVolumes on Kubernetes: one PersistentVolumeClaim per volume, mounted by sandbox Pods.

Pure rendering (no I/O): :func:`pvc_manifest` is the claim the lifecycle applies on
``volumes.create`` (``PodApi.apply_pvc``) and deletes on ``volumes.delete``; its request is the
volume's ``spec.size`` and its class the volume's ``storageClassName``, else the installation's
(``PodSettings.volume_storage_class``), else the cluster's default. :func:`mount_volumes` adds a
``persistentVolumeClaim`` volume (``readOnly`` for readers) and a mount to the sandbox
container of a Pod manifest. The Pod's ``fsGroup`` (its ``run_as_user``) makes the claim
writable by the sandbox's uid, the same in every sandbox Pod, so data outlives the writer.
Exclusivity (one writer, or readers) is the lifecycle API's, in the volume's status.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PVC_PREFIX", "mount_volumes", "pvc_manifest", "pvc_name"]

PVC_PREFIX = "sandpod-vol-"
VOLUME_LABEL = "sandpod.dev/volume"


def pvc_name(volume: str) -> str:
    """The PVC of SandboxVolume ``volume`` (a DNS label: the result fits 253 characters)."""
    return PVC_PREFIX + volume


def pvc_manifest(
    namespace: str,
    volume: str,
    size: str,
    storage_class: str | None,
    access_mode: str = "ReadWriteOnce",
) -> dict[str, Any]:
    """The PersistentVolumeClaim of a volume of ``size`` (a quantity)."""
    spec: dict[str, Any] = {
        "accessModes": [access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name(volume),
            "namespace": namespace,
            "labels": {VOLUME_LABEL: volume, "app.kubernetes.io/managed-by": "sandpod-lifecycle"},
        },
        "spec": spec,
    }


def mount_volumes(spec: dict[str, Any], volumes: Sequence[tuple[str, str, bool]]) -> None:
    """Mount each ``(volume, mount path, read-only)`` in the Pod ``spec``'s sandbox container."""
    main = spec["containers"][0]
    for i, (volume, path, read_only) in enumerate(volumes):
        name = f"volume-{i}"
        spec["volumes"].append(
            {
                "name": name,
                "persistentVolumeClaim": {"claimName": pvc_name(volume), "readOnly": read_only},
            }
        )
        main["volumeMounts"].append({"name": name, "mountPath": path, "readOnly": read_only})
