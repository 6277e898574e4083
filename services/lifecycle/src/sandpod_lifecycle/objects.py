"""Sandbox and SandboxTemplate objects: defaults, validation and typed views over the store's
generic :class:`~sandpod_store.Resource`. No I/O here.

Safe defaults (agent-sandbox #1306 — nothing immortal by accident): a Sandbox without
``shutdownTime`` gets now + its template's ``defaultLifetimeSeconds`` unless ``permanent`` is
explicitly true; ``idleTimeoutSeconds`` defaults to the template's.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.resources import (
    API_VERSION,
    Condition,
    Phase,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
)
from sandpod_store import ObjectMeta, Resource

__all__ = [
    "SANDBOX",
    "TEMPLATE",
    "SandboxView",
    "apply_defaults",
    "iso",
    "now",
    "parse_time",
    "same_status",
    "sandbox_from_map",
    "template_from_map",
    "transition",
    "with_condition",
]

SANDBOX = "Sandbox"
TEMPLATE = "SandboxTemplate"
DEFAULT_TEMPLATE = SandboxTemplateSpec()


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def iso(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


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


def apply_defaults(obj: Resource, spec: SandboxSpec, template: SandboxTemplateSpec) -> Resource:
    """Fill what the client left out from the template: lifetime and idle timeout."""
    out = dict(obj.spec)
    if not spec.permanent and not spec.shutdown_time:
        expiry = now() + datetime.timedelta(seconds=template.default_lifetime_seconds)
        out["shutdownTime"] = iso(expiry)
    if spec.idle_timeout_seconds is None:
        out["idleTimeoutSeconds"] = template.idle_timeout_seconds
    out.setdefault("operatingMode", "Running")
    return dataclasses.replace(obj, spec=out)


def with_condition(status: SandboxStatus, cond: Condition) -> SandboxStatus:
    """``status`` with ``cond`` set (lastTransitionTime kept when the status value is unchanged)."""
    others = [c for c in status.conditions if c.type != cond.type]
    old = next((c for c in status.conditions if c.type == cond.type), None)
    stamp = old.last_transition_time if old and old.status == cond.status else iso(now())
    return dataclasses.replace(
        status, conditions=(*others, dataclasses.replace(cond, last_transition_time=stamp))
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxView:
    """A stored Sandbox with its spec and status parsed."""

    obj: Resource
    spec: SandboxSpec
    status: SandboxStatus

    @classmethod
    def of(cls, obj: Resource) -> SandboxView:
        return cls(obj, SandboxSpec.from_dict(obj.spec), SandboxStatus.from_dict(obj.status))

    @property
    def name(self) -> str:
        return self.obj.metadata.name

    @property
    def namespace(self) -> str:
        return self.obj.metadata.namespace

    @property
    def key(self) -> str:
        """``namespace/name``: the reconciler's work-queue key."""
        return f"{self.namespace}/{self.name}"

    @property
    def deleting(self) -> bool:
        return self.obj.metadata.annotations.get("sandpod.dev/delete-requested") == "true"

    def with_status(self, status: SandboxStatus) -> Resource:
        return dataclasses.replace(self.obj, status=status.to_dict())


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
