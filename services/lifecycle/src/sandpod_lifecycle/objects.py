"""Sandbox and SandboxTemplate objects: defaults, validation and status helpers over the store's
generic :class:`~sandpod_store.Resource` (the typed view, :class:`~sandpod_store.SandboxView`,
lives in the store so the pool service reads Sandboxes the same way). No I/O here.

Safe defaults (agent-sandbox #1306 — nothing immortal by accident): a Sandbox without
``shutdownTime`` gets now + its template's ``defaultLifetimeSeconds`` unless ``permanent`` is
explicitly true; ``idleTimeoutSeconds`` defaults to the template's.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.resources import (
    API_VERSION,
    Condition,
    OperatingMode,
    Phase,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
)
from sandpod_contract.times import to_rfc3339
from sandpod_store import ObjectMeta, Resource, SandboxView, set_condition

__all__ = [
    "SANDBOX",
    "TEMPLATE",
    "SandboxView",
    "apply_defaults",
    "same_status",
    "sandbox_from_map",
    "template_from_map",
    "transition",
    "with_condition",
]

SANDBOX = "Sandbox"
TEMPLATE = "SandboxTemplate"
DEFAULT_TEMPLATE = SandboxTemplateSpec()


def _resource(raw: Mapping[str, Any], kind: str) -> Resource:
    if not isinstance(raw, Mapping):
        raise ResourceInvalid("object must be a map")
    if raw.get("kind", kind) != kind:
        raise ResourceInvalid(f"kind must be {kind}", field="kind")
    if raw.get("apiVersion", API_VERSION) != API_VERSION:
        raise ResourceInvalid(f"apiVersion must be {API_VERSION}", field="apiVersion")
    obj = Resource.from_dict({**raw, "apiVersion": API_VERSION, "kind": kind})
    if not obj.metadata.name:
        prefix = "sbx" if kind == SANDBOX else "tpl"
        meta = dataclasses.replace(obj.metadata, name=f"{prefix}-{uuid.uuid4().hex[:10]}")
        obj = dataclasses.replace(obj, metadata=meta)
    obj.validate()
    return obj


def sandbox_from_map(raw: Mapping[str, Any]) -> tuple[Resource, SandboxSpec]:
    """A Sandbox resource from a client's map, validated. Raises ResourceInvalid."""
    obj = _resource(raw, SANDBOX)
    return obj, SandboxSpec.from_dict(obj.spec)


def template_from_map(raw: Mapping[str, Any]) -> tuple[Resource, SandboxTemplateSpec]:
    obj = _resource(raw, TEMPLATE)
    return obj, SandboxTemplateSpec.from_dict(obj.spec)


def apply_defaults(
    obj: Resource, spec: SandboxSpec, template: SandboxTemplateSpec, now: float
) -> Resource:
    """Fill what the client left out from the template: lifetime (from ``now``, epoch
    seconds), idle timeout and idle policy."""
    out = dict(obj.spec)
    if not spec.permanent and not spec.shutdown_time:
        out["shutdownTime"] = to_rfc3339(now + template.default_lifetime_seconds)
    if spec.idle_timeout_seconds is None:
        out["idleTimeoutSeconds"] = template.idle_timeout_seconds
    if spec.idle_policy is None:
        out["idlePolicy"] = str(template.idle_policy)
    out.setdefault("operatingMode", str(OperatingMode.RUNNING))
    return dataclasses.replace(obj, spec=out)


def with_condition(status: SandboxStatus, cond: Condition, now: float) -> SandboxStatus:
    """``status`` with ``cond`` set (lastTransitionTime kept when the status value is unchanged)."""
    return dataclasses.replace(status, conditions=set_condition(status.conditions, cond, now))


def new_meta(name: str, namespace: str) -> ObjectMeta:
    return ObjectMeta(name=name, namespace=namespace)


def phase_of(obj: Resource) -> Phase:
    return SandboxStatus.from_dict(obj.status).phase


def _conds(status: SandboxStatus) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in status.conditions}


def same_status(old: SandboxStatus, new: SandboxStatus) -> bool:
    """Whether writing ``new`` over ``old`` would change nothing but condition order."""
    return dataclasses.replace(old, conditions=()) == dataclasses.replace(
        new, conditions=()
    ) and _conds(old) == _conds(new)


def transition(old: SandboxStatus, phase: Phase, cond: Condition | None) -> bool:
    """Whether this step is a transition worth an event: the phase changes, or the step's
    condition changes its status or reason (a message alone is not a transition)."""
    if phase is not old.phase:
        return True
    before = _conds(old).get(cond.type) if cond is not None else None
    return cond is not None and (before is None or before[:2] != (cond.status, cond.reason))
