"""The resource store interface every implementation honours (JetStream KV, memory, Kubernetes).

Semantics follow the Kubernetes API so one contract suite can hold every implementation to them:

- ``create`` assigns ``uid``, ``generation=1``, ``creationTimestamp`` and ``resourceVersion``;
  status given on create is dropped (status is a subresource).
- ``update`` replaces metadata labels/annotations/ownerReferences and spec if ``resourceVersion``
  still matches (else ``ResourceConflict``); status is kept; ``generation`` grows only when
  spec changed.
- ``update_status`` replaces only status, under the same optimistic concurrency.
- ``delete`` removes (optionally only at a given ``resourceVersion``).
- ``list`` returns items and a revision; ``watch(from_revision=that)`` then yields every later
  change in order: no gap between a list and a watch.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from sandpod_store.model import Resource

__all__ = ["EventType", "Store", "WatchEvent"]


class EventType(enum.Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    kind: str
    namespace: str
    name: str
    revision: int
    resource: Resource | None  # None for DELETED


class Store(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> Resource:
        """The object. Raises ResourceNotFound."""

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | None = None,
    ) -> tuple[list[Resource], int]:
        """Objects of ``kind`` (in ``namespace``, or all), filtered by a label selector."""

    async def create(self, obj: Resource) -> Resource:
        """Store a new object. Raises ResourceExists, ResourceInvalid."""

    async def update(self, obj: Resource) -> Resource:
        """Replace spec/labels/annotations at ``obj.metadata.resource_version``.

        Raises ResourceConflict, ResourceNotFound, ResourceInvalid.
        """

    async def update_status(self, obj: Resource) -> Resource:
        """Replace status at ``obj.metadata.resource_version``. Raises ResourceConflict."""

    async def delete(
        self, kind: str, namespace: str, name: str, resource_version: str | None = None
    ) -> None:
        """Remove the object. Raises ResourceNotFound, ResourceConflict."""

    def watch(
        self,
        kind: str,
        namespace: str | None = None,
        from_revision: int = 0,
        name: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Every change after ``from_revision``, in order; with ``name``, of that object only
        (a waiter on one object then does not receive every other object's changes)."""
