"""The ``SandboxSnapshot`` resource (``schemas/crds/sandboxsnapshots.sandpod.dev.yaml``).

A snapshot is asked for by creating one (``spec.sourceRef``: the running sandbox to capture);
the lifecycle captures it and fills ``status``: ``Pending`` -> ``Ready`` (its ``layers``, bottom
first, each a content-addressed blob in the object store) or ``Failed`` (the ``Ready``
condition's reason says why). A Sandbox or SandboxTemplate with ``snapshotRef`` starts from
it. ``ttlSeconds`` and ``retainCount`` are its retention: deleted that long after it became
Ready, and only the newest ``retainCount`` snapshots of its source are kept -- never one that a
sandbox or template still restores from.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.resources import Condition

__all__ = [
    "SNAPSHOT_KIND",
    "LayerRef",
    "SnapshotPhase",
    "SnapshotReason",
    "SnapshotSpec",
    "SnapshotStatus",
]

SNAPSHOT_KIND = "SandboxSnapshot"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class SnapshotPhase(enum.StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    FAILED = "Failed"


class SnapshotReason(enum.StrEnum):
    """Reasons of a snapshot's ``Ready`` condition."""

    CAPTURING = "Capturing"
    CAPTURED = "Captured"
    SOURCE_NOT_FOUND = "SourceNotFound"
    SOURCE_NOT_RUNNING = "SourceNotRunning"
    UNSUPPORTED = "Unsupported"
    CAPTURE_FAILED = "CaptureFailed"


def _fail(field: str, why: str) -> ResourceInvalid:
    return ResourceInvalid(f"{field}: {why}", field=field)


def _opt_int(field: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < minimum:
        raise _fail(field, f"must be an integer >= {minimum}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotSpec:
    source_ref: str  # wire: sourceRef.name, the Sandbox to capture (same namespace)
    ttl_seconds: int | None = None
    retain_count: int | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SnapshotSpec:
        """Validate and convert ``spec``. Raises ResourceInvalid naming the field."""
        if not isinstance(raw, Mapping):
            raise _fail("spec", "must be a map")
        ref = raw.get("sourceRef")
        if not isinstance(ref, Mapping) or not _NAME.fullmatch(str(ref.get("name", ""))):
            raise _fail("spec.sourceRef.name", "must name a Sandbox (a DNS label)")
        return cls(
            source_ref=str(ref["name"]),
            ttl_seconds=_opt_int("spec.ttlSeconds", raw.get("ttlSeconds"), 1),
            retain_count=_opt_int("spec.retainCount", raw.get("retainCount"), 1),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sourceRef": {"name": self.source_ref}}
        if self.ttl_seconds is not None:
            out["ttlSeconds"] = self.ttl_seconds
        if self.retain_count is not None:
            out["retainCount"] = self.retain_count
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class LayerRef:
    """One layer of a snapshot: a blob in the object store (see ``runtime/snaplayers.py``)."""

    digest: str
    size: int  # bytes of the blob (compressed)
    part: str  # rootfs | workspace (the local runtime's) | podroot (a Pod's root fs changes)
    owner: int  # the uid its files belonged to when captured
    unpacked: int = 0  # bytes of its files

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LayerRef:
        if not isinstance(raw, Mapping) or not _DIGEST.fullmatch(str(raw.get("digest", ""))):
            raise _fail("status.layers", "each layer needs a sha256 digest")
        part = str(raw.get("part", ""))
        if part not in ("rootfs", "workspace", "podroot"):
            raise _fail("status.layers", "part must be rootfs, workspace or podroot")
        return cls(
            digest=str(raw["digest"]),
            size=int(raw.get("size", 0)),
            part=part,
            owner=int(raw.get("owner", 0)),
            unpacked=int(raw.get("unpacked", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "size": self.size,
            "part": self.part,
            "owner": self.owner,
            "unpacked": self.unpacked,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotStatus:
    phase: SnapshotPhase = SnapshotPhase.PENDING
    source_uid: str | None = None  # the captured Sandbox object's uid (names are reused)
    template: str | None = None  # the source's template: a restore runs on its base
    parent: str | None = None  # the snapshot this one adds layers to
    layers: tuple[LayerRef, ...] = ()
    size_bytes: int = 0  # this snapshot's own layers (compressed)
    total_bytes: int = 0  # every layer of the chain (compressed)
    ready_time: str | None = None
    conditions: tuple[Condition, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> SnapshotStatus:
        raw = raw or {}
        try:
            phase = SnapshotPhase(raw.get("phase", "Pending"))
        except ValueError as exc:
            raise _fail(
                "status.phase", f"must be one of {[p.value for p in SnapshotPhase]}"
            ) from exc
        return cls(
            phase=phase,
            source_uid=raw.get("sourceUid"),
            template=raw.get("template"),
            parent=raw.get("parent"),
            layers=tuple(LayerRef.from_dict(x) for x in raw.get("layers") or ()),
            size_bytes=int(raw.get("sizeBytes", 0)),
            total_bytes=int(raw.get("totalBytes", 0)),
            ready_time=raw.get("readyTime"),
            conditions=tuple(Condition.from_dict(c) for c in raw.get("conditions") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": str(self.phase),
            "layers": [x.to_dict() for x in self.layers],
            "sizeBytes": self.size_bytes,
            "totalBytes": self.total_bytes,
            "conditions": [c.to_dict() for c in self.conditions],
        }
        for key, value in (
            ("sourceUid", self.source_uid),
            ("template", self.template),
            ("parent", self.parent),
            ("readyTime", self.ready_time),
        ):
            if value:
                out[key] = value
        return out
