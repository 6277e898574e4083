"""Which sandboxes a tenant owns: a reversible map between (tenant, name) and sandbox ids.

Why not simply ``namespace = tenant``: today lifecycle reconciles only namespace ``default``
(its work queue carries names, not namespaces) and a sandbox's data-plane id is its bare name,
so two namespaces could not both hold ``foo`` without sharing ``<prefix>.sbx.foo.>``. Until the
contract gives sandboxes a globally unique id, every tenant's object lives in lifecycle's
``default`` namespace and the tenant is encoded in the name:

    tenant "default", name "foo"  ->  sandbox id "foo"          (names may not contain "--")
    tenant "acme",    name "foo"  ->  sandbox id "acme--foo"    (tenant ids never contain "--")

The map is injective, so a tenant can only ever address ids of its own: another tenant's sandbox
is not reachable by any name, and asking for it looks exactly like asking for a missing one.
Objects also get the label ``sandpod.dev/tenant`` (reserved: set by the service that takes the
tenant from the request's subject, ``<prefix>.api.t.<tenant>.<kind>.<verb>``; used to narrow
lists). The gateway shows them to its clients with ``metadata.name`` = the tenant's own name and
``metadata.namespace`` = the tenant; on the bus a tenant sees the ids (its data-plane names).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "DEFAULT_TENANT",
    "LIFECYCLE_NAMESPACE",
    "TENANT_LABEL",
    "Scope",
    "validate_tenant",
]

LIFECYCLE_NAMESPACE = "default"
TENANT_LABEL = "sandpod.dev/tenant"
DEFAULT_TENANT = "default"
SEP = "--"
MAX_TENANT = 30
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def validate_tenant(tenant: str) -> str:
    """``tenant`` if usable as a tenant id (a short DNS label without "--"), else ValueError."""
    if not _LABEL.fullmatch(tenant) or SEP in tenant or len(tenant) > MAX_TENANT:
        raise ValueError(
            f"invalid tenant {tenant!r}: 1-{MAX_TENANT} lowercase letters, digits and single "
            "'-', starting and ending with a letter or digit"
        )
    return tenant


class Scope:
    """One tenant's view of sandbox names."""

    def __init__(self, tenant: str) -> None:
        self.tenant = validate_tenant(tenant)
        self._head = "" if tenant == DEFAULT_TENANT else tenant + SEP

    def sandbox_id(self, name: str) -> str | None:
        """The sandbox id of this tenant's ``name``; None if no sandbox of it can have that name."""
        if SEP in name:
            return None
        sid = self._head + name
        return sid if _LABEL.fullmatch(sid) else None

    def own_id(self, name_or_id: str) -> str | None:
        """The sandbox id for what a tenant's bus request names: one of its ids as it is, or
        its bare name mapped to its id; None when neither (another tenant's id, or invalid)."""
        if not isinstance(name_or_id, str) or not name_or_id:
            return None
        if self.name_of(name_or_id) is not None:
            return name_or_id
        return self.sandbox_id(name_or_id)

    def owns(self, sandbox_id: str) -> bool:
        """Whether ``sandbox_id`` is one of this tenant's ids."""
        return isinstance(sandbox_id, str) and self.name_of(sandbox_id) is not None

    def name_of(self, sandbox_id: str) -> str | None:
        """This tenant's name for ``sandbox_id``; None if the id is not this tenant's."""
        if not self._head:
            return None if SEP in sandbox_id else sandbox_id
        if sandbox_id.startswith(self._head) and SEP not in sandbox_id[len(self._head) :]:
            return sandbox_id[len(self._head) :] or None
        return None

    @property
    def max_name(self) -> int:
        return 63 - len(self._head)

    def selector(self, selector: str | None) -> str | None:
        """The client's label selector narrowed to this tenant's objects (the default tenant's
        objects may predate the gateway and lack the label: those are filtered by name)."""
        if not self._head:
            return selector
        own = f"{TENANT_LABEL}={self.tenant}"
        return f"{own},{selector}" if selector else own

    def inbound(self, obj: dict[str, Any], name: str) -> dict[str, Any]:
        """A client's object with its tenant's id as name, in lifecycle's namespace (the
        tenant label is the service's to set). Raises ValueError for a name no id maps to."""
        meta = dict(obj.get("metadata") or {})
        sid = self.sandbox_id(name)
        if sid is None:
            raise ValueError(f"no sandbox id of tenant {self.tenant!r} is named {name!r}")
        meta.update(name=sid, namespace=LIFECYCLE_NAMESPACE)
        return {**obj, "metadata": meta}

    def outbound(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Lifecycle's object as this tenant sees it; None if it is not this tenant's."""
        meta = dict(obj.get("metadata") or {})
        name = self.name_of(str(meta.get("name", "")))
        if name is None or meta.get("namespace", LIFECYCLE_NAMESPACE) != LIFECYCLE_NAMESPACE:
            return None
        meta.update(name=name, namespace=self.tenant)
        out = {**obj, "metadata": meta}
        spec = obj.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("volumes"), list):  # volume ids too
            vols = [
                {**v, "name": self.name_of(str(v.get("name", ""))) or v.get("name")}
                for v in spec["volumes"]
                if isinstance(v, dict)
            ]
            out["spec"] = {**spec, "volumes": vols}
        return out
