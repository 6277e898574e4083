"""The real API server enforces schemas/crds/: bad objects come back as typed ResourceInvalid."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s.envtest import REPO
from sandpod_contract.errors import ResourceExpired, ResourceInvalid
from sandpod_contract.snapshots import LayerRef, SnapshotPhase, SnapshotSpec, SnapshotStatus
from sandpod_kube import KINDS, KubeStore
from sandpod_store import ObjectMeta, Resource


def sandbox(namespace: str, spec: dict[str, Any], name: str = "s") -> Resource:
    return Resource(
        api_version="sandpod.dev/v1alpha1",
        kind="Sandbox",
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=spec,
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"templateRef": "python"}, "spec.templateRef"),  # an object, not a string
        ({"templateRef": {}}, "spec.templateRef.name"),  # required
        ({"templateRef": {"name": "Not_A_Name"}}, "spec.templateRef.name"),  # pattern
        ({"idleTimeoutSeconds": -1}, "spec.idleTimeoutSeconds"),  # minimum 0
        ({"operatingMode": "Sleeping"}, "spec.operatingMode"),  # enum
        ({"env": [{"name": "1BAD"}]}, "spec.env[0].name"),  # pattern
        ({"permanent": True, "shutdownTime": "2030-01-01T00:00:00Z"}, "spec"),  # CEL rule
    ],
)
async def test_schema_violations_are_refused_by_the_api_server(
    kube: KubeStore, namespace: str, spec: dict[str, Any], field: str
) -> None:
    """create of an object the CRD schema forbids raises ResourceInvalid naming the field."""
    with pytest.raises(ResourceInvalid) as info:
        await kube.create(sandbox(namespace, spec))
    assert field in info.value.details.get("field", ""), info.value
    assert info.value.__cause__ is not None  # mapped at the boundary, not invented client-side


async def test_status_schema_violations_are_refused(kube: KubeStore, namespace: str) -> None:
    """update_status with a phase outside the enum raises ResourceInvalid; status is unchanged."""
    created = await kube.create(sandbox(namespace, {"templateRef": {"name": "python"}}))
    bad = dataclasses.replace(created, status={"phase": "Sleeping"})
    with pytest.raises(ResourceInvalid):
        await kube.update_status(bad)
    assert (await kube.get("Sandbox", namespace, "s")).status == {}


async def test_defaults_come_from_the_crd(kube: KubeStore, namespace: str) -> None:
    """The API server applies the schema's defaults: nothing is permanent by accident."""
    created = await kube.create(sandbox(namespace, {}))
    assert created.spec["permanent"] is False and created.spec["operatingMode"] == "Running"


async def test_watch_from_a_compacted_revision_is_expired(kube: KubeStore) -> None:
    """A watch from a revision the API server no longer keeps raises ResourceExpired (410)."""
    events = kube.watch("Sandbox", None, from_revision=1)
    with pytest.raises(ResourceExpired):
        await anext(events)


def test_kind_table_matches_the_crds() -> None:
    """Every CRD in schemas/crds/ is in sandpod_kube.KINDS with its group, version and plural."""
    for path in sorted(Path(REPO / "schemas" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        names, spec = crd["spec"]["names"], crd["spec"]
        info = KINDS[names["kind"]]
        served = [v["name"] for v in spec["versions"] if v.get("storage")]
        assert (info.group, info.plural, [info.version]) == (spec["group"], names["plural"], served)


def _obj(kind: str, namespace: str, spec: dict[str, Any]) -> Resource:
    return Resource(
        api_version="sandpod.dev/v1alpha1",
        kind=kind,
        metadata=ObjectMeta(name="x", namespace=namespace),
        spec=spec,
    )


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("SandboxWarmPool", {"replicas": -1}, "spec.replicas"),
        ("SandboxWarmPool", {"replicas": 1001}, "spec.replicas"),
        ("SandboxWarmPool", {"updateStrategy": {"type": "Sometimes"}}, "spec.updateStrategy.type"),
        ("SandboxClaim", {"poolRef": {"name": "a"}, "templateRef": {"name": "b"}}, "spec"),
        ("SandboxClaim", {"lifetimeSeconds": 0}, "spec.lifetimeSeconds"),
        ("SandboxClaim", {"env": [{"name": "A B"}]}, "spec.env[0].name"),
    ],
)
async def test_pool_and_claim_schema_violations_are_refused_by_the_api_server(
    kube: KubeStore, namespace: str, kind: str, spec: dict[str, Any], field: str
) -> None:
    """The warm-pool and claim CRDs hold on the real API server what the models validate."""
    with pytest.raises(ResourceInvalid) as info:
        await kube.create(_obj(kind, namespace, spec))
    assert field in info.value.details.get("field", ""), info.value


async def test_pool_defaults_and_scale_subresource_come_from_the_crd(
    kube: KubeStore, namespace: str
) -> None:
    """A pool gets replicas 1 and RollingUpdate from the CRD's defaults."""
    created = await kube.create(_obj("SandboxWarmPool", namespace, {}))
    assert created.spec["replicas"] == 1
    assert created.spec["updateStrategy"] == {"type": "RollingUpdate"}


async def test_a_snapshot_round_trips_through_the_api_server(
    kube: KubeStore, namespace: str
) -> None:
    """A SandboxSnapshot and the status the controller writes (layers, sizes, Ready) are
    accepted and read back as written by the real API server; a layer without a sha256 digest
    or of an unknown part is refused."""
    obj = Resource(
        api_version="sandpod.dev/v1alpha1",
        kind="SandboxSnapshot",
        metadata=ObjectMeta(name="snap", namespace=namespace),
        spec=SnapshotSpec(source_ref="src", ttl_seconds=60, retain_count=3).to_dict(),
    )
    created = await kube.create(obj)
    layer = LayerRef(digest="sha256:" + "a" * 64, size=10, part="workspace", owner=200001)
    status = SnapshotStatus(
        phase=SnapshotPhase.READY, parent="p", layers=(layer,), size_bytes=10, total_bytes=10
    )
    stored = await kube.update_status(dataclasses.replace(created, status=status.to_dict()))
    assert SnapshotStatus.from_dict(stored.status) == status
    assert SnapshotSpec.from_dict(stored.spec).retain_count == 3
    for bad in ({"digest": "md5:x", "part": "workspace"}, {"digest": layer.digest, "part": "etc"}):
        with pytest.raises(ResourceInvalid):
            await kube.update_status(
                dataclasses.replace(stored, status={**status.to_dict(), "layers": [bad]})
            )
