"""Control plane ``<prefix>.api.pools.<verb>`` and ``<prefix>.api.claims.<verb>``: the pool
service's API (warm pools and claims), in the pool service's queue group.

Objects travel as their Kubernetes-shaped maps, like the sandboxes API
(:mod:`sandpod_contract.messages.sandboxes`, whose request and reply types are reused). A claim
request with ``wait_ready`` replies once the claim is bound to a ready sandbox (its name in
``status.sandbox``), or with a typed error: ``claim.pool_not_found``, ``claim.failed`` (the
sandbox failed to start; the reason is in the claim's conditions) or ``claim.timeout`` (not
ready in time; the claim stays and may still bind).
"""

from __future__ import annotations

import dataclasses

from sandpod_contract.codec import Message
from sandpod_contract.errors import (
    ClaimFailed,
    ClaimTimeout,
    PoolNotFound,
    ResourceConflict,
    ResourceExists,
    ResourceInvalid,
    ResourceNotFound,
)
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.operations import Operation

__all__ = ["POOL_PLANE", "Scale"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Scale(Message):
    """``pools.scale``: set a pool's ``spec.replicas`` (what an autoscaler does)."""

    TYPE = "api.scale"
    name: str
    namespace: str = "default"
    replicas: int

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name is required")
        if self.replicas < 0:
            raise ValueError("replicas must be >= 0")


_NOT_FOUND = (ResourceNotFound,)

POOL_PLANE: tuple[Operation, ...] = (
    Operation(
        "pools",
        "apply",
        ObjectRequest,
        ObjectReply,
        "create or update a SandboxWarmPool",
        (ResourceInvalid, ResourceConflict),
    ),
    Operation("pools", "get", Ref, ObjectReply, "read a SandboxWarmPool", _NOT_FOUND),
    Operation("pools", "list", Selection, ObjectsReply, "list SandboxWarmPools"),
    Operation(
        "pools",
        "scale",
        Scale,
        ObjectReply,
        "set a pool's replicas",
        (ResourceNotFound, ResourceInvalid, ResourceConflict),
    ),
    Operation(
        "pools", "delete", Ref, ObjectReply, "delete a pool and its free members", _NOT_FOUND
    ),
    Operation(
        "claims",
        "create",
        ObjectRequest,
        ObjectReply,
        "claim a ready sandbox",
        (ResourceInvalid, ResourceExists, PoolNotFound, ClaimFailed, ClaimTimeout),
    ),
    Operation("claims", "get", Ref, ObjectReply, "read a SandboxClaim", _NOT_FOUND),
    Operation("claims", "list", Selection, ObjectsReply, "list SandboxClaims"),
    Operation(
        "claims", "delete", Ref, ObjectReply, "release a claim and delete its sandbox", _NOT_FOUND
    ),
)
