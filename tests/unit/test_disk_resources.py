"""``resources.disk`` from a template to the local runtime: parsed, defaulted, or refused."""

from __future__ import annotations

import pytest

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_lifecycle.runtime.base import Resources
from sandpod_lifecycle.runtime.local_driver import _resources
from sandpod_lifecycle.settings import LifecycleSettings

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("disk", "expected"), [("64Mi", 64 * MiB), ("10Gi", 10 << 30), ("1G", 10**9), (None, None)]
)
def test_a_templates_disk_becomes_the_instances_disk_bytes(
    disk: str | None, expected: int | None
) -> None:
    """Kubernetes quantities become bytes; no disk leaves it to the driver's default."""
    raw = {"resources": {"disk": disk}} if disk else {}
    assert _resources(SandboxTemplateSpec.from_dict(raw)).disk_bytes == expected


@pytest.mark.parametrize("disk", ["1Mi", "15Mi", "1000", "10 Gi", "-1Gi", "1.5Gi"])
def test_an_unusable_disk_is_refused_when_the_template_is_applied(disk: str) -> None:
    """Below 16Mi (the smallest filesystem) or not a quantity: a typed error naming the field,
    not a sandbox that fails later."""
    with pytest.raises(ResourceInvalid) as err:
        SandboxTemplateSpec.from_dict({"resources": {"disk": disk}})
    assert err.value.details["field"] == "spec.resources.disk"


def test_resources_refuse_a_disk_below_the_minimum() -> None:
    """The driver's own spec refuses a disk too small to hold a filesystem."""
    with pytest.raises(ValueError, match="at least 16 MiB"):
        Resources(disk_bytes=MiB)


def test_the_disk_settings_are_read_as_quantities() -> None:
    """SANDPOD_DISK_DEFAULT/RESERVE take quantities; an unusable one names the variable."""
    s = LifecycleSettings.from_env(
        {
            "SANDPOD_DISK_DEFAULT": "1Gi",
            "SANDPOD_DISK_RESERVE": "0",
            "SANDPOD_DISK_PREALLOCATE": "true",
        }
    )
    assert (s.disk_default, s.disk_reserve, s.disk_preallocate) == (1 << 30, 0, True)
    assert LifecycleSettings.from_env({}).disk_default == 10 << 30
    for bad in ("1Mi", "lots"):
        with pytest.raises(ValueError, match="SANDPOD_DISK_DEFAULT"):
            LifecycleSettings.from_env({"SANDPOD_DISK_DEFAULT": bad})
