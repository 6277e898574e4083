"""SandboxSnapshot objects: parsing, status writes and who depends on one. No I/O but the store.

A snapshot is *in use* while a Sandbox that is not finished names it in ``spec.snapshotRef``
(its files stack on the snapshot's layers) or a SandboxTemplate does (its sandboxes will);
such a snapshot is never deleted, by a request or by retention.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.resources import API_VERSION, Condition, Phase, SandboxSpec
from sandpod_contract.snapshots import (
    SNAPSHOT_KIND,
    SnapshotPhase,
    SnapshotReason,
    SnapshotSpec,
    SnapshotStatus,
)
from sandpod_contract.times import to_rfc3339
from sandpod_lifecycle.objects import SANDBOX, TEMPLATE
from sandpod_store import Resource, Store

__all__ = ["HIBERNATION_LABEL", "SNAPSHOT", "dependents", "snapshot_from_map", "with_phase"]

SNAPSHOT = SNAPSHOT_KIND
# on the snapshot a sandbox hibernated into: the sandbox's name (its files; it wakes from it)
HIBERNATION_LABEL = "sandpod.dev/hibernation-of"
_FINISHED = {str(Phase.TERMINATED), str(Phase.FAILED)}


def snapshot_from_map(raw: Mapping[str, Any]) -> tuple[Resource, SnapshotSpec]:
    """A client's SandboxSnapshot map as a resource (a name made when absent) and its spec.

    Raises:
        ResourceInvalid: naming the field.
    """
    if not isinstance(raw, Mapping):
        raise ResourceInvalid("object must be a map")
    if raw.get("kind", SNAPSHOT) != SNAPSHOT:
        raise ResourceInvalid(f"kind must be {SNAPSHOT}", field="kind")
    if raw.get("apiVersion", API_VERSION) != API_VERSION:
        raise ResourceInvalid(f"apiVersion must be {API_VERSION}", field="apiVersion")
    spec = SnapshotSpec.from_dict(raw.get("spec") or {})
    obj = Resource.from_dict({**raw, "apiVersion": API_VERSION, "kind": SNAPSHOT, "status": {}})
    if not obj.metadata.name:
        meta = dataclasses.replace(obj.metadata, name=f"snap-{uuid.uuid4().hex[:10]}")
        obj = dataclasses.replace(obj, metadata=meta)
    obj.validate()
    return dataclasses.replace(obj, spec=spec.to_dict()), spec


def with_phase(
    status: SnapshotStatus, phase: SnapshotPhase, reason: SnapshotReason, message: str, now: float
) -> SnapshotStatus:
    """``status`` in ``phase`` with its Ready condition saying ``reason``."""
    ready = Condition(
        "Ready",
        "True" if phase is SnapshotPhase.READY else "False",
        str(reason),
        message,
        to_rfc3339(now),
    )
    return dataclasses.replace(status, phase=phase, conditions=(ready,))


async def dependents(store: Store, namespace: str, name: str) -> list[str]:
    """What restores from snapshot ``name``: ``Sandbox/<name>`` and ``SandboxTemplate/<name>``
    (a sandbox also depends on the snapshot it hibernated into)."""
    out = []
    try:
        snap = await store.get(SNAPSHOT, namespace, name)
    except ResourceNotFound:
        snap = None
    held_by = snap.metadata.labels.get(HIBERNATION_LABEL) if snap is not None else None
    sandboxes, _ = await store.list(SANDBOX, namespace)
    if held_by and any(o.metadata.name == held_by for o in sandboxes):
        out.append(f"{SANDBOX}/{held_by}")
    for obj in sandboxes:
        if (obj.status or {}).get("phase") in _FINISHED:
            continue
        try:
            ref = SandboxSpec.from_dict(obj.spec).snapshot_ref
        except ResourceInvalid:
            continue
        if ref == name:
            out.append(f"{SANDBOX}/{obj.metadata.name}")
    templates, _ = await store.list(TEMPLATE, None)
    for obj in templates:
        tref = (obj.spec.get("snapshotRef") or {}) if isinstance(obj.spec, Mapping) else {}
        named = isinstance(tref, Mapping) and tref.get("name") == name
        if named and obj.metadata.namespace == namespace:
            out.append(f"{TEMPLATE}/{obj.metadata.name}")
    return out
