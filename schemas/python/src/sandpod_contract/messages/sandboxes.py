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
from sandpod_contract.errors import (
    ResourceConflict,
    ResourceExists,
    ResourceInvalid,
    ResourceNotFound,
    SnapshotFailed,
    SnapshotInUse,
    SnapshotQuotaExceeded,
    SnapshotUnsupported,
    VolumeInUse,
    VolumeQuotaExceeded,
)
from sandpod_contract.operations import Operation

__all__ = [
    "CONTROL_PLANE",
    "NETWORK_EVENT_TYPES",
    "PUBLIC_PORTS_ANNOTATION",
    "SANDBOX_EVENT_TYPES",
    "VOLUME_EVENT_TYPES",
    "Expose",
    "NetworkEvent",
    "NetworkState",
    "NetworkUpdate",
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
    object: dict[str, Any]  # Kubernetes-shaped map: apiVersion, kind, metadata, spec (crds/)
    wait_ready: float | None = None  # reply once Ready (or failed), waiting up to this long


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectReply(Message):
    """Reply of every single-object verb: the object as the store holds it now (for ``delete``
    with ``wait``, as last seen), a Kubernetes-shaped map like ``crds/`` describe."""

    TYPE = "api.object_reply"
    object: dict[str, Any]  # apiVersion, kind, metadata, spec and status (crds/)


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


# Reserved annotation on a Sandbox: the TCP ports anyone may reach through the gateway's preview
# URLs without a key, comma-separated ascending ("3000,8000"). Written only by lifecycle's
# ``expose`` verb (a client's object may not carry it: ``sandpod.dev/`` is reserved).
PUBLIC_PORTS_ANNOTATION = "sandpod.dev/public-ports"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Expose(Message):
    """``expose``: make TCP ``port`` of a Sandbox public through the gateway's preview URLs
    (``public``), or private again; recorded in :data:`PUBLIC_PORTS_ANNOTATION`."""

    TYPE = "api.expose"
    name: str
    namespace: str = "default"
    port: int
    public: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name is required")
        if isinstance(self.port, bool) or not 1 <= self.port <= 65535:
            raise ValueError(f"port must be 1..65535, got {self.port!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NetworkUpdate(Message):
    """``set_network``: replace the sandbox's own egress policy (``spec.network``, the wire form
    of ``sandpod_contract.network``), or with ``reset`` drop it so its template's applies again.
    The Sandbox's generation moves only when the policy changes (the same update twice is one
    change); the reconciler applies it to the running instance."""

    TYPE = "api.network_update"
    name: str
    namespace: str = "default"
    policy: dict[str, Any] | None = None  # mode, allow, deny, limits, inject (crds/ spec.network)
    reset: bool | None = None  # true: drop the sandbox's own policy (its template's applies)
    generation: int | None = None  # only if metadata.generation is still this (else conflict)
    wait: float | None = None  # reply once the runtime applied it, waiting up to this long

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name is required")
        if (self.policy is None) == (self.reset is None):
            raise ValueError("exactly one of 'policy' or 'reset' is required")
        if self.reset is not None and self.reset is not True:
            raise ValueError("reset is true or absent")
        if self.wait is not None and self.wait < 0:
            raise ValueError("wait must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NetworkState(Message):
    """Reply of ``network`` and ``set_network``: a sandbox's egress policy, the one it should
    run under now and the one its runtime last applied (``status.network``)."""

    TYPE = "api.network_state"
    name: str
    namespace: str
    generation: int  # the Sandbox's metadata.generation
    source: str  # "sandbox" (its own spec.network) or "template" (its template's)
    policy: dict[str, Any]  # the effective policy now wanted (wire form, as spec.network)
    applied: dict[str, Any] | None = None  # what the runtime last applied (nil: not yet)
    applied_generation: int = 0  # the generation ``applied`` was applied for
    enforced: bool = False  # the runtime enforces ``applied`` entirely
    reason: str = ""  # what it does not enforce, and why (empty when enforced)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Selection(Message):
    """``list``: objects in a namespace (or all) matching a label selector."""

    TYPE = "api.selection"
    namespace: str | None = "default"  # nil or absent on the wire also means "default"
    selector: str | None = None  # Kubernetes label selector syntax
    limit: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectsReply(Message):
    """Reply of ``list``: the matching objects, at most ``limit`` (and at most 1000)."""

    TYPE = "api.objects_reply"
    items: tuple[dict[str, Any], ...]  # objects as in api.object_reply
    revision: int  # store revision the list reflects
    truncated: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SandboxEvent(Message):
    """Published on ``<prefix>.events.sandbox.<name>.<type>`` for every transition."""

    TYPE = "event.sandbox"
    name: str
    namespace: str
    type: str  # created, ready, paused, ..., deleted, snapshotted (see SANDBOX_EVENT_TYPES)
    phase: str
    reason: str = ""
    message: str = ""
    time: float = 0.0
    generation: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NetworkEvent(Message):
    """Published on ``<prefix>.events.network.<name>.<type>``: ``updated`` when a runtime
    applied a sandbox's policy (``policy``, ``enforced``, ``reason``), ``denied`` when an
    enforcer refused a destination (``kind``: dns, rebinding, connect or sni; ``destination``:
    the name or address; ``port``; ``rule``: the deny rule or ``mode:<mode>`` /
    ``special-range``).
    Denials are rate-limited per sandbox: ``count`` says how many this one stands for."""

    TYPE = "event.network"
    name: str
    namespace: str
    type: str  # updated, denied
    time: float = 0.0
    generation: int = 0
    policy: dict[str, Any] | None = None  # updated: the applied policy (wire form)
    enforced: bool = False  # updated: whether the runtime enforces it entirely
    reason: str = ""  # updated: what is not enforced and why
    kind: str = ""  # denied: dns, rebinding, connect or sni
    destination: str = ""  # denied: the name or address refused
    port: int | None = None  # denied: the destination port (nil for a DNS query)
    rule: str = ""  # denied: the rule (or mode:<mode>, special-range, metadata) that refused
    count: int = 1  # denied: denials this event stands for (rate-limited)


# The ``type`` of each :class:`NetworkEvent` (the subject's last token).
NETWORK_EVENT_TYPES: tuple[str, ...] = ("updated", "denied")

# The ``type`` of each :class:`SandboxEvent`, in a Sandbox's usual order (subject's last token).
SANDBOX_EVENT_TYPES: tuple[str, ...] = (
    "created",
    "ready",
    "paused",
    "resumed",
    "renewed",
    "expired",
    "idle_expired",
    "failed",
    "deleted",
    "snapshotted",
    "snapshot_failed",
    "hibernated",
    "woken",
)

# The ``type`` of a SandboxVolume's events (a :class:`SandboxEvent`: ``phase`` the volume's,
# ``reason`` the sandbox that claimed or released it, ``message`` read-only / read-write).
VOLUME_EVENT_TYPES: tuple[str, ...] = ("created", "claimed", "released", "deleted")

_NOT_FOUND = (ResourceNotFound,)
_CHANGE = (ResourceNotFound, ResourceConflict)

CONTROL_PLANE: tuple[Operation, ...] = (
    Operation(
        "sandboxes",
        "create",
        ObjectRequest,
        ObjectReply,
        "create a Sandbox",
        (ResourceInvalid, ResourceExists),
    ),
    Operation("sandboxes", "get", Ref, ObjectReply, "read a Sandbox", _NOT_FOUND),
    Operation("sandboxes", "list", Selection, ObjectsReply, "list Sandboxes by label selector"),
    Operation(
        "sandboxes", "delete", Ref, ObjectReply, "delete a Sandbox and its instance", _CHANGE
    ),
    Operation(
        "sandboxes",
        "renew",
        Renew,
        ObjectReply,
        "extend a Sandbox's lifetime",
        (*_CHANGE, ResourceInvalid),
    ),
    Operation(
        "sandboxes", "pause", Ref, ObjectReply, "freeze a Sandbox (operatingMode Paused)", _CHANGE
    ),
    Operation("sandboxes", "resume", Ref, ObjectReply, "thaw a Sandbox", _CHANGE),
    Operation(
        "sandboxes",
        "wake",
        Ref,
        ObjectReply,
        "wake a Hibernated Sandbox (restore it) and wait until Running; others answer at once",
        _CHANGE,
    ),
    Operation(
        "sandboxes",
        "network",
        Ref,
        NetworkState,
        "read a Sandbox's egress policy (wanted and applied)",
        _NOT_FOUND,
    ),
    Operation(
        "sandboxes",
        "set_network",
        NetworkUpdate,
        NetworkState,
        "replace (or reset to its template's) a Sandbox's egress policy at runtime",
        (*_CHANGE, ResourceInvalid),
    ),
    Operation(
        "sandboxes",
        "expose",
        Expose,
        ObjectReply,
        "make a port of a Sandbox public (or private) through the gateway",
        _CHANGE,
    ),
    Operation(
        "templates",
        "apply",
        ObjectRequest,
        ObjectReply,
        "create or update a template",
        (ResourceInvalid, ResourceConflict),
    ),
    Operation("templates", "get", Ref, ObjectReply, "read a SandboxTemplate", _NOT_FOUND),
    Operation("templates", "list", Selection, ObjectsReply, "list SandboxTemplates"),
    Operation("templates", "delete", Ref, ObjectReply, "delete a SandboxTemplate", _NOT_FOUND),
    Operation(
        "volumes",
        "create",
        ObjectRequest,
        ObjectReply,
        "create a SandboxVolume (its storage is made at once)",
        (ResourceInvalid, ResourceExists, VolumeQuotaExceeded),
    ),
    Operation("volumes", "get", Ref, ObjectReply, "read a SandboxVolume", _NOT_FOUND),
    Operation("volumes", "list", Selection, ObjectsReply, "list SandboxVolumes"),
    Operation(
        "volumes",
        "delete",
        Ref,
        ObjectReply,
        "delete a SandboxVolume and its data (refused while a sandbox mounts it)",
        (ResourceNotFound, VolumeInUse),
    ),
    Operation(
        "snapshots",
        "create",
        ObjectRequest,
        ObjectReply,
        "snapshot a running Sandbox (a SandboxSnapshot; waits until it is Ready or Failed)",
        (
            ResourceInvalid,
            ResourceExists,
            ResourceNotFound,
            SnapshotFailed,
            SnapshotQuotaExceeded,
            SnapshotUnsupported,
        ),
    ),
    Operation("snapshots", "get", Ref, ObjectReply, "read a SandboxSnapshot", _NOT_FOUND),
    Operation("snapshots", "list", Selection, ObjectsReply, "list SandboxSnapshots"),
    Operation(
        "snapshots",
        "delete",
        Ref,
        ObjectReply,
        "delete a SandboxSnapshot and its layers no other snapshot shares",
        (*_NOT_FOUND, SnapshotInUse),
    ),
)
