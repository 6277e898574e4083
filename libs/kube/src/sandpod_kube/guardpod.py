"""The network guard in a sandbox Pod: its container (:func:`add_guard`, called by
``podspec.pod_manifest`` when ``PodSettings.netguard`` is on; the why is in ``podspec``'s
docstring) and its credential: one ServiceAccount per Sandbox that may read that Sandbox and
nothing else. Pure: manifests from typed input; :class:`~sandpod_kube.pods.PodApi` sends.

Why a ServiceAccount per Sandbox: RBAC scopes a rule to single objects only by
``resourceNames``, and a Role is granted to subjects, so "the guard of sandbox A reads A's
policy, and only A's" needs a subject per sandbox. Each Sandbox gets three objects, all owned
by it (the garbage collector removes them with it) and named ``<sandbox>-netguard``:

    ServiceAccount  <sandbox>-netguard                         the Pod's serviceAccountName;
                                                               no token is automounted, only
                                                               the guard container mounts a
                                                               projected, expiring token
    Role            get/list/watch sandboxes, resourceNames: [<sandbox>]   (read only: the
                    guard never writes; status.network is lifecycle's to write); and get
                    secrets, resourceNames: the Secrets its policy's header injections name
                    (``inject[].secret: <secret>/<key>``; re-applied on every policy update);
                    get/patch configmaps, resourceNames: [<sandbox>-netguard]
    RoleBinding     the Role to the ServiceAccount
    ConfigMap       <sandbox>-netguard: the guard's refusal report (``guardreport.py``), the
                    one object it may write; lifecycle reads it and publishes the events

To create a Role the lifecycle must itself hold what it grants (RBAC's escalation check): it
does, it watches every Sandbox; the chart adds create/delete on these three kinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandpod_contract.network import NetworkPolicy
from sandpod_kube.guardtrust import TRUST_FILE, TRUST_MOUNT, trust_bundle_container
from sandpod_kube.podspec import BUNDLE_MOUNT, PodSettings, SandboxPod

__all__ = [
    "GUARD_CAPABILITIES",
    "GUARD_CONTAINER",
    "GUARD_VERBS",
    "REPORT_LABEL",
    "TRUST_FILE",
    "add_guard",
    "guard_access_manifests",
    "guard_account_name",
    "guard_security_context",
    "injected_secrets",
]

GUARD_VERBS = ("get", "list", "watch")
REPORT_LABEL = "sandpod.dev/netguard-report"  # on each guard's report ConfigMap
GUARD_CONTAINER = "netguard"
GUARD_CAPABILITIES = ("NET_ADMIN", "NET_BIND_SERVICE")  # its nftables table; port 53
GUARD_TOKEN_MOUNT = "/var/run/sandpod/netguard"  # noqa: S105 - a path
GUARD_RUN = "/run/sandpod-guard"
GUARD_TOKEN_SECONDS = 3600  # the kubelet renews it at 80% of its life


def injected_secrets(policy: NetworkPolicy) -> list[str]:
    """The Kubernetes Secrets ``policy``'s header injections name (``<secret>/<key>``)."""
    return sorted({i.secret.split("/", 1)[0] for i in policy.inject if "/" in i.secret})


def guard_account_name(sandbox: str) -> str:
    """The guard's ServiceAccount (and Role, RoleBinding) of a Sandbox."""
    return f"{sandbox}-netguard"


def guard_access_manifests(
    namespace: str,
    sandbox: str,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
    secrets: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding giving sandbox ``sandbox``'s guard read access to
    that one Sandbox and to the Secrets named in ``secrets`` (its header injections'); ``owner``
    is the Sandbox's ownerReference."""
    name = guard_account_name(sandbox)
    rules: list[dict[str, Any]] = [
        {
            "apiGroups": ["sandpod.dev"],
            "resources": ["sandboxes"],
            "resourceNames": [sandbox],
            "verbs": list(GUARD_VERBS),
        }
    ]
    rules.append(
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [name],
            "verbs": ["get", "patch"],
        }
    )
    if secrets:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": sorted(set(secrets)),
                "verbs": ["get"],
            }
        )
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "ownerReferences": [dict(owner)],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta,
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {**meta, "labels": {**labels, REPORT_LABEL: "true"}},
        },
    ]


def guard_security_context() -> dict[str, Any]:
    """The guard container's: root for its capabilities (a non-root process gets them only as
    ambient capabilities, which Kubernetes does not set), and only the two it needs."""
    return {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": list(GUARD_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def add_guard(spec: dict[str, Any], pod: SandboxPod, settings: PodSettings) -> None:
    """The network guard as a native sidecar (module docstring), its token, the Pod's DNS."""
    nats_url = {"secretKeyRef": {"name": settings.nats_secret, "key": "url"}}
    env = [
        {"name": "SANDPOD_SANDBOX_ID", "value": pod.name},
        {"name": "SANDPOD_GUARD_NAMESPACE", "value": pod.namespace},
        {"name": "SANDPOD_GUARD_SANDBOX_UID", "value": str(settings.run_as_user)},
        {"name": "SANDPOD_NATS_URL", "valueFrom": nats_url},
        {"name": "SANDPOD_GUARD_NATS_CIDRS", "value": ",".join(settings.nats_cidrs)},
        {"name": "SANDPOD_GUARD_NATS_PORT", "value": str(settings.nats_port)},
        {"name": "SANDPOD_DNS_UPSTREAMS", "value": ",".join(settings.guard_dns)},
        {"name": "SANDPOD_KUBE_TOKEN_FILE", "value": f"{GUARD_TOKEN_MOUNT}/token"},
        {"name": "SANDPOD_KUBE_CA_FILE", "value": f"{GUARD_TOKEN_MOUNT}/ca.crt"},
        {"name": "SANDPOD_GUARD_READY_FILE", "value": f"{GUARD_RUN}/ready"},
        {"name": "SANDPOD_GUARD_CA_DIR", "value": f"{GUARD_RUN}/ca"},
        {"name": "SANDPOD_GUARD_TRUST_FILE", "value": TRUST_FILE},
    ]
    ready = f"import os, sys; sys.exit(not os.path.exists({GUARD_RUN + '/ready'!r}))"
    guard = {
        "name": GUARD_CONTAINER,
        "image": settings.guard_image,
        "restartPolicy": "Always",
        "command": ["python3", "-m", "sandpod_lifecycle.network.podguard"],
        "env": env,
        "securityContext": guard_security_context(),
        "startupProbe": {
            "exec": {"command": ["python3", "-c", ready]},
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
        "resources": {"limits": {"cpu": "250m", "memory": "160Mi"}},
        "volumeMounts": [
            {"name": "netguard-token", "mountPath": GUARD_TOKEN_MOUNT, "readOnly": True},
            {"name": "netguard-run", "mountPath": GUARD_RUN},
            {"name": "netguard-trust", "mountPath": TRUST_MOUNT},
        ],
    }
    for container in spec["containers"]:  # the authorities of its header injections, read-only
        container.setdefault("volumeMounts", []).append(
            {"name": "netguard-trust", "mountPath": TRUST_MOUNT, "readOnly": True}
        )
    spec["initContainers"].insert(0, guard)  # before anything of the sandbox's uid runs
    if pod.trust_bundle:  # after the execd bundle is there (its Python runs the merge)
        main = spec["containers"][0]
        python = f"{BUNDLE_MOUNT}/python/bin/python3"
        merge = trust_bundle_container(
            main["image"], python, dict(main["securityContext"]), ("sandpod", BUNDLE_MOUNT)
        )
        spec["initContainers"].append(merge)
    spec["serviceAccountName"] = guard_account_name(pod.name)
    spec["volumes"] += [
        {
            "name": "netguard-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "path": "token",
                            "expirationSeconds": GUARD_TOKEN_SECONDS,
                        }
                    },
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                ]
            },
        },
        {"name": "netguard-run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "netguard-trust", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}},
    ]
    spec["dnsPolicy"] = "None"
    spec["dnsConfig"] = {"nameservers": ["127.0.0.1"]}
