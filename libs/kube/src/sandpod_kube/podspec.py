"""What a sandbox is on Kubernetes: the Pod and the per-template NetworkPolicy, rendered as
manifests from typed input. Pure (no I/O, no ``kubernetes`` import); :mod:`sandpod_kube.pods`
sends them.

How execd gets into an arbitrary image (the template's ``image`` knows nothing about Sandpod):

    initContainer "execd-install"  image: sandpod-execd (PodSettings.execd_image)
        cp -a /sandpod-bundle/. /opt/sandpod/                   -> emptyDir "sandpod"
    container "sandbox"            image: the template's image
        /opt/sandpod/python/bin/python3 -m sandpod_execd        (emptyDir mounted read-only)
        PYTHONPATH=/opt/sandpod/site

The bundle (``deploy/images/execd.Dockerfile``, built by ``deploy/images/build-execd-bundle.sh``)
is self-contained and relocatable: a standalone CPython (python-build-standalone, via uv) plus
``sandpod-execd`` and its locked dependencies, in a busybox image whose ``cp`` does the copy. The
interpreter is started directly rather than through the bundle's ``/bin/sh`` launcher, so images
without a shell work too; it needs glibc >= 2.17 (musl images such as Alpine do not run it). The
bundle is built once per release, never per template; the emptyDir lives as long as the Pod.

Hardening, on every container: ``runAsNonRoot`` with a numeric uid (images whose USER is root
still start, as that uid), ``allowPrivilegeEscalation: false``, every capability dropped, the
RuntimeDefault seccomp profile; on the Pod: no ServiceAccount token, no service links, the
template's RuntimeClass (gVisor/Kata) when it names one. NATS is reached with the URL from the
installation's Secret (``PodSettings.nats_secret``, key ``url``), via env.

NATS credentials, per sandbox (``SandboxPod.creds_secret`` set; the lifecycle's Pod runtime mints
them when it has the account seed): the Sandbox's own Secret (``creds_secret_manifest``: key
``nats.creds``, owned by the Sandbox like the Pod) is mounted read-only at ``CREDS_MOUNT`` (a
directory, never ``subPath``, so the kubelet's updates of a renewed Secret reach the file), mode
0400 (the kubelet adds group read for the Pod's fsGroup: 0440, root and the sandbox's gid), and
``SANDPOD_NATS_CREDS`` points execd at it. Its user JWT allows only the sandbox's own
subjects (``sandpod_bus.natsauth.sandbox_permissions``). Without ``creds_secret`` every Pod
shares whatever the URL Secret carries (the old, shared mode; lifecycle says so loudly).
Trade-off: the sandbox's code runs as the same uid as execd, so it can read the file. What it
gets is the sandbox's own credential, which reaches nothing it could not already reach through
execd; keeping it from the code too needs execd under another uid (a later change).

Network: one NetworkPolicy per template selects that template's Pods (rendered from the
template's ``spec.network`` by :mod:`sandpod_kube.netpolicy`): no ingress at all (execd dials
out to NATS; nothing dials in); egress to NATS always, and what the policy allows. The NATS rule
names its destination (the NATS pods' namespace and labels, and/or CIDRs): a rule with
a port and no destination would open that port to every address. With neither configured the
rule is left out and ``nats_pinned`` is False: the installation's own policy must allow NATS
(the Helm chart's ``sandbox-allow-nats`` does; policies are additive).

The network guard (``PodSettings.netguard``, off by default: it needs what not every cluster
allows -- a container with CAP_NET_ADMIN, which Pod Security "baseline" and "restricted" refuse,
nftables in the Pod's kernel, which gVisor does not offer, and native sidecars, Kubernetes
>= 1.29) adds what a NetworkPolicy cannot say: DNS names, a sandbox's own policy, deny rules
with ports, connection limits. The Pod then gets:

    initContainer "netguard"  image: PodSettings.guard_image (the lifecycle image)
        python -m sandpod_lifecycle.network.podguard, restartPolicy: Always (a native sidecar:
        it runs as long as the Pod) with a startup probe on its ready file, so the kubelet
        starts the sandbox container only once the guard's nftables table is in force;
        uid 0 with every capability dropped but NET_ADMIN (its table) and NET_BIND_SERVICE
        (port 53), no privilege escalation, read-only root, RuntimeDefault seccomp;
        the only container that mounts a token: a projected, expiring token of the Sandbox's
        own guard ServiceAccount (``sandpod_kube.guardpod``: read its own Sandbox, nothing
        else) -- the sandbox container mounts none (``automountServiceAccountToken: false``)
    dnsPolicy: None, nameserver 127.0.0.1   every container asks the guard's resolver
    emptyDir "netguard-trust"  the guard's interception certificates, read-only in the sandbox
                               container; with ``SandboxPod.trust_bundle`` (every guarded Pod:
                               an injection may come at its start or later) also the image's CA
                               bundle merged with them, written by the init container
                               "trust-bundle" (``sandpod_kube.guardtrust``)

The guard filters by the sandbox container's uid (``run_as_user``): every socket of it goes
through the same chain the local runtime compiles; its own traffic (upstream DNS to
``guard_dns``, the API server) is its own uid's.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CREDS_EXPIRES",
    "CREDS_KEY",
    "CREDS_MOUNT",
    "INSTALLATION_LABEL",
    "MANAGED_BY",
    "SANDBOX_LABEL",
    "TEMPLATE_LABEL",
    "PodSettings",
    "SandboxPod",
    "creds_secret_manifest",
    "creds_secret_name",
    "labels_of",
    "owner_reference",
    "pod_manifest",
]

SANDBOX_LABEL = "sandpod.dev/sandbox"
INIT_CPU_REQUEST = "10m"  # the execd-install copy: a second of I/O, not a core
TEMPLATE_LABEL = "sandpod.dev/template"
INSTALLATION_LABEL = "sandpod.dev/installation"
MANAGED_BY = "sandpod-lifecycle"
BUNDLE_MOUNT = "/opt/sandpod"
CREDS_MOUNT = "/var/run/sandpod/nats"
CREDS_KEY = "nats.creds"
CREDS_EXPIRES = "sandpod.dev/nats-creds-expires"  # annotation: the JWT's exp (unix seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class PodSettings:
    """How the ``kubernetes`` runtime builds Pods.

    Each attribute is read from ``SANDPOD_POD_<NAME>`` (``EXECD_IMAGE``, ``DEFAULT_IMAGE``,
    ``NATS_SECRET``, ``NATS_PORT``, ``NATS_NAMESPACE``, ``NATS_POD_LABELS`` as ``k=v,...``,
    ``NATS_CIDRS`` comma-separated, ``RUN_AS_USER``, ``GRACE`` for grace_seconds, ``BUNDLE_SIZE``,
    ``START_DEADLINE``, ``IMAGE_PULL_SECRETS`` comma-separated, ``VOLUME_STORAGE_CLASS``,
    ``VOLUME_ACCESS_MODE``).

    Attributes:
        execd_image: the ``sandpod-execd`` image (the bundle under ``/sandpod-bundle``).
        default_image: the sandbox image when the template names none.
        nats_secret: Secret (in the sandbox's namespace) whose key ``url`` is execd's NATS URL.
        nats_port: NATS client port, allowed by the egress policy.
        nats_namespace: namespace of the NATS pods (selected by ``nats_pod_labels``).
        nats_pod_labels: labels of the NATS pods (``key=value,...``).
        nats_cidrs: addresses of a NATS outside the cluster.
        run_as_user: uid (and gid) every container runs as.
        grace_seconds: termination grace period of a sandbox Pod.
        bundle_size: size limit of the emptyDir holding the execd bundle.
        start_deadline: seconds a Pod may stay un-Ready for a transient reason (Unschedulable,
            image pull, container config) before its Sandbox is Failed with that reason.
        image_pull_secrets: Secrets (in the sandbox's namespace) the kubelet pulls sandbox
            images with: a private registry, such as the build registry of built templates.
        netguard: run the network guard in every sandbox Pod (``NETGUARD``: true/false).
        guard_image: the image the guard runs from (the lifecycle image).
        guard_dns: the cluster DNS the guard forwards allowed names to (``ip[:port]``,
            comma-separated: the Pod's own resolv.conf names the guard); required with netguard.
        guard_api_cidrs: where the guard reaches the API server (the ``kubernetes`` Service's
            endpoints; the per-template NetworkPolicy lets Pods reach them, the guard's chain
            keeps the sandbox's uid out).
        volume_storage_class: the StorageClass of SandboxVolumes' PVCs when the volume names
            none (None: the cluster's default class).
        volume_access_mode: the PVCs' access mode (``ReadWriteOnce``: readers of a volume
            must then share the writer's node; ``ReadWriteMany`` where the class offers it).
    """

    execd_image: str = "ghcr.io/sandpod/sandpod-execd:0.1.0"
    default_image: str = "debian:bookworm-slim"
    nats_secret: str = "sandpod-nats"  # noqa: S105 - a Secret's name, not a password
    nats_port: int = 4222
    nats_namespace: str | None = None
    nats_pod_labels: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {"app.kubernetes.io/name": "nats"}
    )
    nats_cidrs: tuple[str, ...] = ()
    run_as_user: int = 1000
    grace_seconds: int = 5
    bundle_size: str = "256Mi"
    start_deadline: int = 300
    image_pull_secrets: tuple[str, ...] = ()
    netguard: bool = False
    guard_image: str = "ghcr.io/sandpod/sandpod-lifecycle:0.1.0"
    guard_dns: tuple[str, ...] = ()
    guard_api_cidrs: tuple[str, ...] = ()
    volume_storage_class: str | None = None  # SandboxVolumes' PVCs (None: the cluster default)
    volume_access_mode: str = "ReadWriteOnce"  # readers on other nodes need ReadWriteMany

    def __post_init__(self) -> None:
        if self.netguard and not self.guard_dns:
            raise ValueError("the network guard needs SANDPOD_POD_GUARD_DNS (the cluster DNS)")

    @property
    def nats_pinned(self) -> bool:
        """Whether the per-template policies can name NATS as a destination."""
        return bool(self.nats_namespace or self.nats_cidrs)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodSettings:
        """Settings from ``SANDPOD_POD_*``. Raises ValueError naming a malformed variable."""
        base = cls()

        def text(name: str, default: str) -> str:
            return env.get(f"SANDPOD_POD_{name}", "").strip() or default

        def number(name: str, default: int) -> int:
            raw = text(name, str(default))
            if not raw.isdigit():
                raise ValueError(f"SANDPOD_POD_{name}={raw!r} is not a non-negative integer")
            return int(raw)

        labels = dict(base.nats_pod_labels)
        if raw_labels := text("NATS_POD_LABELS", ""):
            pairs = [item.partition("=") for item in raw_labels.split(",") if item.strip()]
            if any(not k.strip() or not eq for k, eq, _ in pairs):
                raise ValueError(f"SANDPOD_POD_NATS_POD_LABELS={raw_labels!r}: use key=value,...")
            labels = {k.strip(): v.strip() for k, _, v in pairs}

        def items(name: str) -> tuple[str, ...]:
            return tuple(c.strip() for c in text(name, "").split(",") if c.strip())

        cidrs, api_cidrs = items("NATS_CIDRS"), items("GUARD_API_CIDRS")
        for name, cidr in [
            *(("NATS_CIDRS", c) for c in cidrs),
            *(("GUARD_API_CIDRS", c) for c in api_cidrs),
        ]:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"SANDPOD_POD_{name}: {cidr!r} is not a CIDR") from exc
        for server in items("GUARD_DNS"):
            host = server.removeprefix("[").partition("]")[0] if server.startswith("[") else server
            try:
                ipaddress.ip_address(host.partition(":")[0] if host.count(":") == 1 else host)
            except ValueError as exc:
                raise ValueError(f"SANDPOD_POD_GUARD_DNS: {server!r} is not ip[:port]") from exc
        guard = text("NETGUARD", "false").lower()
        if guard not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"SANDPOD_POD_NETGUARD={guard!r}: true or false")
        return cls(
            execd_image=text("EXECD_IMAGE", base.execd_image),
            default_image=text("DEFAULT_IMAGE", base.default_image),
            nats_secret=text("NATS_SECRET", base.nats_secret),
            nats_port=number("NATS_PORT", base.nats_port),
            nats_namespace=text("NATS_NAMESPACE", "") or None,
            nats_pod_labels=labels,
            nats_cidrs=cidrs,
            run_as_user=number("RUN_AS_USER", base.run_as_user),
            grace_seconds=number("GRACE", base.grace_seconds),
            bundle_size=text("BUNDLE_SIZE", base.bundle_size),
            start_deadline=number("START_DEADLINE", base.start_deadline),
            image_pull_secrets=items("IMAGE_PULL_SECRETS"),
            netguard=guard in ("true", "1", "yes"),
            guard_image=text("GUARD_IMAGE", base.guard_image),
            guard_dns=items("GUARD_DNS"),
            guard_api_cidrs=api_cidrs,
            volume_storage_class=text("VOLUME_STORAGE_CLASS", "") or None,
            volume_access_mode=text("VOLUME_ACCESS_MODE", base.volume_access_mode),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxPod:
    """One sandbox's Pod, in the words of the Sandbox and its template."""

    name: str
    namespace: str
    owner_uid: str  # the Sandbox's uid: the Pod's ownerReference
    template: str  # template name ("default" for the built-in one): labels, NetworkPolicy
    installation: str  # the subject prefix: which installation's lifecycle owns the Pod
    image: str | None = None
    runtime_class_name: str | None = None
    cpu: str | None = None
    memory: str | None = None
    disk: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    creds_secret: str | None = None  # the Sandbox's own NATS creds Secret (None: shared URL)
    # SandboxVolumes: (volume name, mount path, read-only), each its PVC (sandpod_kube.volumes)
    volumes: tuple[tuple[str, str, bool], ...] = ()
    # with the guard: its commands trust the guard's authorities, whichever domains the policy
    # injects now or later (``sandpod_kube.guardtrust``; ``env`` holds the variables, the
    # runtime puts them there)
    trust_bundle: bool = False


def creds_secret_name(sandbox: str) -> str:
    """The name of a sandbox's NATS creds Secret (a Sandbox name is at most 63 characters)."""
    return f"{sandbox}-nats-creds"


def owner_reference(pod: SandboxPod) -> dict[str, Any]:
    """The Sandbox as the controlling owner of what is made for it."""
    return _owner(pod)


def _owner(pod: SandboxPod) -> dict[str, Any]:
    return {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "Sandbox",
        "name": pod.name,
        "uid": pod.owner_uid,
        "controller": True,
    }


def creds_secret_manifest(pod: SandboxPod, creds: str, expires: int) -> dict[str, Any]:
    """The Secret holding ``pod``'s creds file; owned by the Sandbox, labelled like its Pod."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": creds_secret_name(pod.name),
            "namespace": pod.namespace,
            "labels": labels_of(pod),
            "annotations": {CREDS_EXPIRES: str(expires)},
            "ownerReferences": [_owner(pod)],
        },
        "data": {CREDS_KEY: base64.b64encode(creds.encode()).decode()},
    }


def labels_of(pod: SandboxPod) -> dict[str, str]:
    return {
        SANDBOX_LABEL: pod.name,
        TEMPLATE_LABEL: pod.template,
        INSTALLATION_LABEL: pod.installation,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _hardened(settings: PodSettings) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_user,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_manifest(pod: SandboxPod, settings: PodSettings) -> dict[str, Any]:
    """The Pod of ``pod`` (see the module docstring for what and why)."""
    limits = {
        k: v
        for k, v in (("cpu", pod.cpu), ("memory", pod.memory), ("ephemeral-storage", pod.disk))
        if v
    }
    env = [
        {"name": "SANDPOD_SANDBOX_ID", "value": pod.name},
        {"name": "SANDPOD_PREFIX", "value": pod.installation},
        {
            "name": "SANDPOD_NATS_URL",
            "valueFrom": {"secretKeyRef": {"name": settings.nats_secret, "key": "url"}},
        },
        {"name": "SANDPOD_WORKSPACE", "value": "/workspace"},
        {"name": "SANDPOD_STATE_DIR", "value": "/tmp/sandpod"},  # noqa: S108 - the Pod's own emptyDir
        {"name": "SANDPOD_ROOTFS", "value": "/"},  # its changes are snapshotted (sys.snapshot)
        {"name": "SANDPOD_EXECD_ENV", "value": json.dumps(dict(pod.env), sort_keys=True)},
        {"name": "HOME", "value": "/workspace"},
        {"name": "PYTHONPATH", "value": f"{BUNDLE_MOUNT}/site"},  # the bundle's packages only
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},  # the bundle is mounted read-only
    ]
    workspace: dict[str, Any] = {"sizeLimit": pod.disk} if pod.disk else {}
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",  # a dead execd is a new Pod (the reconciler's call), not a loop
        "terminationGracePeriodSeconds": settings.grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            {
                "name": "execd-install",
                "image": settings.execd_image,
                "command": ["cp", "-a", "/sandpod-bundle/.", f"{BUNDLE_MOUNT}/"],
                "securityContext": _hardened(settings),
                # Requests of its own: without them they default to the limits, and a Pod asks
                # for max(init, sum of containers): half a core per sandbox, whatever its
                # template (4 sandboxes per 2-core node, found on a real scheduler).
                "resources": {
                    "requests": {"cpu": INIT_CPU_REQUEST, "memory": "16Mi"},
                    "limits": {"cpu": "500m", "memory": "64Mi"},
                },
                "volumeMounts": [{"name": "sandpod", "mountPath": BUNDLE_MOUNT}],
            }
        ],
        "containers": [
            {
                "name": "sandbox",
                "image": pod.image or settings.default_image,
                "command": [f"{BUNDLE_MOUNT}/python/bin/python3", "-m", "sandpod_execd"],
                "workingDir": "/workspace",
                # execd's last log line (no NATS, bad settings...) reaches ExecdExited's message
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "env": env,
                "resources": {"limits": limits, "requests": limits} if limits else {},
                "securityContext": _hardened(settings),
                "volumeMounts": [
                    {"name": "sandpod", "mountPath": BUNDLE_MOUNT, "readOnly": True},
                    {"name": "workspace", "mountPath": "/workspace"},
                    {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - an emptyDir
                ],
            }
        ],
        "volumes": [
            {"name": "sandpod", "emptyDir": {"sizeLimit": settings.bundle_size}},
            {"name": "workspace", "emptyDir": workspace},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if pod.runtime_class_name:
        spec["runtimeClassName"] = pod.runtime_class_name
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if pod.creds_secret:
        _mount_creds(spec, pod.creds_secret)
    if pod.volumes:
        from sandpod_kube.volumes import mount_volumes  # it renders onto this module's output

        mount_volumes(spec, pod.volumes)
    if settings.netguard:
        from sandpod_kube.guardpod import add_guard  # it renders onto this module's output

        add_guard(spec, pod, settings)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": labels_of(pod),
            "ownerReferences": [_owner(pod)],
        },
        "spec": spec,
    }


def _mount_creds(spec: dict[str, Any], secret: str) -> None:
    """execd's creds file: the Secret as a read-only directory (updates reach it), mode 0400."""
    spec["volumes"].append(
        {
            "name": "nats-creds",
            "secret": {
                "secretName": secret,
                "defaultMode": 0o400,
                "items": [{"key": CREDS_KEY, "path": CREDS_KEY}],
            },
        }
    )
    main = spec["containers"][0]
    main["volumeMounts"].append({"name": "nats-creds", "mountPath": CREDS_MOUNT, "readOnly": True})
    main["env"].append({"name": "SANDPOD_NATS_CREDS", "value": f"{CREDS_MOUNT}/{CREDS_KEY}"})
