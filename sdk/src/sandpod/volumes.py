"""SandboxVolumes in the SDK: named persistent storage that outlives sandboxes.

Create a volume, then mount it when creating sandboxes (``volumes=[...]`` on
:meth:`sandpod.AsyncSandbox.create`): read-write by one sandbox at a time, read-only by any
number while nobody writes it::

    async with await AsyncVolumes.connect() as volumes:
        await volumes.create("data", size="1Gi")
    sbx = await AsyncSandbox.create(volumes=[VolumeMount("data", "/data")])

A mount that conflicts with a holder raises :class:`sandpod.errors.VolumeInUse` naming it;
deleting a volume in use does too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Self

from sandpod._loop import run
from sandpod._twins import twin
from sandpod.config import (
    resolve_inbox_prefix,
    resolve_nats_creds,
    resolve_nats_url,
    resolve_prefix,
    resolve_tenant,
)
from sandpod.control import api_call
from sandpod_bus import Bus, BusSettings
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.resources import API_VERSION
from sandpod_contract.subjects import Subjects
from sandpod_contract.volumes import VolumeMount

__all__ = ["AsyncVolumes", "VolumeInfo", "VolumeMount", "Volumes", "mount_specs", "parse_mount"]


@dataclasses.dataclass(frozen=True, slots=True)
class VolumeInfo:
    """A SandboxVolume (the printer columns, and the raw object)."""

    name: str
    namespace: str
    size: str
    phase: str  # Pending | Available | InUse | Failed
    writer: str | None  # the sandbox mounting it read-write
    readers: tuple[str, ...]  # the sandboxes mounting it read-only
    used_bytes: int | None
    object: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> VolumeInfo:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", "default"),
            size=str(spec.get("size", "")),
            phase=str(status.get("phase", "Pending")),
            writer=status.get("writer"),
            readers=tuple(status.get("readers") or ()),
            used_bytes=status.get("usedBytes"),
            object=obj,
        )


def parse_mount(text: str) -> VolumeMount:
    """``name:/path`` or ``name:/path:ro`` (the CLI's ``--volume``). Raises ValueError."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"--volume {text!r}: use NAME:/PATH or NAME:/PATH:ro")
    return VolumeMount(parts[0], parts[1], len(parts) == 3 and parts[2] == "ro")


def mount_specs(mounts: Iterable[VolumeMount | str]) -> list[dict[str, Any]]:
    """``spec.volumes`` of a Sandbox from mounts or ``name:/path[:ro]`` strings (the service
    validates them)."""
    return [(parse_mount(m) if isinstance(m, str) else m).to_dict() for m in mounts]


class AsyncVolumes:
    """SandboxVolume administration over the lifecycle API."""

    def __init__(self, bus: Bus, subjects: Subjects, *, owns_bus: bool, namespace: str) -> None:
        self.bus = bus
        self.subjects = subjects
        self.namespace = namespace
        self._owns_bus = owns_bus

    @classmethod
    async def connect(
        cls,
        *,
        nats_url: str | None = None,
        prefix: str | None = None,
        namespace: str = "default",
        bus: Bus | None = None,
    ) -> AsyncVolumes:
        """Connect (or share ``bus``). Raises ConnectionLost: NATS is unreachable."""
        subjects = Subjects(resolve_prefix(prefix), tenant=resolve_tenant())
        if bus is not None:
            return cls(bus, subjects, owns_bus=False, namespace=namespace)
        settings = BusSettings(
            url=resolve_nats_url(nats_url),
            name="sandpod-sdk:volumes",
            creds=resolve_nats_creds(),
            inbox_prefix=resolve_inbox_prefix(),
        )
        return cls(await Bus.connect(settings), subjects, owns_bus=True, namespace=namespace)

    async def _call(self, verb: str, msg: Any, reply: type[Any]) -> Any:
        return await api_call(self.bus, self.subjects, "volumes", verb, msg, reply)

    async def create(self, name: str, *, size: str, storage_class: str | None = None) -> VolumeInfo:
        """Create volume ``name`` of ``size`` (a quantity: ``1Gi``); its storage is made before
        this returns. Raises ResourceInvalid (bad size, naming the field), ResourceExists."""
        spec: dict[str, Any] = {"size": size}
        if storage_class:
            spec["storageClassName"] = storage_class
        obj = {
            "apiVersion": API_VERSION,
            "kind": "SandboxVolume",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        return VolumeInfo.of(
            (await self._call("create", ObjectRequest(object=obj), ObjectReply)).object
        )

    async def get(self, name: str) -> VolumeInfo:
        """The volume, with its current usage. Raises ResourceNotFound."""
        msg = Ref(name=name, namespace=self.namespace)
        return VolumeInfo.of((await self._call("get", msg, ObjectReply)).object)

    async def list(self) -> list[VolumeInfo]:
        msg = Selection(namespace=self.namespace)
        return [VolumeInfo.of(o) for o in (await self._call("list", msg, ObjectsReply)).items]

    async def delete(self, name: str) -> VolumeInfo:
        """Delete the volume and its data. Raises VolumeInUse (a sandbox mounts it, named),
        ResourceNotFound."""
        msg = Ref(name=name, namespace=self.namespace)
        return VolumeInfo.of((await self._call("delete", msg, ObjectReply)).object)

    async def close(self) -> None:
        if self._owns_bus:
            await self.bus.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class Volumes:
    """Blocking twin of :class:`AsyncVolumes`."""

    def __init__(self, inner: AsyncVolumes) -> None:
        self._inner = inner

    @property
    def namespace(self) -> str:
        return self._inner.namespace

    @classmethod
    def connect(
        cls, *, nats_url: str | None = None, prefix: str | None = None, namespace: str = "default"
    ) -> Volumes:
        return cls(run(AsyncVolumes.connect(nats_url=nats_url, prefix=prefix, namespace=namespace)))

    create = twin(AsyncVolumes.create)
    get = twin(AsyncVolumes.get)
    list = twin(AsyncVolumes.list)
    delete = twin(AsyncVolumes.delete)
    close = twin(AsyncVolumes.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
