"""A template build on Kubernetes: the builder Pod, rendered from typed input. Pure (no I/O).

One Pod per build (``<template>-build-<key prefix>``), owned by the SandboxTemplate (its uid in
``ownerReferences``: deleting the template deletes a build in flight), labelled
``sandpod.dev/build`` (the template) and with the installation's label, never the sandbox label
(the sandbox runtime's orphan sweep lists Pods by that one). Its one container runs Sandpod's
own builder entry point from the lifecycle's image::

    python3 -m sandpod_lifecycle.builds.podmain     (env SANDPOD_BUILD_REQUEST: the build, JSON)

which builds with the lifecycle's build code (the cache keys, the layer commit, the OCI export:
the bytes a local build makes) and pushes the image with ``sandpod_image``'s push code. Its
outcome comes back as the container's termination message (``terminationMessagePath``: a
small JSON the kubelet copies into the Pod's status), so the controller needs no log access;
a builder that dies before writing it leaves the end of its log there instead
(``FallbackToLogsOnError``).
With per-build NATS credentials (``creds_secret``: operator mode) the build's own Secret is
mounted read-only at ``CREDS_MOUNT`` with the inbox prefix its JWT allows; without, the builder
connects with the installation's URL Secret only, as sandbox Pods then do.

Privileges, and why: a ``run`` step executes the user's command on the chain built so far,
which takes an overlay mount, a private mount and pid namespace and a ``chroot``, then drops to
an unprivileged uid for the command itself (``sandpod_lifecycle.builds.podjail``). So the
container runs as root with capabilities SYS_ADMIN (mount, unshare), SYS_CHROOT, SETUID/SETGID
(drop to the build uid), CHOWN/FOWNER/DAC_OVERRIDE (copy the layer with its owners, give the
step's files to root) and MKNOD (overlay whiteouts are 0/0 device nodes); every other
capability is dropped. AppArmor's default profile forbids mount, so the container is
``Unconfined`` there; seccomp stays ``RuntimeDefault`` (it allows mount/unshare to a holder of
SYS_ADMIN). ``allowPrivilegeEscalation`` cannot be false with SYS_ADMIN (the API server refuses
it). Everything else is shut: no ServiceAccount token, no service links, a read-only root
filesystem (the build writes only to its emptyDirs), ``restartPolicy: Never`` and an
``activeDeadlineSeconds``. The template's RuntimeClass (gVisor/Kata) applies to its builds too:
the commands are the template author's code.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from sandpod_kube.podspec import (
    CREDS_EXPIRES,
    CREDS_KEY,
    CREDS_MOUNT,
    INSTALLATION_LABEL,
    MANAGED_BY,
)

__all__ = [
    "BUILD_CAPABILITIES",
    "BUILD_LABEL",
    "BuildPod",
    "BuildPodSettings",
    "build_creds_secret_manifest",
    "build_pod_manifest",
    "build_pod_name",
]

BUILD_LABEL = "sandpod.dev/build"
BUILD_DIR = "/var/lib/sandpod-build"
AUTH_MOUNT = "/var/run/sandpod/registry"
RESULT_PATH = "/dev/termination-log"
BUILD_CAPABILITIES = (
    "SYS_ADMIN",
    "SYS_CHROOT",
    "SETUID",
    "SETGID",
    "CHOWN",
    "FOWNER",
    "DAC_OVERRIDE",
    "MKNOD",
)


@dataclasses.dataclass(frozen=True, slots=True)
class BuildPodSettings:
    """How builder Pods are made (``SANDPOD_BUILD_*``, see :meth:`from_env`).

    Attributes:
        image: the builder image: ``sandpod-lifecycle`` (Sandpod's builder entry point).
        registry_secret: a ``kubernetes.io/dockerconfigjson`` Secret (key
            ``.dockerconfigjson``) in the template's namespace with the build registry's
            credentials, mounted for the push (None: push anonymously).
        deadline: seconds a build may run (``activeDeadlineSeconds``).
        work_size: size limit of the build's scratch emptyDir (layers, the exported image).
    """

    image: str = "ghcr.io/sandpod/sandpod-lifecycle:0.1.0"
    registry_secret: str | None = None
    deadline: int = 3600
    work_size: str = "20Gi"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BuildPodSettings:
        """``SANDPOD_BUILD_IMAGE``, ``_REGISTRY_SECRET``, ``_DEADLINE``, ``_WORK_SIZE``.

        Raises:
            ValueError: naming a malformed variable.
        """
        base = cls()
        deadline = env.get("SANDPOD_BUILD_DEADLINE", "").strip() or str(base.deadline)
        if not deadline.isdigit() or int(deadline) < 1:
            raise ValueError(f"SANDPOD_BUILD_DEADLINE={deadline!r}: use a number of seconds")
        return cls(
            image=env.get("SANDPOD_BUILD_IMAGE", "").strip() or base.image,
            registry_secret=env.get("SANDPOD_BUILD_REGISTRY_SECRET", "").strip() or None,
            deadline=int(deadline),
            work_size=env.get("SANDPOD_BUILD_WORK_SIZE", "").strip() or base.work_size,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class BuildPod:
    """One build of one template, in the words of the template."""

    template: str
    namespace: str
    owner_uid: str  # the SandboxTemplate's uid
    key: str  # the build's result key (names the Pod: one Pod per result)
    installation: str  # the subject prefix
    request: Mapping[str, Any]  # the builder's input (sandpod_lifecycle.builds.podmain)
    nats_secret: str = "sandpod-nats"  # noqa: S105 - a Secret's name: key ``url``
    runtime_class_name: str | None = None
    cpu: str | None = None
    memory: str | None = None
    insecure_registries: tuple[str, ...] = ()
    creds_secret: str | None = None  # the build's own NATS creds Secret (None: the URL's)
    inbox_prefix: str | None = None  # the inbox prefix its creds allow


def build_creds_secret_manifest(pod: BuildPod, creds: str, expires: int) -> dict[str, Any]:
    """The Secret of a build's NATS creds (``pod.creds_secret``), owned by the template and
    labelled like its builder Pod."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": pod.creds_secret,
            "namespace": pod.namespace,
            "labels": _labels(pod),
            "annotations": {CREDS_EXPIRES: str(expires)},
            "ownerReferences": [_owner(pod)],
        },
        "data": {CREDS_KEY: base64.b64encode(creds.encode()).decode()},
    }


def _owner(pod: BuildPod) -> dict[str, Any]:
    return {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "SandboxTemplate",
        "name": pod.template,
        "uid": pod.owner_uid,
        "controller": True,
    }


def build_pod_name(template: str, key: str) -> str:
    """``<template>-build-<12 hex of the key>`` (a template name is at most 63 characters)."""
    return f"{template}-build-{key[:12]}"


def _labels(pod: BuildPod) -> dict[str, str]:
    return {
        BUILD_LABEL: pod.template,
        INSTALLATION_LABEL: pod.installation,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": "template-build",
    }


def build_pod_manifest(pod: BuildPod, settings: BuildPodSettings) -> dict[str, Any]:
    """The builder Pod of ``pod`` (see the module docstring for what and why)."""
    limits = {k: v for k, v in (("cpu", pod.cpu), ("memory", pod.memory)) if v}
    env: list[dict[str, Any]] = [
        {"name": "SANDPOD_BUILD_REQUEST", "value": json.dumps(dict(pod.request), sort_keys=True)},
        {"name": "SANDPOD_PREFIX", "value": pod.installation},
        {
            "name": "SANDPOD_NATS_URL",
            "valueFrom": {"secretKeyRef": {"name": pod.nats_secret, "key": "url"}},
        },
        {"name": "SANDPOD_BUILD_DIR", "value": BUILD_DIR},
        {"name": "SANDPOD_BUILD_RESULT", "value": RESULT_PATH},
        {"name": "SANDPOD_INSECURE_REGISTRIES", "value": ",".join(pod.insecure_registries)},
        {"name": "HOME", "value": "/tmp"},  # noqa: S108 - the Pod's own emptyDir
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "work", "mountPath": BUILD_DIR},
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - an emptyDir
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "work", "emptyDir": {"sizeLimit": settings.work_size}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if settings.registry_secret:
        volumes.append(
            {
                "name": "registry-auth",
                "secret": {
                    "secretName": settings.registry_secret,
                    "defaultMode": 0o400,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        )
        mounts.append({"name": "registry-auth", "mountPath": AUTH_MOUNT, "readOnly": True})
        env.append({"name": "SANDPOD_BUILD_AUTH_FILE", "value": f"{AUTH_MOUNT}/config.json"})
    if pod.creds_secret:
        volumes.append(
            {
                "name": "nats-creds",
                "secret": {
                    "secretName": pod.creds_secret,
                    "defaultMode": 0o400,
                    "items": [{"key": CREDS_KEY, "path": CREDS_KEY}],
                },
            }
        )
        mounts.append({"name": "nats-creds", "mountPath": CREDS_MOUNT, "readOnly": True})
        env.append({"name": "SANDPOD_NATS_CREDS", "value": f"{CREDS_MOUNT}/{CREDS_KEY}"})
        env.append({"name": "SANDPOD_NATS_INBOX_PREFIX", "value": pod.inbox_prefix or ""})
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": settings.deadline,
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "build",
                "image": settings.image,
                "command": ["python3", "-m", "sandpod_lifecycle.builds.podmain"],
                "env": env,
                "resources": {"limits": limits, "requests": limits} if limits else {},
                "terminationMessagePath": RESULT_PATH,
                # a builder that dies before writing its result (a crash, a bad image) leaves
                # its log's last lines there instead of nothing (kube.py reads the last one)
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": {
                    "runAsUser": 0,
                    "runAsGroup": 0,
                    "runAsNonRoot": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"], "add": list(BUILD_CAPABILITIES)},
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "appArmorProfile": {"type": "Unconfined"},
                },
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if pod.runtime_class_name:
        spec["runtimeClassName"] = pod.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": build_pod_name(pod.template, pod.key),
            "namespace": pod.namespace,
            "labels": _labels(pod),
            "ownerReferences": [_owner(pod)],
        },
        "spec": spec,
    }
