"""A claim's objects: what it binds with, the sandbox a cold create makes for it, and its status
as its sandbox makes it. No I/O here: :mod:`sandpod_pool.claims` writes what these return.

Times come in as ``now`` (epoch seconds, the caller's Clock), so a status or a cold sandbox is
the same whatever machine or test builds it.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.pooling import (
    BOUND_AT_ANNOTATION,
    CLAIM_LABEL,
    POOL_LABEL,
    ClaimConditionType,
    ClaimPhase,
    ClaimReason,
    ClaimSpec,
    ClaimStatus,
)
from sandpod_contract.resources import API_VERSION, Condition, SandboxSpec, SandboxTemplateSpec
from sandpod_pool.members import SANDBOX, failure_reason, is_deleting, is_ready
from sandpod_store import ObjectMeta, Resource, SandboxView, set_condition

__all__ = [
    "BOUND_AS_ANNOTATION",
    "CLAIM",
    "CLAIM_ANNOTATION",
    "Binding",
    "Bound",
    "bind_annotations",
    "claim_from_map",
    "claim_status",
    "cold_object",
    "member_state_of",
    "running",
]

CLAIM = "SandboxClaim"
CLAIM_ANNOTATION = "sandpod.dev/claimed-by"
BOUND_AS_ANNOTATION = "sandpod.dev/bound-as"  # the claim's Bound reason, for adoption
BOUND_MESSAGES = {
    ClaimReason.WARM: "bound a ready warm sandbox",
    ClaimReason.POOL_EXHAUSTED: "no free warm sandbox: created one (cold start)",
    ClaimReason.NO_POOL: "no pool named: created one (cold start)",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """What a claim needs to bind: resolved from its spec, its pool and its template."""

    spec: ClaimSpec
    pool: str | None
    template_ref: str | None
    template: SandboxTemplateSpec
    shutdown_time: str
    idle_timeout: int
    pool_obj: Resource | None = None  # the pool (its uid decides membership)


class Bound(enum.Enum):
    """Where a claimed sandbox stands (labels aside; unlike a free member, a retried create is
    still ``STARTING``: the claim waits for it)."""

    READY = "ready"
    STARTING = "starting"
    FAILED = "failed"


def member_state_of(obj: Resource) -> Bound:
    """How a claimed sandbox stands, from the lifecycle's status and the delete mark."""
    if is_ready(obj):
        return Bound.READY
    if SandboxView.of(obj).ended or is_deleting(obj):
        return Bound.FAILED
    return Bound.STARTING


def running(obj: Resource | None) -> bool:
    """Whether a claim waiting on ``obj`` is done waiting (ready, failed, or gone)."""
    return obj is None or member_state_of(obj) is not Bound.STARTING


def claim_status(
    claim: Resource, sandbox: Resource | None, reason: ClaimReason, shutdown: str, now: float
) -> ClaimStatus:
    """The claim's status as its sandbox makes it: Bound (how), Ready, the phase."""
    state = Bound.FAILED if sandbox is None else member_state_of(sandbox)
    bound = Condition(ClaimConditionType.BOUND, "True", reason, BOUND_MESSAGES.get(reason, ""))
    conds = set_condition(ClaimStatus.from_dict(claim.status).conditions, bound, now)
    phase = ClaimPhase.BOUND
    if state is Bound.READY:
        ready = Condition(ClaimConditionType.READY, "True", ClaimReason.SANDBOX_READY)
    elif state is Bound.FAILED:
        why = "" if sandbox is None else failure_reason(sandbox, "deleted")
        ready = Condition(ClaimConditionType.READY, "False", ClaimReason.SANDBOX_FAILED, why)
        phase = ClaimPhase.FAILED
    else:
        ready = Condition(ClaimConditionType.READY, "False", ClaimReason.SANDBOX_STARTING)
    return ClaimStatus(
        phase=phase,
        sandbox=None if sandbox is None else sandbox.metadata.name,
        shutdown_time=shutdown or None,
        observed_generation=claim.metadata.generation,
        conditions=set_condition(conds, ready, now),
    )


def cold_object(claim: Resource, b: Binding, now: float) -> Resource:
    """A new Sandbox for ``claim`` when no warm member is free (bound at ``now``)."""
    reason = ClaimReason.POOL_EXHAUSTED if b.pool is not None else ClaimReason.NO_POOL
    spec = SandboxSpec(
        template_ref=b.template_ref,
        shutdown_time=b.shutdown_time,
        idle_timeout_seconds=b.idle_timeout,
        env=b.spec.env,
    ).to_dict()
    labels = {**b.spec.labels, CLAIM_LABEL: claim.metadata.name}
    if b.pool is not None:
        labels[POOL_LABEL] = b.pool
    meta = ObjectMeta(
        # Named after the claim: a prefix naming the owner (the gateway's tenant) carries over.
        name=f"{claim.metadata.name[:40].rstrip('-')}-{secrets.token_hex(5)}",
        namespace=claim.metadata.namespace,
        labels=labels,
        annotations=bind_annotations(claim, reason, now),
    )
    return Resource(api_version=API_VERSION, kind=SANDBOX, metadata=meta, spec=spec)


def bind_annotations(claim: Resource, reason: ClaimReason, now: float) -> dict[str, str]:
    """What a sandbox bound to ``claim`` carries (cold or warm): the claim, how and when it was
    bound, the one spelling recovery and the lifecycle's settle rule read back."""
    return {
        CLAIM_ANNOTATION: f"{CLAIM}/{claim.metadata.name}",
        BOUND_AS_ANNOTATION: str(reason),
        BOUND_AT_ANNOTATION: f"{now:.3f}",
    }


def claim_from_map(raw: Mapping[str, Any]) -> Resource:
    """A SandboxClaim from a client's map, validated (name generated if absent).

    Raises ResourceInvalid."""
    if not isinstance(raw, Mapping):
        raise ResourceInvalid("object must be a map")
    if raw.get("kind", CLAIM) != CLAIM or raw.get("apiVersion", API_VERSION) != API_VERSION:
        raise ResourceInvalid(f"expected {API_VERSION} {CLAIM}", field="kind")
    obj = Resource.from_dict({**raw, "apiVersion": API_VERSION, "kind": CLAIM, "status": {}})
    if not obj.metadata.name:
        meta = dataclasses.replace(obj.metadata, name=f"claim-{secrets.token_hex(5)}")
        obj = dataclasses.replace(obj, metadata=meta)
    obj.validate()
    ClaimSpec.from_dict(obj.spec)
    return obj
