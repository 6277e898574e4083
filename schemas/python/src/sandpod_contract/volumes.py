"""Typed model of ``SandboxVolume`` (``schemas/crds/sandboxvolumes.sandpod.dev.yaml``) and of the
``volumes`` list a Sandbox or SandboxTemplate mounts (``spec.volumes[]``).

A SandboxVolume is named persistent storage that outlives sandboxes: ``spec.size`` is its quota
(the local runtime gives it an ext4 filesystem of exactly that size; Kubernetes a PVC of that
request from ``spec.storageClassName`` or the installation's class). Sandboxes name it in
``spec.volumes: [{name, mountPath, readOnly}]``. Exclusivity, recorded in the volume's status
and written with the store's optimistic concurrency by the lifecycle API:

- ``status.writer``: the one sandbox that mounts it read-write; while there is one, nobody else
  mounts it (not even read-only: a reader would see a filesystem changing under it, and ext4
  has no cross-mount coherence to offer it);
- ``status.readers``: the sandboxes that mount it read-only, any number while there is no writer.

As in :mod:`sandpod_contract.resources`, the YAML is the single source of the schema and
``tests/contract/test_crds.py`` checks these fields against it; bad input raises
:class:`ResourceInvalid` naming the field.
"""

from __future__ import annotations

import dataclasses
import enum
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid

__all__ = [
    "MAX_VOLUMES",
    "MIN_VOLUME",
    "RESERVED_MOUNTS",
    "SandboxVolumeSpec",
    "SandboxVolumeStatus",
    "VolumeMount",
    "VolumePhase",
    "quantity_bytes",
]

MIN_VOLUME = 16 * 2**20  # the smallest ext4 filesystem a volume can be
MAX_VOLUMES = 16  # volumes one sandbox may mount
MAX_MOUNT_PATH = 200
# Where a volume may never be mounted: the sandbox's own mounts (the runtime makes them) and "/".
RESERVED_MOUNTS = ("/proc", "/dev", "/sys", "/run", "/workspace", "/tmp")  # noqa: S108 - not a file
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?")
_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+")  # no spaces, commas, colons: mount(8)-safe
_CLASS = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})


def _fail(field: str, why: str) -> ResourceInvalid:
    return ResourceInvalid(f"{field}: {why}", field=field)


def quantity_bytes(field: str, value: Any) -> int:
    """Bytes of a Kubernetes quantity (``10Gi``, ``512M``). Raises ResourceInvalid."""
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise _fail(field, f"{value!r} is not a quantity (e.g. 1Gi, 512Mi)")
    return int(match[1]) * _UNITS[match[2] or ""]


class VolumePhase(enum.StrEnum):
    PENDING = "Pending"  # written; its storage not made yet
    AVAILABLE = "Available"  # storage made, nobody mounts it
    IN_USE = "InUse"  # a writer or readers mount it
    FAILED = "Failed"  # its storage could not be made (conditions say why)


@dataclasses.dataclass(frozen=True, slots=True)
class VolumeMount:
    """One entry of a Sandbox's or template's ``spec.volumes``."""

    name: str
    mount_path: str
    read_only: bool = False

    @classmethod
    def parse(cls, field: str, raw: Any) -> tuple[VolumeMount, ...]:
        """Validate ``spec.volumes``. Raises ResourceInvalid naming the entry's field."""
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise _fail(field, "must be a list of {name, mountPath, readOnly}")
        if len(raw) > MAX_VOLUMES:
            raise _fail(field, f"at most {MAX_VOLUMES} volumes")
        out: list[VolumeMount] = []
        for i, item in enumerate(raw):
            at = f"{field}[{i}]"
            if not isinstance(item, Mapping):
                raise _fail(at, "must be a map {name, mountPath, readOnly}")
            name = item.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise _fail(f"{at}.name", "must be a DNS label (a SandboxVolume's name)")
            path = _mount_path(f"{at}.mountPath", item.get("mountPath"))
            read_only = item.get("readOnly", False)
            if type(read_only) is not bool:
                raise _fail(f"{at}.readOnly", "must be true or false")
            for other in out:
                if other.name == name:
                    raise _fail(f"{at}.name", f"volume {name!r} is listed twice")
                if _nested(other.mount_path, path):
                    raise _fail(f"{at}.mountPath", f"overlaps {other.mount_path!r}")
            out.append(cls(name, path, read_only))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mountPath": self.mount_path, "readOnly": self.read_only}


def _is_map(value: Any) -> bool:
    return isinstance(value, Mapping)


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _mount_path(field: str, value: Any) -> str:
    """An absolute, normalised path of ``[A-Za-z0-9._-]`` components outside the sandbox's own
    mounts. Raises ResourceInvalid naming ``field``."""
    if not isinstance(value, str) or not value:
        raise _fail(field, "must be an absolute path")
    if len(value) > MAX_MOUNT_PATH or not _PATH.fullmatch(value):
        raise _fail(field, f"must be an absolute path of [A-Za-z0-9._-] components, got {value!r}")
    if posixpath.normpath(value) != value or any(p in (".", "..") for p in value.split("/")):
        raise _fail(field, f"must be normalised (no '.', '..', '//' or trailing '/'): {value!r}")
    for reserved in RESERVED_MOUNTS:
        if _nested(value, reserved):
            raise _fail(field, f"{value!r} is (in) the sandbox's own {reserved}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxVolumeSpec:
    size: str
    storage_class_name: str | None = None

    @property
    def size_bytes(self) -> int:
        return quantity_bytes("spec.size", self.size)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SandboxVolumeSpec:
        """Validate and convert ``spec``. Raises ResourceInvalid naming the field."""
        if not isinstance(raw, Mapping):
            raise _fail("spec", "must be a map")
        size = raw.get("size")
        if size is None:
            raise _fail("spec.size", "is required (e.g. 1Gi)")
        if quantity_bytes("spec.size", size) < MIN_VOLUME:
            raise _fail("spec.size", f"{size!r} is below the minimum of 16Mi")
        sc = raw.get("storageClassName")
        if sc is not None and (not isinstance(sc, str) or not _CLASS.fullmatch(sc)):
            raise _fail("spec.storageClassName", "must be a DNS subdomain (a StorageClass)")
        return cls(size=str(size), storage_class_name=sc)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.size}
        if self.storage_class_name:
            out["storageClassName"] = self.storage_class_name
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxVolumeStatus:
    phase: VolumePhase = VolumePhase.PENDING
    observed_generation: int = 0
    conditions: tuple[Mapping[str, Any], ...] = ()
    used_bytes: int | None = None
    writer: str | None = None  # the sandbox mounting it read-write
    readers: tuple[str, ...] = ()  # the sandboxes mounting it read-only

    @property
    def holders(self) -> tuple[str, ...]:
        return (self.writer, *self.readers) if self.writer else self.readers

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SandboxVolumeStatus:
        used = raw.get("usedBytes")
        try:
            phase = VolumePhase(raw.get("phase", "Pending"))
        except ValueError:
            phase = VolumePhase.PENDING
        return cls(
            phase=phase,
            observed_generation=int(raw.get("observedGeneration", 0)),
            conditions=tuple(
                dict(c) for c in raw.get("conditions") or () if isinstance(c, Mapping)
            ),
            used_bytes=used if type(used) is int else None,
            writer=raw.get("writer") or None,
            readers=tuple(str(r) for r in raw.get("readers") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": str(self.phase),
            "observedGeneration": self.observed_generation,
            "conditions": [dict(c) for c in self.conditions],
            "readers": list(self.readers),
        }
        if self.writer:
            out["writer"] = self.writer
        if self.used_bytes is not None:
            out["usedBytes"] = self.used_bytes
        return out
