"""The ``snapshots`` family: a sandbox's files captured, kept, restored and forked.

    snap = sbx.snapshot(name="prepared")           # frozen for the capture; only changes stored
    more = sbx.fork(10)                            # 10 sandboxes with exactly that state
    again = Sandbox.create(snapshot="prepared")    # a new sandbox from it, any time later
    sbx.snapshots.list(source=sbx.id)              # SnapshotInfo: phase, parent, sizes
    sbx.snapshots.delete("prepared")               # refused while something restores from it

Data flow: ``snapshot`` asks the lifecycle service to create a SandboxSnapshot
(``<prefix>.api.snapshots.create``) and gets it back once Ready (or ``SnapshotFailed`` with the
reason). Restores are ordinary creates with ``spec.snapshotRef``: the new sandbox's writable
layers start empty over the snapshot's read-only layers, so a fork costs the same whatever the
workspace holds.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Mapping
from typing import Any

from sandpod._twins import twin
from sandpod.control import api_call
from sandpod_bus import Bus
from sandpod_contract.messages.sandboxes import (
    ObjectReply,
    ObjectRequest,
    ObjectsReply,
    Ref,
    Selection,
)
from sandpod_contract.subjects import Subjects

__all__ = ["AsyncSnapshots", "SnapshotInfo", "Snapshots", "snapshot_object"]

CAPTURE_WAIT = 600.0  # seconds a snapshot may take by default (a large first capture)


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A SandboxSnapshot as the lifecycle service reports it."""

    name: str
    namespace: str
    source: str  # the sandbox it was taken of
    phase: str  # Pending, Ready, Failed
    parent: str | None  # the snapshot whose layers it adds to
    template: str | None  # the template its source ran (a restore runs on its base)
    layers: int
    size_bytes: int  # its own layers (compressed)
    total_bytes: int  # every layer it restores (compressed)
    ready_time: str | None
    reason: str  # of its Ready condition
    message: str
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> SnapshotInfo:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        cond: Mapping[str, Any] = next(iter(status.get("conditions") or ()), {})
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            source=str((spec.get("sourceRef") or {}).get("name", "")),
            phase=str(status.get("phase", "Pending")),
            parent=status.get("parent"),
            template=status.get("template"),
            layers=len(status.get("layers") or ()),
            size_bytes=int(status.get("sizeBytes", 0)),
            total_bytes=int(status.get("totalBytes", 0)),
            ready_time=status.get("readyTime"),
            reason=str(cond.get("reason", "")),
            message=str(cond.get("message", "")),
            raw=obj,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what ``sandpod snapshot ls -o json`` prints)."""
        out = dataclasses.asdict(self)
        out.pop("raw")
        return out


def snapshot_object(
    source: str, *, name: str | None, ttl: int | None, retain: int | None
) -> dict[str, Any]:
    """The SandboxSnapshot object of a create request."""
    spec: dict[str, Any] = {"sourceRef": {"name": source}}
    if ttl is not None:
        spec["ttlSeconds"] = ttl
    if retain is not None:
        spec["retainCount"] = retain
    meta = {"name": name} if name else {}
    return {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": meta,
        "spec": spec,
    }


class AsyncSnapshots:
    """The installation's snapshots (this caller's own, for a tenant)."""

    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus = bus
        self.subjects = subjects

    async def create(
        self,
        source: str,
        *,
        name: str | None = None,
        ttl: int | None = None,
        retain: int | None = None,
        wait: float = CAPTURE_WAIT,
    ) -> SnapshotInfo:
        """Snapshot sandbox ``source`` (running or paused) and return it once Ready.

        Args:
            name: the snapshot's name (default: generated).
            ttl: delete it this many seconds after it is Ready (unless in use).
            retain: keep only the newest ``retain`` snapshots of ``source``.
            wait: seconds to wait for the capture.

        Raises:
            SnapshotFailed: the capture failed (the reason is in the message and ``details``).
            ResourceNotFound: no such sandbox. ResourceInvalid: bad arguments.
        """
        obj = snapshot_object(source, name=name, ttl=ttl, retain=retain)
        reply = await api_call(
            self.bus,
            self.subjects,
            "snapshots",
            "create",
            ObjectRequest(object=obj, wait_ready=wait),
            ObjectReply,
            timeout=wait + 10,
        )
        return SnapshotInfo.of(reply.object)

    async def get(self, name: str) -> SnapshotInfo:
        """Snapshot ``name``. Raises ResourceNotFound."""
        reply = await api_call(
            self.bus, self.subjects, "snapshots", "get", Ref(name=name), ObjectReply
        )
        return SnapshotInfo.of(reply.object)

    async def list(self, source: str | None = None) -> builtins.list[SnapshotInfo]:
        """Every snapshot (of sandbox ``source`` only, when given), oldest first."""
        reply = await api_call(
            self.bus, self.subjects, "snapshots", "list", Selection(), ObjectsReply
        )
        out = [SnapshotInfo.of(o) for o in reply.items]
        if source is not None:
            out = [s for s in out if s.source == source or s.source.endswith("--" + source)]
        return sorted(out, key=lambda s: str(s.raw.get("metadata", {}).get("creationTimestamp")))

    async def delete(self, name: str) -> SnapshotInfo:
        """Delete snapshot ``name`` (its layers go once no other snapshot shares them).

        Raises:
            SnapshotInUse: a sandbox or template restores from it. ResourceNotFound.
        """
        reply = await api_call(
            self.bus, self.subjects, "snapshots", "delete", Ref(name=name), ObjectReply
        )
        return SnapshotInfo.of(reply.object)


class Snapshots:
    """Blocking twin of :class:`AsyncSnapshots`."""

    def __init__(self, inner: AsyncSnapshots) -> None:
        self._inner = inner

    create = twin(AsyncSnapshots.create)
    get = twin(AsyncSnapshots.get)
    list = twin(AsyncSnapshots.list)
    delete = twin(AsyncSnapshots.delete)
