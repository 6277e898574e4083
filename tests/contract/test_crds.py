"""The CRD YAML in schemas/crds is the single source: the typed models mirror it exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.pooling import (
    ClaimConditionType,
    ClaimPhase,
    ClaimReason,
    ClaimSpec,
    ClaimStatus,
    PoolConditionType,
    PoolReason,
    UpdateStrategy,
    WarmPoolSpec,
    WarmPoolStatus,
)
from sandpod_contract.resources import (
    ConditionType,
    OperatingMode,
    Phase,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
)
from sandpod_contract.volumes import (
    MAX_VOLUMES,
    SandboxVolumeSpec,
    SandboxVolumeStatus,
    VolumeMount,
    VolumePhase,
)

CRDS = Path(__file__).resolve().parents[2] / "schemas" / "crds"


@pytest.fixture(scope="session")
def _session_daemons() -> None:
    """No nats-server or execd: these tests are pure (overrides the root conftest's autouse one)."""


def crd(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / f"{name}.sandpod.dev.yaml").read_text())
    return doc


def schema(name: str) -> dict[str, Any]:
    version = crd(name)["spec"]["versions"][0]
    props: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]
    return props


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


WIRE_NAMES = {
    "template_ref": "templateRef",
    "pool_ref": "poolRef",
    "egress": "network",
    "update_strategy": "updateStrategy",
}


def fields(cls: type) -> set[str]:
    return {WIRE_NAMES.get(f.name, camel(f.name)) for f in dataclasses.fields(cls)}


def test_crds_are_well_formed_with_status_printer_columns_and_short_names() -> None:
    """Both CRDs: group sandpod.dev, v1alpha1, status subresource, printer columns, short names."""
    for name, short in (
        ("sandboxes", "sbx"),
        ("sandboxtemplates", "sbxt"),
        ("sandboxwarmpools", "sbxpool"),
        ("sandboxclaims", "sbxclaim"),
        ("sandboxvolumes", "sbxvol"),
    ):
        doc = crd(name)
        assert doc["kind"] == "CustomResourceDefinition"
        assert doc["metadata"]["name"] == f"{name}.sandpod.dev"
        assert doc["spec"]["group"] == "sandpod.dev"
        assert short in doc["spec"]["names"]["shortNames"]
        version = doc["spec"]["versions"][0]
        assert version["name"] == "v1alpha1" and version["storage"] is True
        assert version["subresources"]["status"] == {}
        assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Age"}
    columns = {
        c["name"] for c in crd("sandboxes")["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert {"Phase", "Ready", "Template", "Expires"} <= columns


def test_sandbox_models_mirror_the_crd() -> None:
    """SandboxSpec/SandboxStatus fields, enums and condition types match the YAML."""
    props = schema("sandboxes")
    assert fields(SandboxSpec) == set(props["spec"]["properties"])
    assert fields(SandboxStatus) == set(props["status"]["properties"])
    status = props["status"]["properties"]
    assert status["phase"]["enum"] == [p.value for p in Phase]
    cond = status["conditions"]["items"]["properties"]
    assert cond["type"]["enum"] == [c.value for c in ConditionType]
    assert props["spec"]["properties"]["operatingMode"]["enum"] == [m.value for m in OperatingMode]


def test_template_model_mirrors_the_crd() -> None:
    """SandboxTemplateSpec fields and defaults match the YAML."""
    spec = schema("sandboxtemplates")["spec"]["properties"]
    assert fields(SandboxTemplateSpec) == set(spec)
    defaults = SandboxTemplateSpec()
    assert spec["defaultLifetimeSeconds"]["default"] == defaults.default_lifetime_seconds
    assert spec["idleTimeoutSeconds"]["default"] == defaults.idle_timeout_seconds
    assert spec["user"]["default"] == defaults.user


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"idleTimeoutSeconds": -1}, "spec.idleTimeoutSeconds"),
        ({"idleTimeoutSeconds": "5"}, "spec.idleTimeoutSeconds"),
        ({"permanent": True, "shutdownTime": "2030-01-01T00:00:00Z"}, "spec"),
        ({"shutdownTime": "tomorrow"}, "spec.shutdownTime"),
        ({"templateRef": {"name": "Bad_Name"}}, "spec.templateRef.name"),
        ({"operatingMode": "Sleeping"}, "spec.operatingMode"),
        ({"env": [{"name": "1BAD"}]}, "spec.env[0].name"),
        ({"permanent": "yes"}, "spec.permanent"),
    ],
)
def test_invalid_sandbox_specs_name_the_field(raw: dict[str, Any], field: str) -> None:
    """Schema violations are ResourceInvalid with the offending field."""
    with pytest.raises(ResourceInvalid) as info:
        SandboxSpec.from_dict(raw)
    assert info.value.details["field"] == field


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"resources": {"memory": "lots"}}, "spec.resources.memory"),
        ({"resources": {"pids": 0}}, "spec.resources.pids"),
        ({"resources": {"cpu": "-1"}}, "spec.resources.cpu"),
        ({"defaultLifetimeSeconds": 0}, "spec.defaultLifetimeSeconds"),
        ({"network": {"egress": "everything"}}, "spec.network.egress"),
    ],
)
def test_invalid_template_specs_name_the_field(raw: dict[str, Any], field: str) -> None:
    """Negative limits and malformed quantities are refused with the field named."""
    with pytest.raises(ResourceInvalid) as info:
        SandboxTemplateSpec.from_dict(raw)
    assert info.value.details["field"] == field


def test_spec_round_trips_and_defaults_are_safe() -> None:
    """to_dict/from_dict round-trip; a spec that says nothing is not permanent."""
    spec = SandboxSpec.from_dict(
        {
            "templateRef": {"name": "python"},
            "shutdownTime": "2030-01-01T00:00:00Z",
            "idleTimeoutSeconds": 60,
            "env": [{"name": "A", "value": "1"}],
        }
    )
    assert SandboxSpec.from_dict(spec.to_dict()) == spec
    assert SandboxSpec.from_dict({}).permanent is False
    status = SandboxStatus.from_dict(
        {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    assert SandboxStatus.from_dict(status.to_dict()) == status


def test_warm_pool_model_mirrors_the_crd_and_has_a_scale_subresource() -> None:
    """WarmPoolSpec/Status fields, strategy and condition enums match; scale paths exist."""
    props = schema("sandboxwarmpools")
    assert fields(WarmPoolSpec) == set(props["spec"]["properties"])
    assert fields(WarmPoolStatus) == set(props["status"]["properties"])
    strategy = props["spec"]["properties"]["updateStrategy"]["properties"]["type"]
    assert strategy["enum"] == [s.value for s in UpdateStrategy]
    assert strategy["default"] == WarmPoolSpec().update_strategy
    cond = props["status"]["properties"]["conditions"]
    assert cond["items"]["properties"]["type"]["enum"] == [c.value for c in PoolConditionType]
    assert all(r.value in cond["description"] for r in PoolReason)
    scale = crd("sandboxwarmpools")["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_claim_model_mirrors_the_crd() -> None:
    """ClaimSpec/Status fields, phases, condition types and every stable reason are in the YAML."""
    props = schema("sandboxclaims")
    assert fields(ClaimSpec) == set(props["spec"]["properties"])
    assert fields(ClaimStatus) == set(props["status"]["properties"])
    assert props["status"]["properties"]["phase"]["enum"] == [p.value for p in ClaimPhase]
    cond = props["status"]["properties"]["conditions"]
    assert cond["items"]["properties"]["type"]["enum"] == [c.value for c in ClaimConditionType]
    assert all(r.value in cond["description"] for r in ClaimReason)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"replicas": -1}, "spec.replicas"),
        ({"replicas": 1001}, "spec.replicas"),
        ({"replicas": "3"}, "spec.replicas"),
        ({"updateStrategy": {"type": "Sometimes"}}, "spec.updateStrategy.type"),
        ({"templateRef": {"name": "No_Such"}}, "spec.templateRef.name"),
    ],
)
def test_invalid_pool_specs_name_the_field(raw: dict[str, Any], field: str) -> None:
    """Negative or absurd replicas and unknown strategies are refused with the field named."""
    with pytest.raises(ResourceInvalid) as info:
        WarmPoolSpec.from_dict(raw)
    assert info.value.details["field"] == field


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"poolRef": {"name": "a"}, "templateRef": {"name": "b"}}, "spec"),
        ({"lifetimeSeconds": 0}, "spec.lifetimeSeconds"),
        ({"idleTimeoutSeconds": -5}, "spec.idleTimeoutSeconds"),
        ({"labels": {"a": 1}}, "spec.labels"),
        ({"env": [{"name": "A B"}]}, "spec.env[0].name"),
        ({"poolRef": "python"}, "spec.poolRef.name"),
    ],
)
def test_invalid_claim_specs_name_the_field(raw: dict[str, Any], field: str) -> None:
    """A claim naming both a pool and a template, or a zero lifetime, is refused."""
    with pytest.raises(ResourceInvalid) as info:
        ClaimSpec.from_dict(raw)
    assert info.value.details["field"] == field


def test_pool_and_claim_round_trip() -> None:
    """to_dict/from_dict round-trip for pool and claim specs and statuses."""
    pool = WarmPoolSpec.from_dict(
        {"templateRef": {"name": "py"}, "replicas": 5, "updateStrategy": {"type": "Recreate"}}
    )
    assert WarmPoolSpec.from_dict(pool.to_dict()) == pool
    claim = ClaimSpec.from_dict(
        {
            "poolRef": {"name": "py"},
            "lifetimeSeconds": 60,
            "idleTimeoutSeconds": 0,
            "labels": {"agent": "a1"},
            "env": [{"name": "TOKEN", "value": "x"}],
        }
    )
    assert ClaimSpec.from_dict(claim.to_dict()) == claim
    status = ClaimStatus.from_dict({"phase": "Bound", "sandbox": "sbx-1"})
    assert ClaimStatus.from_dict(status.to_dict()) == status
    assert WarmPoolStatus.from_dict(WarmPoolStatus(replicas=3).to_dict()).replicas == 3


KEYWORDS = {
    "type",
    "description",
    "properties",
    "items",
    "required",
    "enum",
    "default",
    "minimum",
    "maximum",
    "pattern",
    "maxItems",
    "maxLength",
    "format",
    "additionalProperties",
    "x-kubernetes-validations",
}


def _stray(schema: Any, path: str) -> list[str]:
    if not isinstance(schema, dict):
        return [path]
    out = [f"{path}.{k}" for k in schema if k not in KEYWORDS]
    for name, sub in (schema.get("properties") or {}).items():
        out += _stray(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += _stray(schema["items"], f"{path}[]")
    return out


@pytest.mark.parametrize(
    "name",
    ["sandboxes", "sandboxtemplates", "sandboxwarmpools", "sandboxclaims", "sandboxvolumes"],
)
def test_crd_schemas_use_only_openapi_keywords(name: str) -> None:
    """No stray keys (a comma in an unquoted YAML flow description once made one, which the
    real API server refused)."""
    version = crd(name)["spec"]["versions"][0]
    assert _stray(version["schema"]["openAPIV3Schema"], name) == []


def test_volume_model_mirrors_the_crd() -> None:
    """SandboxVolumeSpec/Status fields and phases, and spec.volumes entries, match the YAML."""
    props = schema("sandboxvolumes")
    assert fields(SandboxVolumeSpec) == set(props["spec"]["properties"])
    assert fields(SandboxVolumeStatus) == set(props["status"]["properties"])
    assert props["status"]["properties"]["phase"]["enum"] == [p.value for p in VolumePhase]
    for kind in ("sandboxes", "sandboxtemplates"):
        entry = schema(kind)["spec"]["properties"]["volumes"]
        assert entry["maxItems"] == MAX_VOLUMES
        assert fields(VolumeMount) == set(entry["items"]["properties"])
    spec = SandboxVolumeSpec.from_dict({"size": "1Gi", "storageClassName": "fast"})
    assert SandboxVolumeSpec.from_dict(spec.to_dict()) == spec
    status = SandboxVolumeStatus(phase=VolumePhase.IN_USE, readers=("a", "b"), used_bytes=7)
    assert SandboxVolumeStatus.from_dict(status.to_dict()) == status
