"""The CRD YAML in schemas/crds is the single source: the typed models mirror it exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.resources import (
    ConditionType,
    OperatingMode,
    Phase,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
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


WIRE_NAMES = {"template_ref": "templateRef", "egress": "network"}


def fields(cls: type) -> set[str]:
    return {WIRE_NAMES.get(f.name, camel(f.name)) for f in dataclasses.fields(cls)}


def test_crds_are_well_formed_with_status_printer_columns_and_short_names() -> None:
    """Both CRDs: group sandpod.dev, v1alpha1, status subresource, printer columns, short names."""
    for name, short in (("sandboxes", "sbx"), ("sandboxtemplates", "sbxt")):
        doc = crd(name)
        assert doc["kind"] == "CustomResourceDefinition"
        assert doc["metadata"]["name"] == f"{name}.sandpod.dev"
        assert doc["spec"]["group"] == "sandpod.dev"
        assert short in doc["spec"]["names"]["shortNames"]
        version = doc["spec"]["versions"][0]
        assert version["name"] == "v1alpha1" and version["storage"] is True
        assert version["subresources"] == {"status": {}}
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
        {"templateRef": {"name": "python"}, "shutdownTime": "2030-01-01T00:00:00Z",
         "idleTimeoutSeconds": 60, "env": [{"name": "A", "value": "1"}]}
    )  # fmt: skip
    assert SandboxSpec.from_dict(spec.to_dict()) == spec
    assert SandboxSpec.from_dict({}).permanent is False
    status = SandboxStatus.from_dict(
        {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    assert SandboxStatus.from_dict(status.to_dict()) == status
