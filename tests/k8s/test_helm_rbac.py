"""The chart's RBAC on the real API server: each service can do what it needs, nothing beyond.

The rendered ServiceAccounts, (Cluster)Roles and bindings are created for real, each
ServiceAccount gets a token from the TokenRequest API, and the API server's RBAC authorizer
answers: SelfSubjectAccessReviews, plain REST calls, and KubeStore (what the services use).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k8s.chart import Rest, missing_helm, render, unique
from k8s.envtest import ControlPlane
from sandpod_kube import (
    KubeSettings,
    KubeStore,
    LeaderElector,
    LeaderSettings,
    StoreForbidden,
    ensure_namespace,
)
from sandpod_store import ObjectMeta, Resource

SANDBOX = "sandpod.dev/v1alpha1"


@pytest.fixture(scope="module")
def helm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work dir for rendered copies of the chart; fails (never skips) without helm."""
    if problem := missing_helm():
        pytest.fail(problem)
    return tmp_path_factory.mktemp("helm-rbac")


@pytest.fixture(scope="module")
def admin(kube_apiserver: ControlPlane) -> Iterator[Rest]:
    """REST calls with the admin credential."""
    rest = Rest(kube_apiserver)
    yield rest
    rest.close()


# -- RBAC: least privilege, judged by the API server's authorizer --------------------------------

# (apiGroup, resource, verb, subresource)
Access = tuple[str, str, str, str]
NEEDS: dict[str, list[Access]] = {
    "lifecycle": [
        ("sandpod.dev", "sandboxes", "watch", ""),
        ("sandpod.dev", "sandboxes", "delete", ""),
        ("sandpod.dev", "sandboxes", "update", "status"),
        ("sandpod.dev", "sandboxtemplates", "list", ""),
        ("", "pods", "create", ""),
        ("", "pods", "delete", ""),
        ("networking.k8s.io", "networkpolicies", "create", ""),
        ("", "secrets", "create", ""),  # each sandbox's NATS creds Secret
        ("", "secrets", "patch", ""),  # its renewal (server-side apply)
        ("", "secrets", "delete", ""),
        ("", "events", "create", ""),
        ("sandpod.dev", "sandboxvolumes", "create", ""),  # the volumes API
        ("sandpod.dev", "sandboxvolumes", "update", "status"),  # claims
        ("", "persistentvolumeclaims", "patch", ""),  # a volume's PVC (server-side apply)
        ("", "persistentvolumeclaims", "delete", ""),
        ("sandpod.dev", "sandboxsnapshots", "watch", ""),  # the snapshot controller
        ("sandpod.dev", "sandboxsnapshots", "update", "status"),  # Failed: Unsupported here
    ],
    "pool": [
        ("sandpod.dev", "sandboxwarmpools", "watch", ""),
        ("sandpod.dev", "sandboxwarmpools", "update", "status"),
        ("sandpod.dev", "sandboxwarmpools", "update", "scale"),
        ("sandpod.dev", "sandboxclaims", "update", "status"),
        ("sandpod.dev", "sandboxes", "create", ""),
        ("sandpod.dev", "sandboxes", "delete", ""),
        ("sandpod.dev", "sandboxes", "list", ""),
        ("sandpod.dev", "sandboxtemplates", "get", ""),
    ],
    "gateway": [],
}
REFUSED: dict[str, list[Access]] = {
    "lifecycle": [
        ("sandpod.dev", "sandboxclaims", "get", ""),
        ("sandpod.dev", "sandboxwarmpools", "list", ""),
        ("", "secrets", "get", ""),  # write-only: reading would expose the namespace's Secrets
        ("", "secrets", "list", ""),
        ("", "secrets", "watch", ""),
        ("", "pods", "create", "exec"),
        ("", "serviceaccounts", "create", ""),
        ("rbac.authorization.k8s.io", "roles", "create", ""),
        ("", "configmaps", "list", ""),
        ("", "persistentvolumes", "delete", ""),  # only claims: their volumes are the cluster's
        ("", "persistentvolumeclaims", "list", ""),
    ],
    "pool": [
        ("", "secrets", "get", ""),
        ("", "pods", "list", ""),
        ("", "pods", "create", ""),
        ("networking.k8s.io", "networkpolicies", "create", ""),
        ("sandpod.dev", "sandboxes", "update", "status"),
        ("sandpod.dev", "sandboxtemplates", "create", ""),
        ("sandpod.dev", "sandboxsnapshots", "list", ""),
    ],
    "gateway": [
        ("sandpod.dev", "sandboxes", "get", ""),
        ("sandpod.dev", "sandboxclaims", "create", ""),
        ("", "pods", "list", ""),
        ("", "secrets", "get", ""),
        ("", "configmaps", "get", ""),
        ("coordination.k8s.io", "leases", "get", ""),
    ],
}


class Installed:
    """The chart's RBAC applied for real, with a token for each service's ServiceAccount."""

    def __init__(
        self, release_ns: str, tenant_ns: str, tokens: dict[str, str], plane: ControlPlane
    ) -> None:
        self.release_ns, self.tenant_ns, self.tokens = release_ns, tenant_ns, tokens
        self.clients = {c: Rest(plane, token=t) for c, t in tokens.items()}
        self.settings = {
            c: KubeSettings(host=plane.url, ca_file=str(plane.ca_file), token=t)
            for c, t in tokens.items()
        }


@pytest.fixture(scope="module")
def installed(helm_dir: Path, admin: Rest, kube_apiserver: ControlPlane) -> Iterator[Installed]:
    """Render, create SAs/Roles/Bindings for real, mint a token per SA (TokenRequest API)."""
    release_ns, tenant_ns = unique("sandpod"), unique("tenant")
    for name in (release_ns, tenant_ns):
        ensure_namespace(kube_apiserver.settings, name)
    release = unique("rbac")
    docs = render(helm_dir, {}, release=release, namespace=release_ns)
    rbac_kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    for doc in (d for d in docs if d["kind"] in rbac_kinds):
        reply = admin.create(doc)
        assert reply.status_code == 201, reply.text
    tokens = {}
    for component in ("lifecycle", "pool", "gateway"):
        sa = f"{release}-sandpod-{component}"
        reply = admin.http.post(
            f"/api/v1/namespaces/{release_ns}/serviceaccounts/{sa}/token",
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            },
        )
        assert reply.status_code == 201, reply.text
        tokens[component] = reply.json()["status"]["token"]
    installed = Installed(release_ns, tenant_ns, tokens, kube_apiserver)
    yield installed
    for rest in installed.clients.values():
        rest.close()


def allowed(rest: Rest, access: Access, namespace: str) -> bool:
    """The API server's answer to SelfSubjectAccessReview for ``access`` in ``namespace``."""
    group, resource, verb, sub = access
    reply = rest.http.post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "group": group,
                    "resource": resource,
                    "verb": verb,
                    "subresource": sub,
                    "namespace": namespace,
                }
            },
        },
    )
    assert reply.status_code == 201, reply.text
    return bool(reply.json()["status"]["allowed"])


@pytest.mark.parametrize("component", ["lifecycle", "pool", "gateway"])
def test_each_service_is_allowed_what_it_needs_and_refused_beyond(
    installed: Installed, component: str
) -> None:
    """SelfSubjectAccessReview with the service's own token: needs allowed, the rest refused."""
    rest = installed.clients[component]
    ns = installed.tenant_ns
    assert [a for a in NEEDS[component] if not allowed(rest, a, ns)] == []
    assert [a for a in REFUSED[component] if allowed(rest, a, ns)] == []


LEASE_VERBS = ("get", "create", "update")  # what sandpod_kube.leader does, and nothing more


@pytest.mark.parametrize("component", ["lifecycle", "pool"])
def test_leases_only_in_the_release_namespace(installed: Installed, component: str) -> None:
    """Leader-election Leases: exactly get/create/update, in the release namespace only."""
    rest = installed.clients[component]
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
    granted = [
        v
        for v in verbs
        if allowed(rest, ("coordination.k8s.io", "leases", v, ""), installed.release_ns)
    ]
    assert tuple(granted) == LEASE_VERBS
    elsewhere = [
        v
        for v in verbs
        if allowed(rest, ("coordination.k8s.io", "leases", v, ""), installed.tenant_ns)
    ]
    assert elsewhere == []


@pytest.mark.parametrize("component", ["lifecycle", "pool"])
async def test_elector_runs_on_the_service_account_token(
    installed: Installed, component: str
) -> None:
    """With the service's own token the elector creates, renews and releases its Lease in the
    release namespace; in another namespace it is refused and never leads (no crash)."""
    settings = LeaderSettings(lease_duration=2, renew_deadline=1.0, retry_period=0.2)
    name = unique(f"sandpod-{component}")
    home = LeaderElector(
        installed.settings[component],
        dataclasses.replace(settings, namespace=installed.release_ns),
        name=name,
        identity="r0",
    )
    away = LeaderElector(
        installed.settings[component],
        dataclasses.replace(settings, namespace=installed.tenant_ns),
        name=name,
        identity="r0",
    )
    try:
        assert await home.step()  # create
        assert await home.step()  # get + update (renew)
        await home.release()  # get + update
        assert not home.is_leader
        assert home.holder == ""
        assert not await away.step()  # 403 on get: a follower step, logged
        assert not away.is_leader
    finally:
        await home.close()
        await away.close()


def test_real_calls_with_service_account_tokens(installed: Installed) -> None:
    """Real requests: pool creates a Sandbox, lifecycle sets its status; refusals are 403."""
    ns = installed.tenant_ns
    pool, lifecycle = installed.clients["pool"], installed.clients["lifecycle"]
    gateway = installed.clients["gateway"]
    sbx = {
        "apiVersion": SANDBOX,
        "kind": "Sandbox",
        "metadata": {"name": "s1", "namespace": ns},
        "spec": {"templateRef": {"name": "python"}},
    }
    assert pool.create(sbx).status_code == 201
    path = f"/apis/{SANDBOX}/namespaces/{ns}/sandboxes/s1"
    current = lifecycle.http.get(path).json()
    current["status"] = {"phase": "Pending"}
    reply = lifecycle.http.put(f"{path}/status", json=current)
    assert reply.status_code == 200, reply.text
    assert lifecycle.http.get(f"/api/v1/namespaces/{ns}/pods").status_code == 200
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": ns}}
    assert lifecycle.create(secret).status_code == 201  # a sandbox's NATS creds
    assert lifecycle.http.delete(f"/api/v1/namespaces/{ns}/secrets/x").status_code == 200
    refused = [
        lifecycle.http.get(f"/api/v1/namespaces/{ns}/secrets"),
        lifecycle.http.get(f"/api/v1/namespaces/{ns}/secrets/sandpod-nats"),
        pool.http.get(f"/api/v1/namespaces/{ns}/secrets"),
        pool.http.get(f"/api/v1/namespaces/{ns}/pods"),
        pool.http.put(f"{path}/status", json=current),
        lifecycle.http.get(f"/apis/{SANDBOX}/namespaces/{ns}/sandboxclaims"),
        gateway.http.get(path),
        gateway.http.get(f"/api/v1/namespaces/{ns}/pods"),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused)


def test_namespaced_rbac_stops_at_the_release_namespace(
    helm_dir: Path, admin: Rest, kube_apiserver: ControlPlane
) -> None:
    """rbac.clusterWide=false: lifecycle manages pods in its own namespace only, not a tenant's."""
    release_ns, other_ns = unique("sandpod"), unique("tenant")
    for name in (release_ns, other_ns):
        ensure_namespace(kube_apiserver.settings, name)
    release = unique("nsrbac")
    values = {"rbac": {"clusterWide": False}}
    docs = render(helm_dir, values, release=release, namespace=release_ns)
    assert not [d for d in docs if d["kind"].startswith("ClusterRole")]
    for doc in (d for d in docs if d["kind"] in {"ServiceAccount", "Role", "RoleBinding"}):
        assert admin.create(doc).status_code == 201
    reply = admin.http.post(
        f"/api/v1/namespaces/{release_ns}/serviceaccounts/{release}-sandpod-lifecycle/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert reply.status_code == 201, reply.text
    lifecycle = Rest(kube_apiserver, token=reply.json()["status"]["token"])
    try:
        assert allowed(lifecycle, ("", "pods", "create", ""), release_ns)
        assert allowed(lifecycle, ("sandpod.dev", "sandboxes", "watch", ""), release_ns)
        assert not allowed(lifecycle, ("", "pods", "create", ""), other_ns)
        assert not allowed(lifecycle, ("sandpod.dev", "sandboxes", "watch", ""), other_ns)
    finally:
        lifecycle.close()


def resource(kind: str, namespace: str, name: str, spec: dict[str, Any]) -> Resource:
    return Resource(
        api_version=SANDBOX,
        kind=kind,
        spec=spec,
        metadata=ObjectMeta(name=name, namespace=namespace),
    )


async def test_the_kube_store_works_within_each_services_rbac(installed: Installed) -> None:
    """KubeStore (what the services use) does the pool's and lifecycle's work with their tokens."""
    ns = installed.tenant_ns
    pool = await KubeStore.connect(installed.settings["pool"])
    lifecycle = await KubeStore.connect(installed.settings["lifecycle"])
    try:
        warm = await pool.create(
            resource(
                "SandboxWarmPool", ns, "wp", {"templateRef": {"name": "python"}, "replicas": 1}
            )
        )
        await pool.update_status(dataclasses.replace(warm, status={"readyReplicas": 0}))
        member = await pool.create(
            resource("Sandbox", ns, "wp-1", {"templateRef": {"name": "python"}})
        )
        claim = await pool.create(resource("SandboxClaim", ns, "c1", {"poolRef": {"name": "wp"}}))
        await pool.update_status(dataclasses.replace(claim, status={"sandbox": "wp-1"}))
        listed, _ = await lifecycle.list("Sandbox")  # every namespace: a ClusterRole
        assert "wp-1" in {o.metadata.name for o in listed}
        running = await lifecycle.update_status(
            dataclasses.replace(member, status={"phase": "Running"})
        )
        await lifecycle.list("SandboxTemplate", ns)
        with pytest.raises(StoreForbidden):  # lifecycle never touches claims or pools
            await lifecycle.list("SandboxClaim", ns)
        with pytest.raises(StoreForbidden):
            await lifecycle.update_status(dataclasses.replace(warm, status={}))
        with pytest.raises(StoreForbidden):  # only lifecycle reports a sandbox's status
            await pool.update_status(dataclasses.replace(running, status={"phase": "Failed"}))
        with pytest.raises(StoreForbidden):  # templates are the lifecycle API's to write
            await pool.create(resource("SandboxTemplate", ns, "t", {}))
        await pool.delete("Sandbox", ns, "wp-1")
    finally:
        await pool.close()
        await lifecycle.close()
