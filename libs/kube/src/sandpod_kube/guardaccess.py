"""The network guard's credential: one ServiceAccount per Sandbox that may read that Sandbox
and nothing else. Pure: manifests from typed input; :class:`~sandpod_kube.pods.PodApi` sends.

Why a ServiceAccount per Sandbox: RBAC scopes a rule to single objects only by
``resourceNames``, and a Role is granted to subjects, so "the guard of sandbox A reads A's
policy, and only A's" needs a subject per sandbox. Each Sandbox gets three objects, all owned
by it (the garbage collector removes them with it) and named ``<sandbox>-netguard``:

    ServiceAccount  <sandbox>-netguard                         the Pod's serviceAccountName;
                                                               no token is automounted, only
                                                               the guard container mounts a
                                                               projected, expiring token
    Role            get/list/watch sandboxes, resourceNames: [<sandbox>]   (read only: the
                    guard never writes; status.network is lifecycle's to write)
    RoleBinding     the Role to the ServiceAccount

To create a Role the lifecycle must itself hold what it grants (RBAC's escalation check): it
does, it watches every Sandbox; the chart adds create/delete on these three kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["GUARD_VERBS", "guard_access_manifests", "guard_account_name"]

GUARD_VERBS = ("get", "list", "watch")


def guard_account_name(sandbox: str) -> str:
    """The guard's ServiceAccount (and Role, RoleBinding) of a Sandbox."""
    return f"{sandbox}-netguard"


def guard_access_manifests(
    namespace: str, sandbox: str, owner: Mapping[str, Any], labels: Mapping[str, str]
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding giving sandbox ``sandbox``'s guard read access to
    that one Sandbox; ``owner`` is the Sandbox's ownerReference."""
    name = guard_account_name(sandbox)
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
            "rules": [
                {
                    "apiGroups": ["sandpod.dev"],
                    "resources": ["sandboxes"],
                    "resourceNames": [sandbox],
                    "verbs": list(GUARD_VERBS),
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]
