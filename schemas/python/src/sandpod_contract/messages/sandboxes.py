"""Control plane ``<prefix>.api.sandboxes.<verb>``: the lifecycle service's API.

Objects travel as their Kubernetes-shaped maps (``apiVersion``, ``kind``, ``metadata``, ``spec``,
``status``), validated against ``schemas/crds/`` by the receiver; the same objects are what a
Kubernetes store holds, so a client does not care which store is behind the API. Transitions are
also published as events on ``<prefix>.events.sandbox.<name>.<type>`` (JetStream stream
``SANDPOD_EVENTS``), see :class:`SandboxEvent`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sandpod_contract.codec import Message
from sandpod_contract.operations import Operation

__all__ = [
    "CONTROL_PLANE",
    "ObjectReply",
    "ObjectRequest",
    "ObjectsReply",
    "Ref",
    "Renew",
    "SandboxEvent",
    "Selection",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRequest(Message):
    """``create``: the object to create (``metadata.name`` may be omitted: one is generated)."""

    TYPE = "api.object_request"
    object: dict[str, Any]
    wait_ready: float | None = None  # reply once Ready (or failed), waiting up to this long


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectReply(Message):
    TYPE = "api.object_reply"
    object: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Ref(Message):
    """``get`` / ``delete`` / ``pause`` / ``resume``: names one object."""

    TYPE = "api.ref"
    name: str
    namespace: str = "default"
    wait: float | None = None  # delete: reply once the instance is gone, waiting up to this long

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name is required")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Renew(Message):
    """``renew``: push ``shutdownTime`` to now + ``seconds`` (or to ``shutdown_time``)."""

    TYPE = "api.renew"
    name: str
    namespace: str = "default"
    seconds: float | None = None
    shutdown_time: str | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.shutdown_time is None):
            raise ValueError("exactly one of 'seconds' or 'shutdown_time' is required")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError("seconds must be > 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Selection(Message):
    """``list``: objects in a namespace (or all) matching a label selector."""

    TYPE = "api.selection"
    namespace: str | None = "default"
    selector: str | None = None  # Kubernetes label selector syntax
    limit: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectsReply(Message):
    TYPE = "api.objects_reply"
    items: tuple[dict[str, Any], ...]
    revision: int  # store revision the list reflects
    truncated: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SandboxEvent(Message):
    """Published on ``<prefix>.events.sandbox.<name>.<type>`` for every transition."""

    TYPE = "event.sandbox"
    name: str
    namespace: str
    type: str  # created, ready, paused, resumed, renewed, expired, idle_expired, failed, deleted
    phase: str
    reason: str = ""
    message: str = ""
    time: float = 0.0
    generation: int = 0


CONTROL_PLANE: tuple[Operation, ...] = (
    Operation("sandboxes", "create", ObjectRequest, ObjectReply, "create a Sandbox"),
    Operation("sandboxes", "get", Ref, ObjectReply, "read a Sandbox"),
    Operation("sandboxes", "list", Selection, ObjectsReply, "list Sandboxes by label selector"),
    Operation("sandboxes", "delete", Ref, ObjectReply, "delete a Sandbox and its instance"),
    Operation("sandboxes", "renew", Renew, ObjectReply, "extend a Sandbox's lifetime"),
    Operation("sandboxes", "pause", Ref, ObjectReply, "freeze a Sandbox (operatingMode Paused)"),
    Operation("sandboxes", "resume", Ref, ObjectReply, "thaw a Sandbox"),
    Operation("templates", "apply", ObjectRequest, ObjectReply, "create or update a template"),
    Operation("templates", "get", Ref, ObjectReply, "read a SandboxTemplate"),
    Operation("templates", "list", Selection, ObjectsReply, "list SandboxTemplates"),
    Operation("templates", "delete", Ref, ObjectReply, "delete a SandboxTemplate"),
)
