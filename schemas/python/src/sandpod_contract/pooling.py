"""Typed models of ``SandboxWarmPool`` and ``SandboxClaim`` (``schemas/crds/``, v1alpha1).

Like :mod:`sandpod_contract.resources`, the CRD YAML is the single source; these dataclasses
mirror its ``spec`` and ``status`` field for field (``tests/contract/test_crds.py`` checks them),
convert to and from the camelCase wire maps and validate what the schema validates, raising
:class:`ResourceInvalid` naming the field.

How the pool service uses the objects' labels (stable: clients may select on them):

- ``sandpod.dev/pool``: the pool a member Sandbox was made for;
- ``sandpod.dev/template-hash``: the template revision a member was made from (stale members are
  replaced by the update strategy);
- ``sandpod.dev/claim``: set on a Sandbox exactly when a claim owns it. A pool member without it is
  warm and free; binding is the optimistic-concurrency update that sets it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from sandpod_contract.resources import (
    Condition,
    EnvVar,
    check_int,
    check_name,
    check_time,
    field_error,
)

__all__ = [
    "BOUND_AT_ANNOTATION",
    "CLAIM_LABEL",
    "HASH_LABEL",
    "MAX_REPLICAS",
    "POOL_LABEL",
    "ClaimConditionType",
    "ClaimPhase",
    "ClaimReason",
    "ClaimSpec",
    "ClaimStatus",
    "PoolConditionType",
    "PoolReason",
    "UpdateStrategy",
    "WarmPoolSpec",
    "WarmPoolStatus",
]

POOL_LABEL = "sandpod.dev/pool"
HASH_LABEL = "sandpod.dev/template-hash"
CLAIM_LABEL = "sandpod.dev/claim"
# Wall clock (Unix seconds) when a claim bound the sandbox: the claim's start of activity for
# the lifecycle's idle clock, and the age by which the pool service judges orphans.
BOUND_AT_ANNOTATION = "sandpod.dev/bound-at"
MAX_REPLICAS = 1000


class UpdateStrategy(enum.StrEnum):
    """What a template change does to warm members made from the old one."""

    ROLLING_UPDATE = "RollingUpdate"  # replace stale members as fresh ones become ready
    RECREATE = "Recreate"  # delete every stale member at once, then refill
    ON_CLAIM = "OnClaim"  # keep them; only new members use the new template


class PoolConditionType(enum.StrEnum):
    READY = "Ready"  # every replica is ready and current
    REPLICA_FAILURE = "ReplicaFailure"  # members cannot be created or do not become ready


class PoolReason(enum.StrEnum):
    ALL_READY = "AllReplicasReady"
    FILLING = "Filling"
    ROLLING = "RollingUpdate"
    MEMBERS_FAILING = "MembersFailing"
    TEMPLATE_NOT_FOUND = "TemplateNotFound"
    NO_FAILURES = "NoFailures"


class ClaimPhase(enum.StrEnum):
    PENDING = "Pending"
    BOUND = "Bound"
    FAILED = "Failed"
    RELEASED = "Released"


class ClaimConditionType(enum.StrEnum):
    BOUND = "Bound"
    READY = "Ready"


class ClaimReason(enum.StrEnum):
    WARM = "WarmPoolBind"  # bound to a ready warm member
    POOL_EXHAUSTED = "PoolExhausted"  # no free warm member: a cold create was made instead
    NO_POOL = "NoPool"  # the claim names a template, not a pool: a cold create
    POOL_NOT_FOUND = "PoolNotFound"
    SANDBOX_READY = "SandboxReady"
    SANDBOX_STARTING = "SandboxStarting"
    SANDBOX_FAILED = "SandboxFailed"
    SANDBOX_GONE = "SandboxGone"  # the bound sandbox expired or was deleted


@dataclasses.dataclass(frozen=True, slots=True)
class WarmPoolSpec:
    template_ref: str | None = None  # wire: templateRef.name (None: the default template)
    replicas: int = 1
    update_strategy: UpdateStrategy = UpdateStrategy.ROLLING_UPDATE  # wire: updateStrategy.type

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WarmPoolSpec:
        """Validate and convert a pool ``spec``. Raises ResourceInvalid naming the field."""
        strategy = raw.get("updateStrategy") or {}
        if not isinstance(strategy, Mapping):
            raise field_error("spec.updateStrategy", "must be a map with 'type'")
        try:
            kind = UpdateStrategy(strategy.get("type", UpdateStrategy.ROLLING_UPDATE))
        except ValueError as exc:
            raise field_error(
                "spec.updateStrategy.type", f"must be one of {[s.value for s in UpdateStrategy]}"
            ) from exc
        replicas = check_int("spec.replicas", raw.get("replicas", 1), 0)
        if replicas > MAX_REPLICAS:
            raise field_error("spec.replicas", f"must be <= {MAX_REPLICAS}")
        return cls(
            template_ref=_ref("spec.templateRef", raw.get("templateRef")),
            replicas=replicas,
            update_strategy=kind,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "replicas": self.replicas,
            "updateStrategy": {"type": str(self.update_strategy)},
        }
        if self.template_ref:
            out["templateRef"] = {"name": self.template_ref}
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class WarmPoolStatus:
    replicas: int = 0  # members that exist and are free (ready or not)
    ready_replicas: int = 0  # free members that are ready
    available_replicas: int = 0  # free, ready and made from the current template
    observed_generation: int = 0
    selector: str = ""  # label selector of the free members (scale subresource)
    template_hash: str = ""
    conditions: tuple[Condition, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WarmPoolStatus:
        return cls(
            replicas=int(raw.get("replicas", 0)),
            ready_replicas=int(raw.get("readyReplicas", 0)),
            available_replicas=int(raw.get("availableReplicas", 0)),
            observed_generation=int(raw.get("observedGeneration", 0)),
            selector=str(raw.get("selector", "")),
            template_hash=str(raw.get("templateHash", "")),
            conditions=tuple(Condition.from_dict(c) for c in raw.get("conditions") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "readyReplicas": self.ready_replicas,
            "availableReplicas": self.available_replicas,
            "observedGeneration": self.observed_generation,
            "selector": self.selector,
            "templateHash": self.template_hash,
            "conditions": [c.to_dict() for c in self.conditions],
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimSpec:
    pool_ref: str | None = None  # wire: poolRef.name
    template_ref: str | None = None  # wire: templateRef.name (no pool: always a cold create)
    lifetime_seconds: int | None = None  # default: the template's defaultLifetimeSeconds
    idle_timeout_seconds: int | None = None  # default: the template's
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env: tuple[EnvVar, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClaimSpec:
        """Validate and convert a claim ``spec``. Raises ResourceInvalid naming the field."""
        pool = _ref("spec.poolRef", raw.get("poolRef"))
        template = _ref("spec.templateRef", raw.get("templateRef"))
        if pool is not None and template is not None:
            raise field_error("spec", "name a poolRef or a templateRef, not both")
        lifetime = raw.get("lifetimeSeconds")
        idle = raw.get("idleTimeoutSeconds")
        labels = raw.get("labels") or {}
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise field_error("spec.labels", "must be a map of strings")
        return cls(
            pool_ref=pool,
            template_ref=template,
            lifetime_seconds=None
            if lifetime is None
            else check_int("spec.lifetimeSeconds", lifetime, 1),
            idle_timeout_seconds=None
            if idle is None
            else check_int("spec.idleTimeoutSeconds", idle, 0),
            labels=dict(labels),
            env=EnvVar.parse("spec.env", raw.get("env")),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.pool_ref:
            out["poolRef"] = {"name": self.pool_ref}
        if self.template_ref:
            out["templateRef"] = {"name": self.template_ref}
        if self.lifetime_seconds is not None:
            out["lifetimeSeconds"] = self.lifetime_seconds
        if self.idle_timeout_seconds is not None:
            out["idleTimeoutSeconds"] = self.idle_timeout_seconds
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.env:
            out["env"] = [{"name": e.name, "value": e.value} for e in self.env]
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimStatus:
    phase: ClaimPhase = ClaimPhase.PENDING
    sandbox: str | None = None  # the bound Sandbox's name (= its id on the data plane)
    shutdown_time: str | None = None
    observed_generation: int = 0
    conditions: tuple[Condition, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClaimStatus:
        try:
            phase = ClaimPhase(raw.get("phase", "Pending"))
        except ValueError as exc:
            raise field_error("status.phase", "unknown claim phase") from exc
        shutdown = raw.get("shutdownTime")
        return cls(
            phase=phase,
            sandbox=raw.get("sandbox"),
            shutdown_time=None if shutdown is None else check_time("status.shutdownTime", shutdown),
            observed_generation=int(raw.get("observedGeneration", 0)),
            conditions=tuple(Condition.from_dict(c) for c in raw.get("conditions") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": str(self.phase),
            "observedGeneration": self.observed_generation,
            "conditions": [c.to_dict() for c in self.conditions],
        }
        if self.sandbox:
            out["sandbox"] = self.sandbox
        if self.shutdown_time:
            out["shutdownTime"] = self.shutdown_time
        return out

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


def _ref(field: str, raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise field_error(f"{field}.name", "must be a DNS label")
    return check_name(f"{field}.name", raw.get("name", ""))
