"""Pool members: what a warm Sandbox looks like, and which state one is in. No I/O here.

A member is an ordinary Sandbox object written to the store by the pool service; the lifecycle
service creates its instance like any other. What makes it a member is its controller owner
reference to the pool's uid (:func:`is_member`), which only the pool service writes (the API
handlers refuse a client's owner references and ``sandpod.dev/`` labels): a Sandbox that merely
carries a pool's labels is nobody's member, never counted, never bound. While warm it carries
the pool and template-hash labels, no claim label, no idle timeout (nobody uses it yet, so
idleness means nothing) and a lifetime of its template's default (nothing immortal by
accident: an abandoned pool's members still expire, and the pool refills). Binding a claim
rewrites exactly those fields and drops the pool's owner reference.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import secrets
from collections.abc import Callable

from sandpod_contract.errors import ResourceConflict, ResourceNotFound
from sandpod_contract.pooling import CLAIM_LABEL, HASH_LABEL, POOL_LABEL, WarmPoolSpec
from sandpod_contract.resources import (
    API_VERSION,
    ConditionReason,
    ConditionType,
    SandboxSpec,
    SandboxTemplateSpec,
)
from sandpod_contract.times import from_rfc3339, to_rfc3339
from sandpod_pool.cache import Mirror
from sandpod_store import (
    DELETE_ANNOTATION,
    ObjectMeta,
    OwnerReference,
    Resource,
    SandboxView,
    Store,
)

__all__ = [
    "DELETE_ANNOTATION",
    "POOL_KIND",
    "SANDBOX",
    "TEMPLATE",
    "MemberState",
    "age",
    "failure_message",
    "failure_reason",
    "free_selector",
    "is_deleting",
    "is_member",
    "is_ready",
    "member_object",
    "member_state",
    "owner_pool",
    "request_delete",
    "template_hash",
]

SANDBOX = "Sandbox"
TEMPLATE = "SandboxTemplate"
POOL_KIND = "SandboxWarmPool"
OWNER_ANNOTATION = "sandpod.dev/owner"


class MemberState(enum.Enum):
    READY = "ready"  # free, Running and Ready: claimable
    STARTING = "starting"  # free, not ready yet
    FAILED = "failed"  # free and Failed, or retrying a failed create
    CLAIMED = "claimed"  # a claim owns it: no longer the pool's
    DELETING = "deleting"


def template_hash(pool: WarmPoolSpec, template: SandboxTemplateSpec) -> str:
    """A short digest of everything a member is made from: a change means stale members."""
    raw = json.dumps(
        {"template": dataclasses.asdict(template), "ref": pool.template_ref},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def free_selector(pool: str) -> str:
    """Label selector of a pool's free members (the scale subresource's ``status.selector``)."""
    return f"{POOL_LABEL}={pool},!{CLAIM_LABEL}"


def owner_pool(obj: Resource, pool: str) -> OwnerReference | None:
    """The controller owner reference naming SandboxWarmPool ``pool`` on ``obj`` (any uid)."""
    ref = obj.metadata.controller()
    if ref is None or ref.kind != POOL_KIND or ref.name != pool or not ref.uid:
        return None
    return ref


def is_member(obj: Resource, pool: Resource) -> bool:
    """Whether ``obj`` is a member of ``pool``: same namespace, the pool's label, and controlled
    by exactly this pool (its uid: a recreated pool of the same name owns nothing old)."""
    name = pool.metadata.name
    ref = owner_pool(obj, name)
    return (
        ref is not None
        and ref.uid == pool.metadata.uid
        and obj.metadata.namespace == pool.metadata.namespace
        and obj.metadata.labels.get(POOL_LABEL) == name
    )


def member_object(
    pool_obj: Resource,
    spec: WarmPoolSpec,
    template: SandboxTemplateSpec,
    digest: str,
    now: float,
) -> Resource:
    """A new warm member of ``pool_obj`` (name: the pool's plus a random suffix), owned by it,
    living its template's default lifetime from ``now`` (epoch seconds)."""
    namespace, pool = pool_obj.metadata.namespace, pool_obj.metadata.name
    name = f"{pool[:40].rstrip('-')}-{secrets.token_hex(5)}"
    sandbox_spec = SandboxSpec(
        template_ref=spec.template_ref,
        shutdown_time=to_rfc3339(now + template.default_lifetime_seconds),
        idle_timeout_seconds=0,
    ).to_dict()
    return Resource(
        api_version=API_VERSION,
        kind=SANDBOX,
        metadata=ObjectMeta(
            name=name,
            namespace=namespace,
            labels={POOL_LABEL: pool, HASH_LABEL: digest},
            annotations={OWNER_ANNOTATION: f"{POOL_KIND}/{pool}"},
            owner_references=(
                OwnerReference(API_VERSION, POOL_KIND, pool, pool_obj.metadata.uid, True),
            ),
        ),
        spec=sandbox_spec,
    )


def is_deleting(obj: Resource) -> bool:
    return obj.metadata.annotations.get(DELETE_ANNOTATION) == "true"


def member_state(obj: Resource) -> MemberState:
    """Where a pool's Sandbox stands, from its labels and the lifecycle's status."""
    if is_deleting(obj):
        return MemberState.DELETING
    if CLAIM_LABEL in obj.metadata.labels:
        return MemberState.CLAIMED
    view = SandboxView.of(obj)
    if view.ready:
        return MemberState.READY
    ready = view.condition(ConditionType.READY)
    if view.ended or (ready is not None and ready.reason == ConditionReason.INSTANCE_STARTING):
        return MemberState.FAILED  # InstanceStarting: a create failed and is being retried
    return MemberState.STARTING


def failure_reason(obj: Resource, default: str = "Pending") -> str:
    """``reason: message`` of the first telling condition (Failed, Ready, Expired), else the
    phase (``default`` when the lifecycle wrote no status yet)."""
    view = SandboxView.of(obj)
    for type_ in (ConditionType.FAILED, ConditionType.READY, ConditionType.EXPIRED):
        cond = view.condition(type_)
        if cond is not None and cond.message:
            return f"{cond.reason}: {cond.message}"
    return str(view.status.phase) if obj.status else default


def failure_message(obj: Resource) -> str:
    """Why a failed member failed, from its conditions, naming it."""
    return f"{obj.metadata.name}: {failure_reason(obj)}"


def is_ready(obj: Resource) -> bool:
    """Running with a true Ready condition: what the lifecycle reports of a usable sandbox."""
    return SandboxView.of(obj).ready


def age(obj: Resource, now: float) -> float:
    """Seconds from the object's creation to ``now`` (epoch seconds; 0 when unknown)."""
    stamp = obj.metadata.creation_timestamp
    if not stamp:
        return 0.0
    try:
        return now - from_rfc3339(stamp)
    except ValueError:
        return 0.0


async def request_delete(
    store: Store, mirror: Mirror, sbx: Resource, *, unless: Callable[[Resource], bool]
) -> bool:
    """Mark ``sbx`` for deletion (the lifecycle destroys its instance and the object), re-reading
    on conflicts. Gives up when the sandbox is gone or, as re-read, ``unless(it)`` holds.
    True when this call marked it."""
    for _ in range(5):
        if is_deleting(sbx) or unless(sbx):
            return False
        annotations = {**sbx.metadata.annotations, DELETE_ANNOTATION: "true"}
        meta = dataclasses.replace(sbx.metadata, annotations=annotations)
        try:
            mirror.observe(await store.update(dataclasses.replace(sbx, metadata=meta)))
            return True
        except ResourceNotFound:
            mirror.forget(sbx.metadata.namespace, sbx.metadata.name)
            return False
        except ResourceConflict:
            try:
                sbx = await store.get(SANDBOX, sbx.metadata.namespace, sbx.metadata.name)
            except ResourceNotFound:
                return False
    return False
