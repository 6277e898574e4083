"""The real lifecycle and pool services work with exactly the rules the Helm chart gives them
(deploy/helm/sandpod/templates/rbac.yaml, rendered by helm), and the API server refuses them
anything beyond: each service runs as its own ServiceAccount (a bound token from the TokenRequest
API) whose ClusterRole carries the chart's rules (its ClusterRole's and its leader-election Lease
Role's) and is bound in the ``default`` namespace only, where its Lease lives.
(tests/k8s/test_helm_rbac.py checks the chart's RBAC itself; this runs the services under it.)"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s.chart import missing_helm, render
from k8s.cluster import NS, Cluster, ready
from k8s.envtest import ControlPlane
from sandpod import AsyncPools, AsyncSandbox
from sandpod_kube import KubeSettings, KubeStore, PodApi, StoreForbidden
from sandpod_kube.podspec import (
    PodSettings,
    SandboxPod,
    creds_secret_manifest,
    creds_secret_name,
    pod_manifest,
)
from sandpod_store import ObjectMeta, Resource

ROLE_KINDS = ("ClusterRole", "Role")
AUDIENCE = "https://kubernetes.default.svc"  # the test API server's issuer, its default audience


@pytest.fixture(scope="module")
def chart_rules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """The rules of the chart's lifecycle and pool ClusterRoles plus their Lease Roles (helm
    template, defaults)."""
    if problem := missing_helm():
        pytest.fail(problem)
    docs = render(tmp_path_factory.mktemp("rbac-chart"), {}, release="r", namespace="sandpod")
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] in ROLE_KINDS}
    return {
        f"sandpod-{c}": [*roles[f"r-sandpod-{c}"], *roles[f"r-sandpod-{c}-leases"]]
        for c in ("lifecycle", "pool")
    }


def grant(plane: ControlPlane, role: str, rules: list[Any]) -> str:
    """A ClusterRole ``role`` with ``rules``, bound to a ServiceAccount of that name in
    ``default`` only; return a token of that ServiceAccount."""
    with plane.settings.api_client() as api_client:
        rbac, core = client.RbacAuthorizationV1Api(api_client), client.CoreV1Api(api_client)
        doc = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": rules,
        }
        try:
            rbac.create_cluster_role(doc)  # type: ignore[arg-type]  # the client sends a dict body as it is
        except ApiException as exc:
            if exc.status != 409:
                raise
            rbac.replace_cluster_role(role, doc)  # type: ignore[arg-type]  # the client sends a dict body as it is
        meta = client.V1ObjectMeta(name=role)
        account = client.V1ServiceAccount(metadata=meta)
        for create in (
            lambda: core.create_namespaced_service_account(NS, account),
            lambda: rbac.create_namespaced_role_binding(
                NS,
                client.V1RoleBinding(
                    metadata=meta,
                    role_ref=client.V1RoleRef(
                        api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
                    ),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=role, namespace=NS)],
                ),
            ),
        ):
            try:
                create()
            except ApiException as exc:
                if exc.status != 409:
                    raise
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
        )
        answer = core.create_namespaced_service_account_token(role, NS, request)
        assert answer.status is not None, "a token request answers with its token"
        return str(answer.status.token)


def read_lease(plane: ControlPlane, name: str) -> dict[str, Any]:
    with plane.settings.api_client() as api_client:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(name, NS)
        return dict(api_client.sanitize_for_serialization(lease)["spec"])


def token_env(plane: ControlPlane, token: str, state: Path, role: str) -> dict[str, str]:
    path = state / f"{role}.token"
    path.write_text(token)
    return {
        "SANDPOD_KUBE_CLIENT_CERT": "",
        "SANDPOD_KUBE_CLIENT_KEY": "",
        "SANDPOD_KUBE_TOKEN_FILE": str(path),
    }


async def test_lifecycle_and_pool_work_with_exactly_their_roles(
    cluster: Cluster, tmp_path: Path, chart_rules: dict[str, list[Any]]
) -> None:
    """With only their ServiceAccounts' rules, lifecycle runs a sandbox in a Pod and the pool
    service fills a pool and binds a claim; neither logs a refusal."""
    plane = cluster.plane
    for role, module in (
        ("sandpod-lifecycle", "sandpod_lifecycle"),
        ("sandpod-pool", "sandpod_pool"),
    ):
        token = await asyncio.to_thread(grant, plane, role, chart_rules[role])
        cluster.credentials[module] = token_env(plane, token, tmp_path, role)
    cluster.service("sandpod_lifecycle", SANDPOD_RUNTIME="kubernetes", SANDPOD_RESYNC="0.5")
    cluster.service("sandpod_pool", SANDPOD_POOL_RESYNC="0.3")
    await cluster.answering()
    template = f"kt-{uuid.uuid4().hex[:6]}"
    await cluster.store.create(
        Resource(
            api_version="sandpod.dev/v1alpha1",
            kind="SandboxTemplate",
            metadata=ObjectMeta(name=template, namespace=NS),
            spec={"network": {"egress": ["10.2.0.0/16"]}},
        )
    )
    sbx = await AsyncSandbox.create(
        template, timeout=600, nats_url=cluster.nats.url, prefix=cluster.prefix
    )
    try:
        assert (await sbx.exec("echo rbac")).stdout == "rbac\n"
    finally:
        await sbx.kill()
        await sbx.close()
    pools = await AsyncPools.connect(nats_url=cluster.nats.url, prefix=cluster.prefix)
    try:
        pool = f"kp-{uuid.uuid4().hex[:6]}"
        await pools.create(pool, replicas=1)
        await cluster.until(
            "SandboxWarmPool",
            pool,
            lambda o: o is not None and o.status.get("availableReplicas") == 1,
        )
        claimed = await AsyncSandbox.claim(
            pool, timeout=600, nats_url=cluster.nats.url, prefix=cluster.prefix
        )
        try:
            assert claimed.claim_info is not None and claimed.claim_info.warm
            member = await cluster.store.get("Sandbox", NS, claimed.id)
            assert ready(member)
        finally:
            await claimed.close()
    finally:
        await pools.close()
    for service in ("lifecycle", "pool"):  # each elected itself on its own Lease
        lease = await asyncio.to_thread(read_lease, plane, f"{cluster.prefix}-{service}")
        assert lease["holderIdentity"] == f"{service}0"
    for proc in cluster.procs:
        assert "forbidden" not in proc.log.read_text().lower(), proc.tail(40)


async def test_each_service_is_refused_beyond_its_role(
    kube_apiserver: ControlPlane, namespace: str, chart_rules: dict[str, list[Any]]
) -> None:
    """The lifecycle's token cannot list Sandboxes outside its namespace, pools, or Pods elsewhere;
    the pool's token cannot create Pods or templates: each refusal is a typed StoreForbidden."""
    tokens = {
        role: await asyncio.to_thread(grant, kube_apiserver, role, chart_rules[role])
        for role in ("sandpod-lifecycle", "sandpod-pool")
    }

    def as_(role: str) -> KubeSettings:
        return dataclasses.replace(
            kube_apiserver.settings, client_cert_file=None, client_key_file=None, token=tokens[role]
        )

    lifecycle_store, pool_store = (
        KubeStore(as_("sandpod-lifecycle")),
        KubeStore(as_("sandpod-pool")),
    )
    lifecycle_pods, pool_pods = PodApi(as_("sandpod-lifecycle")), PodApi(as_("sandpod-pool"))
    try:
        await lifecycle_store.list("Sandbox", NS)  # allowed: its namespace
        with pytest.raises(StoreForbidden):
            await lifecycle_store.list("Sandbox", namespace)  # not bound there
        with pytest.raises(StoreForbidden):
            await lifecycle_store.list("SandboxWarmPool", NS)  # the pool service's kind
        with pytest.raises(StoreForbidden):
            await lifecycle_pods.list("app=x", "kube-system")
        await pool_store.list("SandboxClaim", NS)  # allowed
        pod = SandboxPod(name="no-way", namespace=NS, owner_uid="u", template="t", installation="x")
        with pytest.raises(StoreForbidden):
            await pool_pods.create(pod_manifest(pod, PodSettings()))
        # A sandbox's NATS creds Secret: lifecycle writes (create, renew) and deletes it (reads
        # are refused: test_helm_rbac.py); the pool service cannot write one.
        name = f"rb-{uuid.uuid4().hex[:6]}"
        secret = SandboxPod(
            name=name, namespace=NS, owner_uid=str(uuid.uuid4()), template="t", installation="x"
        )
        await lifecycle_pods.apply_secret(creds_secret_manifest(secret, "creds-1", 1))
        await lifecycle_pods.apply_secret(creds_secret_manifest(secret, "creds-2", 2))
        await lifecycle_pods.delete_secret(NS, creds_secret_name(name))
        with pytest.raises(StoreForbidden):
            await pool_pods.apply_secret(creds_secret_manifest(secret, "creds-3", 3))
        with pytest.raises(StoreForbidden):
            await pool_store.create(
                Resource(
                    api_version="sandpod.dev/v1alpha1",
                    kind="SandboxTemplate",
                    metadata=ObjectMeta(name="no-way", namespace=NS),
                    spec={},
                )
            )
    finally:
        for closeable in (lifecycle_store, pool_store, lifecycle_pods, pool_pods):
            await closeable.close()
