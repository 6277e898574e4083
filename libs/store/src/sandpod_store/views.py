"""Typed views of the Sandbox and SandboxClaim objects the lifecycle and pool services share.

The store keeps every object as a generic :class:`~sandpod_store.Resource` whose ``spec`` and
``status`` are wire maps; the services decide on phases, conditions and marks. This module is
the one place that turns the maps into the contract's types (:class:`SandboxSpec`,
:class:`SandboxStatus`, :class:`ClaimSpec`, :class:`ClaimStatus`) and back, so nobody above it
edits a status dict or compares a phase string: they read ``view.status.phase is Phase.RUNNING``
and write ``view.with_status(status)``. Conditions are set with :func:`set_condition`, which
keeps a condition's ``lastTransitionTime`` while its status is unchanged (Kubernetes' rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from sandpod_contract.builds import BuildPhase, BuildStatus
from sandpod_contract.pooling import BOUND_AT_ANNOTATION, ClaimSpec, ClaimStatus
from sandpod_contract.resources import (
    Condition,
    ConditionType,
    Phase,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplateSpec,
)
from sandpod_contract.times import to_rfc3339
from sandpod_store.model import Resource

__all__ = [
    "DELETE_ANNOTATION",
    "ClaimView",
    "SandboxView",
    "bound_at",
    "built_template",
    "condition",
    "set_condition",
]

DELETE_ANNOTATION = "sandpod.dev/delete-requested"  # the lifecycle API's delete mark


def built_template(obj: Resource) -> SandboxTemplateSpec:
    """A SandboxTemplate's spec; with a build, its result (``build.result``) filled in from
    the status when the current generation is built, else left empty (not usable yet). The
    result is part of the spec's value, so a pool's template hash changes with each build."""
    spec = SandboxTemplateSpec.from_dict(obj.spec)
    if spec.build is None:
        return spec
    status = BuildStatus.from_dict(obj.status)
    if status.phase is not BuildPhase.READY or (
        status.observed_generation != obj.metadata.generation
    ):
        return spec
    return dataclasses.replace(
        spec,
        build=dataclasses.replace(spec.build, result=status.result_key, image=status.image),
    )


def bound_at(obj: Resource) -> float | None:
    """When a claim bound sandbox ``obj`` (the pool's annotation, epoch seconds), if it did and
    the annotation reads as a number."""
    raw = obj.metadata.annotations.get(BOUND_AT_ANNOTATION)
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of ``type_`` among ``conditions`` (None: not set)."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Iterable[Condition], cond: Condition, now: float
) -> tuple[Condition, ...]:
    """``conditions`` with ``cond`` set; its ``lastTransitionTime`` is the old one while the
    status value is unchanged, else ``now`` (epoch seconds)."""
    conditions = tuple(conditions)
    old = condition(conditions, cond.type)
    if old is not None and old.status == cond.status and old.last_transition_time:
        stamp = old.last_transition_time
    else:
        stamp = to_rfc3339(now)
    others = tuple(c for c in conditions if c.type != cond.type)
    return (*others, dataclasses.replace(cond, last_transition_time=stamp))


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxView:
    """A stored Sandbox with its spec and status parsed (raises ResourceInvalid if malformed)."""

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
    def bound_at(self) -> float | None:
        """When a claim bound it, if one did (see :func:`bound_at`)."""
        return bound_at(self.obj)

    @property
    def deleting(self) -> bool:
        """Whether someone asked to delete it (the lifecycle destroys, then deletes it)."""
        return self.obj.metadata.annotations.get(DELETE_ANNOTATION) == "true"

    @property
    def ready(self) -> bool:
        """Running with a true Ready condition: what the lifecycle reports of a usable one."""
        cond = self.condition(ConditionType.READY)
        return self.status.phase is Phase.RUNNING and cond is not None and cond.status == "True"

    @property
    def ended(self) -> bool:
        """Failed or Terminated: it will never serve."""
        return self.status.phase in {Phase.FAILED, Phase.TERMINATED}

    def condition(self, type_: ConditionType) -> Condition | None:
        return condition(self.status.conditions, type_)

    def with_status(self, status: SandboxStatus) -> Resource:
        return dataclasses.replace(self.obj, status=status.to_dict())


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimView:
    """A stored SandboxClaim with its spec and status parsed."""

    obj: Resource
    spec: ClaimSpec
    status: ClaimStatus

    @classmethod
    def of(cls, obj: Resource) -> ClaimView:
        return cls(obj, ClaimSpec.from_dict(obj.spec), ClaimStatus.from_dict(obj.status))

    def with_status(self, status: ClaimStatus) -> Resource:
        return dataclasses.replace(self.obj, status=status.to_dict())
