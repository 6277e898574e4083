"""Kubernetes-shaped objects as the store keeps them, and label selectors.

``Resource`` is the generic envelope (apiVersion, kind, metadata, spec, status) every store
implementation reads and writes; typed views of particular kinds (Sandbox, SandboxTemplate) wrap
it. ``to_dict``/``from_dict`` give the Kubernetes wire shape (camelCase metadata), which is what
the KV store persists and what a Kubernetes store would send to the API server.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid
from sandpod_contract.reserved import keep_reserved

__all__ = [
    "ObjectMeta",
    "OwnerReference",
    "Resource",
    "Selector",
    "parse_selector",
    "validate_name",
]

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def validate_name(what: str, value: str) -> str:
    """``value`` if it is a DNS label (1-63 of [a-z0-9-]), else ResourceInvalid."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ResourceInvalid(
            f"{what} {value!r} must be a DNS label: 1-63 lowercase letters, digits and '-'",
            field=what,
        )
    return value


def _validate_labels(labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise ResourceInvalid(f"label key {key!r} is not valid", field="metadata.labels")
        if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
            raise ResourceInvalid(f"label value {value!r} is not valid", field="metadata.labels")


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerReference:
    """Kubernetes' ``metadata.ownerReferences[]``: the object that owns this one (same
    namespace), pinned by uid so a deleted and recreated owner of the same name owns nothing.

    Written by services only: the API handlers refuse a client's. Like labels, an update writes
    the caller's references, so a service updates by read-modify-write (as it does anyway)."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": self.controller,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OwnerReference:
        if not isinstance(raw, Mapping):
            raise ResourceInvalid("an owner reference must be a map", field="metadata")
        return cls(
            api_version=str(raw.get("apiVersion") or ""),
            kind=str(raw.get("kind") or ""),
            name=str(raw.get("name") or ""),
            uid=str(raw.get("uid") or ""),
            controller=bool(raw.get("controller")),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str = "default"
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resource_version: str = ""
    generation: int = 0
    uid: str = ""
    creation_timestamp: str = ""
    owner_references: tuple[OwnerReference, ...] = ()

    def applied_over(self, current: ObjectMeta) -> ObjectMeta:
        """This (a client's ``apply``) over the stored ``current``: current's resourceVersion,
        and the services' own metadata kept -- reserved labels and annotations, ownerReferences
        (the client's were refused before; :mod:`sandpod_contract.reserved`)."""
        return dataclasses.replace(
            self,
            resource_version=current.resource_version,
            labels=keep_reserved(self.labels, current.labels),
            annotations=keep_reserved(self.annotations, current.annotations),
            owner_references=current.owner_references,
        )

    def controller(self) -> OwnerReference | None:
        """The owner reference marked ``controller`` (at most one, as in Kubernetes)."""
        return next((o for o in self.owner_references if o.controller), None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.owner_references:
            out["ownerReferences"] = [o.to_dict() for o in self.owner_references]
        for key, value in (
            ("resourceVersion", self.resource_version),
            ("generation", self.generation),
            ("uid", self.uid),
            ("creationTimestamp", self.creation_timestamp),
        ):
            if value:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ObjectMeta:
        try:
            return cls(
                name=str(raw.get("name") or ""),
                namespace=str(raw.get("namespace") or "default"),
                labels=dict(raw.get("labels") or {}),
                annotations=dict(raw.get("annotations") or {}),
                resource_version=str(raw.get("resourceVersion") or ""),
                generation=int(raw.get("generation") or 0),
                uid=str(raw.get("uid") or ""),
                creation_timestamp=str(raw.get("creationTimestamp") or ""),
                owner_references=tuple(
                    OwnerReference.from_dict(o) for o in raw.get("ownerReferences") or ()
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResourceInvalid(f"metadata is malformed: {exc}", field="metadata") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class Resource:
    api_version: str
    kind: str
    metadata: ObjectMeta
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    status: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.metadata.namespace, self.metadata.name

    def validate(self) -> None:
        """Check what every kind needs (names, labels); kind-specific schemas check the rest."""
        if not _KIND.fullmatch(self.kind or ""):
            raise ResourceInvalid(f"kind {self.kind!r} is not valid", field="kind")
        validate_name("metadata.name", self.metadata.name)
        validate_name("metadata.namespace", self.metadata.namespace)
        _validate_labels(self.metadata.labels)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": self.metadata.to_dict(),
            "spec": dict(self.spec),
        }
        if self.status:
            out["status"] = dict(self.status)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Resource:
        if not isinstance(raw, Mapping):
            raise ResourceInvalid("a resource must be a map")
        spec, status = raw.get("spec") or {}, raw.get("status") or {}
        if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
            raise ResourceInvalid("spec and status must be maps")
        return cls(
            api_version=str(raw.get("apiVersion", "")),
            kind=str(raw.get("kind", "")),
            metadata=ObjectMeta.from_dict(raw.get("metadata") or {}),
            spec=dict(spec),
            status=dict(status),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        return {
            "=": present and value in self.values,
            "!=": not present or value not in self.values,
            "in": present and value in self.values,
            "notin": not present or value not in self.values,
            "exists": present,
            "!": not present,
        }[self.op]


@dataclasses.dataclass(frozen=True, slots=True)
class Selector:
    """A Kubernetes label selector (equality and set-based)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_top(expr: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in expr:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_selector(expr: str | Mapping[str, str] | None) -> Selector:
    """Parse ``"app=web,tier!=db,env in (a,b),!legacy,owner"`` or a ``{key: value}`` map.

    Raises:
        ResourceInvalid: the expression is malformed.
    """
    if expr is None:
        return Selector()
    if isinstance(expr, Mapping):
        return Selector(tuple(Requirement(k, "=", (v,)) for k, v in expr.items()))
    reqs: list[Requirement] = []
    for part in _split_top(expr):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            reqs.append(Requirement(key.strip(), "!=", (value.strip(),)))
        elif "=" in part:
            key, value = part.split("==", 1) if "==" in part else part.split("=", 1)
            reqs.append(Requirement(key.strip(), "=", (value.strip(),)))
        elif part.startswith("!"):
            reqs.append(Requirement(part[1:].strip(), "!"))
        else:
            reqs.append(Requirement(part, "exists"))
    for req in reqs:
        if not req.key or not _LABEL_KEY.fullmatch(req.key):
            raise ResourceInvalid(f"label selector {expr!r} is malformed", field="selector")
    return Selector(tuple(reqs))
