"""What a tenant-scoped control-plane request may name, shared by lifecycle and pool.

On ``<prefix>.api.t.<tenant>.<kind>.<verb>`` (:func:`sandpod_service.api.caller_tenant`) the
subject decides the tenant and so the namespace (every tenant's objects live in lifecycle's
``default`` namespace, named by :class:`sandpod_contract.tenancy.Scope`): names in the request
are taken as the tenant's own (a bare name or one of its ids), a namespace in the body is
overridden, lists are narrowed to the tenant's objects, and anything of another tenant answers
exactly like a missing object. On the global subjects (administrators, services) nothing
changes. Reserved keys are refused on both (:mod:`sandpod_contract.reserved`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any, TypeVar

from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.messages.sandboxes import ObjectsReply, Selection
from sandpod_contract.tenancy import LIFECYCLE_NAMESPACE, TENANT_LABEL, Scope
from sandpod_service.api import caller_tenant

__all__ = [
    "scope",
    "scoped_name",
    "scoped_object",
    "scoped_ref",
    "scoped_selection",
    "visible",
]

T = TypeVar("T")


def scope() -> Scope | None:
    """The calling tenant's scope; None on the global subjects."""
    tenant = caller_tenant()
    return None if tenant is None else Scope(tenant)


def scoped_ref(req: T, kind: str) -> T:
    """A Ref-like request (``name``, ``namespace``) as the calling tenant's: its id, lifecycle's
    namespace. Raises ResourceNotFound for a name that cannot be the tenant's."""
    s = scope()
    if s is None:
        return req
    name = str(getattr(req, "name", ""))
    sid = s.own_id(name)
    if sid is None:
        raise ResourceNotFound(f"{kind} {name!r} not found", kind=kind, name=name)
    return dataclasses.replace(req, name=sid, namespace=LIFECYCLE_NAMESPACE)  # type: ignore[type-var]


def scoped_name(s: Scope, kind: str, name: str, field: str) -> str:
    """The tenant's id for ``name`` in a body. Raises ResourceInvalid naming ``field``."""
    sid = s.own_id(name)
    if sid is None:
        raise ResourceInvalid(
            f"invalid {kind} name {name!r} for tenant {s.tenant!r}: a DNS label of at most "
            f"{s.max_name} characters without '--' (or one of the tenant's own ids)",
            field=field,
        )
    return sid


def scoped_object(raw: Mapping[str, Any], kind: str, prefix: str) -> Mapping[str, Any]:
    """A client's object (reserved keys already refused) as the calling tenant's: its id as name
    (``<prefix>-<random>`` when absent), lifecycle's namespace, the tenant label set."""
    s = scope()
    if s is None or not isinstance(raw, Mapping):
        return raw
    meta = raw.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise ResourceInvalid("metadata must be a map", field="metadata")
    name = str(meta.get("name") or f"{prefix}-{secrets.token_hex(5)}")
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise ResourceInvalid("metadata.labels must be a map", field="metadata.labels")
    out = {
        **meta,
        "name": scoped_name(s, kind, name, "metadata.name"),
        "namespace": LIFECYCLE_NAMESPACE,
        "labels": {**labels, TENANT_LABEL: s.tenant},
    }
    return {**raw, "metadata": out}


def scoped_selection(req: Selection) -> Selection:
    """A list request narrowed to the calling tenant's objects."""
    s = scope()
    if s is None:
        return req
    narrowed = s.selector(req.selector)
    return dataclasses.replace(req, namespace=LIFECYCLE_NAMESPACE, selector=narrowed)


def visible(reply: ObjectsReply) -> ObjectsReply:
    """A list reply with only the calling tenant's objects."""
    s = scope()
    if s is None:
        return reply
    items = tuple(i for i in reply.items if s.owns(str((i.get("metadata") or {}).get("name", ""))))
    return dataclasses.replace(reply, items=items)
