"""Transitions shared by store implementations: stamping creates, merging updates."""

from __future__ import annotations

import dataclasses
import time
import uuid

from sandpod_contract.errors import ResourceConflict
from sandpod_contract.times import to_rfc3339
from sandpod_store.model import Resource

__all__ = ["check_version", "merge_status", "merge_update", "stamp_create"]


def stamp_create(obj: Resource, now: float | None = None) -> Resource:
    """What ``create`` stores: fresh uid/generation/timestamp (``now``, epoch seconds; the
    machine's time by default), no status, no version yet."""
    obj.validate()
    meta = dataclasses.replace(
        obj.metadata,
        uid=str(uuid.uuid4()),
        generation=1,
        creation_timestamp=to_rfc3339(time.time() if now is None else now),
        resource_version="",
    )
    return dataclasses.replace(obj, metadata=meta, status={})


def check_version(obj: Resource, current: Resource) -> None:
    wanted = obj.metadata.resource_version
    if wanted and wanted != current.metadata.resource_version:
        kind, ns, name = obj.key
        raise ResourceConflict(
            f"{kind} {ns}/{name} is at resourceVersion {current.metadata.resource_version}, "
            f"not {wanted}; re-read it and retry",
            kind=kind,
            name=name,
        )


def merge_update(obj: Resource, current: Resource) -> Resource:
    """``current`` with obj's labels, annotations, owner references and spec; generation+1 if
    spec changed."""
    obj.validate()
    check_version(obj, current)
    generation = current.metadata.generation + (1 if dict(obj.spec) != dict(current.spec) else 0)
    meta = dataclasses.replace(
        current.metadata,
        labels=dict(obj.metadata.labels),
        annotations=dict(obj.metadata.annotations),
        owner_references=tuple(obj.metadata.owner_references),
        generation=generation,
    )
    return dataclasses.replace(current, metadata=meta, spec=dict(obj.spec))


def merge_status(obj: Resource, current: Resource) -> Resource:
    check_version(obj, current)
    return dataclasses.replace(current, status=dict(obj.status))
