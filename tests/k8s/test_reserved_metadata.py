"""Attack on the real API server: a tenant with kubectl rights on Sandboxes copies another
pool's ``sandpod.dev/`` labels (or an ownerReference) onto its own Sandbox to have it counted as
that pool's member and bound by its claims. The chart's ValidatingAdmissionPolicy
(deploy/helm/sandpod/templates/reserved-metadata.yaml, rendered by helm) refuses every such
create and update for anyone but the lifecycle and pool ServiceAccounts (and cluster admins),
while ordinary labels still work and the pool's own ServiceAccount still writes reserved ones."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from k8s.chart import missing_helm, render
from k8s.cluster import NS
from k8s.envtest import ControlPlane
from k8s.test_rbac import grant
from sandpod_contract.errors import ResourceNotFound, StoreError
from sandpod_contract.pooling import HASH_LABEL, POOL_LABEL
from sandpod_kube import KubeSettings, KubeStore
from sandpod_store import ObjectMeta, OwnerReference, Resource

__all__: list[str] = []

RELEASE = "r"
TENANT_RULES = [
    {
        "apiGroups": ["sandpod.dev"],
        "resources": ["sandboxes", "sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
]


@pytest.fixture
def policy(kube_apiserver: ControlPlane, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """The chart's reserved-metadata policy and binding, created on the API server (removed
    afterwards: it is cluster-wide and other tests run services under other accounts)."""
    if problem := missing_helm():
        pytest.fail(problem)
    docs = render(tmp_path, {}, release=RELEASE, namespace=NS)
    wanted = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    mine = [d for d in docs if d["kind"] in wanted]
    assert [d["kind"] for d in mine] == list(wanted), "the chart renders no policy"
    with kube_apiserver.settings.api_client() as api_client:
        api = client.AdmissionregistrationV1Api(api_client)
        api.create_validating_admission_policy(mine[0])  # type: ignore[arg-type]  # the client sends a dict body as it is
        api.create_validating_admission_policy_binding(mine[1])  # type: ignore[arg-type]  # the client sends a dict body as it is
        try:
            yield mine
        finally:
            api.delete_validating_admission_policy_binding(mine[1]["metadata"]["name"])
            api.delete_validating_admission_policy(mine[0]["metadata"]["name"])


def _as(plane: ControlPlane, token: str) -> KubeSettings:
    return dataclasses.replace(
        plane.settings, client_cert_file=None, client_key_file=None, token=token
    )


def _sandbox(name: str, **meta: Any) -> Resource:
    return Resource(
        "sandpod.dev/v1alpha1",
        "Sandbox",
        ObjectMeta(name=name, namespace=NS, **meta),
        spec={"permanent": False},
    )


async def _refused(store: KubeStore, obj: Resource, *, update: bool = False) -> StoreError:
    """``obj`` written as the tenant: the StoreError the API server answers (fails if allowed)."""
    try:
        await (store.update(obj) if update else store.create(obj))
    except StoreError as exc:
        return exc
    pytest.fail(f"the API server accepted {obj.metadata}")


async def test_a_tenant_cannot_set_reserved_labels_or_owner_references_on_the_api_server(
    kube_apiserver: ControlPlane, policy: list[dict[str, Any]]
) -> None:
    """As a tenant's ServiceAccount: a Sandbox with another pool's labels, a reserved
    annotation, a subdomain key, or an ownerReference naming the pool is refused at create;
    adding, changing or removing a reserved label on update is refused; plain labels work.
    The pool service's ServiceAccount (the chart's name) still creates members with them."""
    plane = kube_apiserver
    tenant_token = await asyncio.to_thread(grant, plane, "tenant-b", TENANT_RULES)
    pool_role = f"{RELEASE}-sandpod-pool"
    pool_token = await asyncio.to_thread(grant, plane, pool_role, TENANT_RULES)
    tenant, pool = KubeStore(_as(plane, tenant_token)), KubeStore(_as(plane, pool_token))
    tag = uuid.uuid4().hex[:6]
    forged = {POOL_LABEL: "acme--py", HASH_LABEL: "d0bb2ed4bfbf"}
    try:
        # the policy is live once it refuses a probe (admission plugins sync in the background)
        deadline = time.monotonic() + 30
        while True:
            probe = _sandbox(f"probe-{tag}-{int(time.monotonic() * 1000) % 100000}", labels=forged)
            try:
                await tenant.create(probe)
            except StoreError:
                break
            await tenant.delete("Sandbox", NS, probe.metadata.name)
            assert time.monotonic() < deadline, "the admission policy never took effect"
            await asyncio.sleep(0.2)
        owner = OwnerReference(
            "sandpod.dev/v1alpha1", "SandboxWarmPool", "acme--py", str(uuid.uuid4()), True
        )
        for obj, key in (
            (_sandbox(f"e1-{tag}", labels=forged), POOL_LABEL),
            (_sandbox(f"e2-{tag}", annotations={"sandpod.dev/owner": "x"}), "sandpod.dev/owner"),
            (_sandbox(f"e3-{tag}", labels={"x.sandpod.dev/a": "b"}), "x.sandpod.dev/a"),
            (_sandbox(f"e4-{tag}", owner_references=(owner,)), "ownerReferences"),
        ):
            err = await _refused(tenant, obj)
            assert key in err.message, err.message
            with pytest.raises(ResourceNotFound):
                await tenant.get("Sandbox", NS, obj.metadata.name)
        # plain labels still work; a reserved one cannot be added or changed later
        plain = await tenant.create(_sandbox(f"ok-{tag}", labels={"team": "b"}))
        meta = dataclasses.replace(plain.metadata, labels={**plain.metadata.labels, **forged})
        err = await _refused(tenant, dataclasses.replace(plain, metadata=meta), update=True)
        assert POOL_LABEL in err.message, err.message
        assert (await tenant.get("Sandbox", NS, plain.metadata.name)).metadata.labels == {
            "team": "b"
        }
        # the pool service writes them; a tenant may neither change nor strip them afterwards
        member = await pool.create(_sandbox(f"m-{tag}", labels=forged))
        assert member.metadata.labels[POOL_LABEL] == "acme--py"
        for labels in ({**forged, POOL_LABEL: "beta--py"}, {"team": "b"}):
            meta = dataclasses.replace(member.metadata, labels=labels)
            await _refused(tenant, dataclasses.replace(member, metadata=meta), update=True)
        assert (await tenant.get("Sandbox", NS, member.metadata.name)).metadata.labels == forged
        for name in (plain.metadata.name, member.metadata.name):
            await pool.delete("Sandbox", NS, name)
    finally:
        await tenant.close()
        await pool.close()


def test_the_policy_names_the_charts_service_accounts(policy: list[dict[str, Any]]) -> None:
    """Only the release's lifecycle and pool ServiceAccounts (and system:masters) are exempt."""
    (condition,) = policy[0]["spec"]["matchConditions"]
    for sa in ("lifecycle", "pool"):
        assert f"system:serviceaccount:{NS}:{RELEASE}-sandpod-{sa}" in condition["expression"]
    assert "gateway" not in condition["expression"]
