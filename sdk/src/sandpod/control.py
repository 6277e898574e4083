"""Control-plane calls of the SDK: create, list, renew, pause, resume and delete sandboxes
through the lifecycle service (``<prefix>.api.sandboxes.*``), and follow their events."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

from sandpod_bus import Bus, Inbound, NoResponders
from sandpod_contract.codec import Message, decode, decode_reply, encode
from sandpod_contract.errors import SandboxError, SandpodError
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Selection,
)
from sandpod_contract.reserved import refuse_reserved
from sandpod_contract.subjects import Subjects
from sandpod_contract.times import to_rfc3339

E = TypeVar("E", bound=Message)

__all__ = [
    "SandboxInfo",
    "api_call",
    "create_object",
    "create_sandbox",
    "follow_events",
    "list_sandboxes",
]

API_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A Sandbox as the lifecycle service sees it (the printer columns, and the raw object)."""

    name: str
    namespace: str
    phase: str
    ready: bool
    template: str | None
    shutdown_time: str | None
    last_activity_time: str | None
    created: str
    labels: Mapping[str, str]
    conditions: tuple[Mapping[str, Any], ...]
    object: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> SandboxInfo:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        conditions = tuple(status.get("conditions") or ())
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            phase=status.get("phase", ""),
            ready=ready,
            template=(spec.get("templateRef") or {}).get("name"),
            shutdown_time=spec.get("shutdownTime") or status.get("shutdownTime"),
            last_activity_time=status.get("lastActivityTime"),
            created=meta.get("creationTimestamp", ""),
            labels=dict(meta.get("labels") or {}),
            conditions=conditions,
            object=obj,
        )

    def condition(self, type_: str) -> Mapping[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == type_), None)


async def api_call(  # noqa: PLR0917 - where (bus, subjects) + what (kind, verb, msg, reply)
    bus: Bus,
    subjects: Subjects,
    kind: str,
    verb: str,
    msg: Message,
    reply: type[Message],
    *,
    timeout: float = API_TIMEOUT,
) -> Any:
    """One control-plane request; a missing lifecycle service gets an actionable error."""
    try:
        data = await bus.request(subjects.api(kind, verb), encode(msg), timeout)
    except NoResponders as exc:
        service = "pool service" if kind in ("pools", "claims") else "lifecycle service"
        raise SandboxError(
            f"no {service} answers on {subjects.api(kind, verb)}; start the platform with "
            "`sandpod up` (or check SANDPOD_NATS_URL / SANDPOD_PREFIX)",
            subject=subjects.api(kind, verb),
        ) from exc
    return decode_reply(reply, data)


def create_object(
    *,
    name: str | None,
    template: str | None,
    timeout: float | None,
    permanent: bool,
    idle_timeout: int | None,
    labels: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    network: Mapping[str, Any] | None = None,
    snapshot: str | None = None,
    idle_policy: str | None = None,
    volumes: Sequence[Any] | None = None,
) -> dict[str, Any]:
    r"""The Sandbox object for a create request (``volumes``: ``VolumeMount``\s or
    ``name:/path[:ro]`` strings, see :mod:`sandpod.volumes`). Raises BadRequest for a reserved
    (``sandpod.dev/``) label, as lifecycle would; ResourceInvalid naming the field for a bad
    ``network`` policy (``spec.network.allow[0]``)."""
    refuse_reserved({"metadata": {"labels": dict(labels or {})}})
    spec: dict[str, Any] = {"permanent": permanent}
    if template:
        spec["templateRef"] = {"name": template}
    if timeout is not None:
        spec["shutdownTime"] = to_rfc3339(time.time() + timeout)
    if idle_timeout is not None:
        spec["idleTimeoutSeconds"] = idle_timeout
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if snapshot is not None:
        spec["snapshotRef"] = {"name": snapshot}
    if idle_policy is not None:
        spec["idlePolicy"] = idle_policy
    if network is not None:
        from sandpod_contract.network import NetworkPolicy  # lazy: not on the exec path

        spec["network"] = NetworkPolicy.from_dict(dict(network), "spec.network").to_dict()
    if volumes:
        from sandpod.volumes import mount_specs  # lazy: not on the exec path

        spec["volumes"] = mount_specs(volumes)
    meta: dict[str, Any] = {"labels": dict(labels or {})}
    if name:
        meta["name"] = name
    from sandpod_contract.resources import API_VERSION  # lazy: not on the exec path

    return {"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": meta, "spec": spec}


async def create_sandbox(
    bus: Bus, subjects: Subjects, obj: dict[str, Any], *, wait: float
) -> SandboxInfo:
    """Create the Sandbox ``obj`` (from :func:`create_object`) and wait ``wait`` s for it to be
    Ready.

    Raises:
        ResourceInvalid: bad arguments or unknown template.
        SandboxError: the sandbox failed to start (the reason is in the message), or no
            lifecycle service answers.
    """
    reply = await api_call(
        bus,
        subjects,
        "sandboxes",
        "create",
        ObjectRequest(object=obj, wait_ready=wait),
        ObjectReply,
        timeout=wait + 10,
    )
    info = SandboxInfo.of(reply.object)
    if not info.ready:
        failed = info.condition("Failed") or info.condition("Ready") or {}
        raise SandboxError(
            f"sandbox {info.name} is {info.phase or 'not ready'}: "
            f"{failed.get('reason', '')} {failed.get('message', '')}".strip(),
            sandbox_id=info.name,
        )
    return info


async def list_sandboxes(
    bus: Bus, subjects: Subjects, labels: str | Mapping[str, str] | None
) -> list[SandboxInfo]:
    """Sandboxes known to the lifecycle service, filtered by a label selector (a selector
    string, or a mapping of labels that must all match)."""
    selector = (
        labels
        if isinstance(labels, str) or labels is None
        else ",".join(f"{k}={v}" for k, v in labels.items())
    )
    reply = await api_call(
        bus, subjects, "sandboxes", "list", Selection(selector=selector), ObjectsReply
    )
    return [SandboxInfo.of(o) for o in reply.items]


async def follow_events(
    bus: Bus, subjects: Subjects, name: str, kind: str, of: type[E]
) -> AsyncIterator[E]:
    """Live events of ``kind`` (``sandbox``, ``network``...) of object ``name``, decoded as
    ``of``, until the iterator is closed (undecodable ones skipped; at most 1024 unread)."""
    queue: asyncio.Queue[E] = asyncio.Queue(maxsize=1024)

    async def on_event(msg: Inbound) -> None:
        try:
            event = decode(of, msg.data)
        except SandpodError:
            return
        if not queue.full():
            queue.put_nowait(event)

    sub = await bus.subscribe(subjects.events_of(kind, name), on_event)
    try:
        while True:
            yield await queue.get()
    finally:
        await sub.stop()
