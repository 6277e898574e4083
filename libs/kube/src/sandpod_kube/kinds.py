"""Which REST resource serves each Sandpod kind: ``Sandbox`` -> ``sandpod.dev/v1alpha1 sandboxes``.

The store interface speaks kinds (``Sandbox``); the API server speaks group/version/plural
(``/apis/sandpod.dev/v1alpha1/namespaces/<ns>/sandboxes``). The table mirrors ``schemas/crds/``
(``tests/k8s`` checks it against the YAML), so a kind without a CRD is refused as invalid before any
request is sent, with no discovery round trip.
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.errors import ResourceInvalid

__all__ = ["KINDS", "KindInfo", "resolve"]


@dataclasses.dataclass(frozen=True, slots=True)
class KindInfo:
    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


_GROUP, _VERSION = "sandpod.dev", "v1alpha1"

KINDS: dict[str, KindInfo] = {
    info.kind: info
    for info in (
        KindInfo("Sandbox", _GROUP, _VERSION, "sandboxes"),
        KindInfo("SandboxTemplate", _GROUP, _VERSION, "sandboxtemplates"),
        KindInfo("SandboxWarmPool", _GROUP, _VERSION, "sandboxwarmpools"),
        KindInfo("SandboxClaim", _GROUP, _VERSION, "sandboxclaims"),
        KindInfo("SandboxSnapshot", _GROUP, _VERSION, "sandboxsnapshots"),
        KindInfo("SandboxVolume", _GROUP, _VERSION, "sandboxvolumes"),
    )
}


def resolve(kind: str, api_version: str | None = None) -> KindInfo:
    """The REST coordinates of ``kind``.

    Raises:
        ResourceInvalid: no CRD serves this kind, or ``api_version`` names another group/version.
    """
    info = KINDS.get(kind)
    if info is None:
        raise ResourceInvalid(
            f"kind {kind!r} is not a Sandpod resource (known: {', '.join(sorted(KINDS))})",
            field="kind",
        )
    if api_version and api_version != info.api_version:
        raise ResourceInvalid(
            f"{kind} is served as {info.api_version}, not {api_version}", field="apiVersion"
        )
    return info
