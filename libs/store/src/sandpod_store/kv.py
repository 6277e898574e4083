"""The embedded store: resources in one JetStream KV bucket, keyed ``<kind>.<namespace>.<name>``.

Each value is ``{"op": create|update|status, "object": <Kubernetes-shaped map>}`` as JSON (easy to
read with ``nats kv get``); ``resourceVersion`` is the KV revision, so optimistic concurrency is
the bucket's compare-and-set, and a watch resumes from any revision.

An update merges the caller's object into the stored one (status kept, generation bumped on a
spec change), which needs the stored object. A revision names exactly one stored value, so the
store remembers the last object it saw per key (from reads, writes and watches; bounded LRU):
when the caller's ``resourceVersion`` is that revision, the remembered object *is* the current
one if the compare-and-set succeeds, and the read round trip is skipped. A claim's bind is then
one round trip, not two.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping

from sandpod_bus import Bus, KvBucket, KvEntry
from sandpod_contract.errors import ResourceConflict, ResourceInvalid, ResourceNotFound
from sandpod_store.common import merge_status, merge_update, stamp_create
from sandpod_store.interface import EventType, WatchEvent
from sandpod_store.model import Resource, parse_selector, validate_name

__all__ = ["KvStore"]

DEFAULT_BUCKET = "sandpod-resources"
HISTORY = 64
REMEMBER = 16384  # objects remembered for updates without a read (LRU)


def _key(kind: str, namespace: str, name: str) -> str:
    validate_name("metadata.namespace", namespace)
    validate_name("metadata.name", name)
    return f"{kind}.{namespace}.{name}"


def _encode(op: str, obj: Resource) -> bytes:
    data = obj.to_dict()
    data["metadata"].pop("resourceVersion", None)
    return json.dumps({"op": op, "object": data}, sort_keys=True).encode()


def _decode(entry: KvEntry) -> tuple[str, Resource]:
    try:
        raw = json.loads(entry.value)
        obj = Resource.from_dict(raw["object"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ResourceInvalid(f"stored value of {entry.key} is corrupt: {exc}") from exc
    meta = dataclasses.replace(obj.metadata, resource_version=str(entry.revision))
    return str(raw.get("op", "update")), dataclasses.replace(obj, metadata=meta)


class KvStore:
    def __init__(self, bucket: KvBucket, remember: int = REMEMBER) -> None:
        self._bucket = bucket
        self._seen: collections.OrderedDict[str, Resource] = collections.OrderedDict()
        self._remember = remember
        self.reads_saved = 0  # updates that needed no read (tests, metrics)

    def _note(self, obj: Resource) -> Resource:
        key = _key(*obj.key)
        old = self._seen.get(key)
        if old is None or _rev(old) <= _rev(obj):
            self._seen[key] = obj
            self._seen.move_to_end(key)
            if len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        return obj

    async def _current(self, obj: Resource) -> Resource:
        """The stored object ``obj`` was read from, without a round trip when it is known."""
        seen = self._seen.get(_key(*obj.key))
        wanted = obj.metadata.resource_version
        if seen is not None and wanted and seen.metadata.resource_version == wanted:
            self.reads_saved += 1
            return seen
        return await self.get(*obj.key)

    @classmethod
    async def open(cls, bus: Bus, bucket: str = DEFAULT_BUCKET) -> KvStore:
        # 64 revisions per key (the JetStream maximum): a watch resuming from a recent revision
        # sees every step, not just the latest value of a key.
        return cls(await bus.kv(bucket, history=HISTORY))

    async def get(self, kind: str, namespace: str, name: str) -> Resource:
        try:
            entry = await self._bucket.get(_key(kind, namespace, name))
        except ResourceNotFound:
            raise ResourceNotFound(
                f"{kind} {namespace}/{name} not found", kind=kind, name=name
            ) from None
        return self._note(_decode(entry)[1])

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        selector: str | Mapping[str, str] | None = None,
    ) -> tuple[list[Resource], int]:
        sel = parse_selector(selector)
        entries, revision = await self._bucket.entries(f"{kind}.{namespace or '*'}.*")
        items = [
            obj
            for obj in (self._note(_decode(e)[1]) for e in entries)
            if sel.matches(obj.metadata.labels)
        ]
        return items, revision

    async def create(self, obj: Resource) -> Resource:
        fresh = stamp_create(obj)
        revision = await self._bucket.create(_key(*fresh.key), _encode("create", fresh))
        return self._note(_with_version(fresh, revision))

    async def update(self, obj: Resource) -> Resource:
        current = await self._current(obj)
        merged = merge_update(obj, current)
        return await self._put("update", merged, current)

    async def update_status(self, obj: Resource) -> Resource:
        current = await self._current(obj)
        merged = merge_status(obj, current)
        return await self._put("status", merged, current)

    async def _put(self, op: str, merged: Resource, current: Resource) -> Resource:
        try:
            revision = await self._bucket.update(
                _key(*merged.key), _encode(op, merged), int(current.metadata.resource_version)
            )
        except ResourceConflict:
            kind, ns, name = merged.key
            raise ResourceConflict(
                f"{kind} {ns}/{name} changed concurrently; re-read and retry", kind=kind, name=name
            ) from None
        return self._note(_with_version(merged, revision))

    async def delete(
        self, kind: str, namespace: str, name: str, resource_version: str | None = None
    ) -> None:
        self._seen.pop(_key(kind, namespace, name), None)
        try:
            await self._bucket.delete(
                _key(kind, namespace, name), int(resource_version) if resource_version else None
            )
        except ResourceNotFound:
            raise ResourceNotFound(
                f"{kind} {namespace}/{name} not found", kind=kind, name=name
            ) from None

    async def watch(
        self,
        kind: str,
        namespace: str | None = None,
        from_revision: int = 0,
        name: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        # with a name, the server filters: one object's changes are all that cross the bus
        pattern = f"{kind}.{namespace or '*'}.{name or '*'}"
        async for entry in self._bucket.watch(pattern, from_revision):
            _, ns, name = entry.key.split(".", 2)
            if entry.deleted:
                self._seen.pop(entry.key, None)
                yield WatchEvent(EventType.DELETED, kind, ns, name, entry.revision, None)
                continue
            op, obj = _decode(entry)
            self._note(obj)
            etype = EventType.ADDED if op == "create" else EventType.MODIFIED
            yield WatchEvent(etype, kind, ns, name, entry.revision, obj)


def _rev(obj: Resource) -> int:
    return int(obj.metadata.resource_version or 0)


def _with_version(obj: Resource, revision: int) -> Resource:
    return dataclasses.replace(
        obj, metadata=dataclasses.replace(obj.metadata, resource_version=str(revision))
    )
