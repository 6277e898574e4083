"""An in-memory store: the fast fake for unit tests, held to the same contract suite as KV."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping

from sandpod_contract.errors import ResourceExists, ResourceNotFound
from sandpod_store.common import check_version, merge_status, merge_update, stamp_create
from sandpod_store.interface import EventType, WatchEvent
from sandpod_store.model import Resource, parse_selector

__all__ = ["MemoryStore"]

HISTORY = 10_000  # events kept for watches from an old revision


class MemoryStore:
    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        """``now``: the clock that stamps ``creationTimestamp`` (a test's fake clock)."""
        self._now = now
        self._objects: dict[tuple[str, str, str], Resource] = {}
        self._events: list[WatchEvent] = []
        self._revision = 0
        self._news = asyncio.Condition()

    async def _record(self, etype: EventType, obj: Resource) -> Resource:
        self._revision += 1
        kind, ns, name = obj.key
        stored = dataclasses.replace(
            obj, metadata=dataclasses.replace(obj.metadata, resource_version=str(self._revision))
        )
        if etype is EventType.DELETED:
            self._objects.pop(obj.key, None)
        else:
            self._objects[obj.key] = stored
        event = WatchEvent(
            etype, kind, ns, name, self._revision, None if etype is EventType.DELETED else stored
        )
        self._events.append(event)
        del self._events[:-HISTORY]
        async with self._news:
            self._news.notify_all()
        return stored

    def _current(self, kind: str, namespace: str, name: str) -> Resource:
        try:
            return self._objects[(kind, namespace, name)]
        except KeyError:
            raise ResourceNotFound(
                f"{kind} {namespace}/{name} not found", kind=kind, name=name
            ) from None

    async def get(self, kind: str, namespace: str, name: str) -> Resource:
        return self._current(kind, namespace, name)

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | None = None,
    ) -> tuple[list[Resource], int]:
        sel = parse_selector(selector)
        items = [
            o
            for (k, ns, _), o in sorted(self._objects.items())
            if k == kind and namespace in (None, ns) and sel.matches(o.metadata.labels)
        ]
        return items, self._revision

    async def create(self, obj: Resource) -> Resource:
        fresh = stamp_create(obj, self._now())
        if fresh.key in self._objects:
            kind, ns, name = fresh.key
            raise ResourceExists(f"{kind} {ns}/{name} exists", kind=kind, name=name)
        return await self._record(EventType.ADDED, fresh)

    async def update(self, obj: Resource) -> Resource:
        current = self._current(*obj.key)
        return await self._record(EventType.MODIFIED, merge_update(obj, current))

    async def update_status(self, obj: Resource) -> Resource:
        current = self._current(*obj.key)
        return await self._record(EventType.MODIFIED, merge_status(obj, current))

    async def delete(
        self, kind: str, namespace: str, name: str, resource_version: str | None = None
    ) -> None:
        current = self._current(kind, namespace, name)
        if resource_version:
            probe = dataclasses.replace(
                current,
                metadata=dataclasses.replace(current.metadata, resource_version=resource_version),
            )
            check_version(probe, current)
        await self._record(EventType.DELETED, current)

    async def watch(
        self,
        kind: str,
        namespace: str | None = None,
        from_revision: int = 0,
        name: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        cursor = from_revision
        while True:
            for event in [e for e in self._events if e.revision > cursor]:
                cursor = event.revision
                if (
                    event.kind == kind
                    and namespace in (None, event.namespace)
                    and name in (None, event.name)
                ):
                    yield event
            async with self._news:
                if not any(e.revision > cursor for e in self._events):
                    await self._news.wait()
