"""An in-memory mirror of one kind of object in the store, kept by list + watch.

The claim hot path must not list the store on every claim: it reads free warm members from this
mirror and binds one with an optimistic-concurrency update, so a stale mirror costs a retry,
never a double assignment. The pool reconciler reads it too, and counts what it just created
because :meth:`Mirror.observe` takes the store's reply at once (no wait for the watch: that
lag is how a naive controller over-creates).

Data flow: ``run()`` lists, then watches from the list's revision; every change replaces the
entry (older resourceVersions never overwrite newer ones) and calls ``on_change(obj)`` so the
owner can enqueue the affected pool or claim. A watch failure re-lists after a short pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import structlog

from sandpod_contract.errors import SandpodError
from sandpod_store import EventType, Resource, Store

__all__ = ["Key", "Mirror"]

log = structlog.get_logger("sandpod.pool.cache")

Key = tuple[str, str]  # (namespace, name)


def _version(obj: Resource) -> int:
    try:
        return int(obj.metadata.resource_version)
    except ValueError:
        return 0


class Mirror:
    """The objects of ``kind`` (every namespace) that ``keep`` accepts."""

    def __init__(
        self,
        store: Store,
        kind: str,
        *,
        keep: Callable[[Resource], bool] = lambda _: True,
        on_change: Callable[[Key, Resource | None], None] = lambda _k, _o: None,
    ) -> None:
        self.store = store
        self.kind = kind
        self._keep = keep
        self._on_change = on_change
        self._items: dict[Key, Resource] = {}
        self._waiters: dict[Key, list[asyncio.Future[None]]] = {}
        self.synced = asyncio.Event()

    def get(self, namespace: str, name: str) -> Resource | None:
        return self._items.get((namespace, name))

    def values(self) -> Iterator[Resource]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def observe(self, obj: Resource) -> None:
        """Take ``obj`` as the newest state (from the watch, or from a write's reply)."""
        key = (obj.metadata.namespace, obj.metadata.name)
        old = self._items.get(key)
        if old is not None and _version(old) > _version(obj):
            return
        if self._keep(obj):
            self._items[key] = obj
        elif old is not None:
            del self._items[key]
        else:
            return
        self._changed(key, obj)

    def forget(self, namespace: str, name: str) -> None:
        if self._items.pop((namespace, name), None) is not None:
            self._changed((namespace, name), None)

    def _changed(self, key: Key, obj: Resource | None) -> None:
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)
        self._on_change(key, obj)

    async def wait_for(
        self, namespace: str, name: str, done: Callable[[Resource | None], bool], timeout: float
    ) -> Resource | None:
        """The object once ``done(obj)`` holds (None: absent), or its state at ``timeout``."""
        key = (namespace, name)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not done(obj := self._items.get(key)):
            left = end - loop.time()
            if left <= 0:
                return obj
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(key, []).append(fut)
            try:
                await asyncio.wait_for(fut, left)
            except TimeoutError:
                waiters = self._waiters.get(key, [])
                if fut in waiters:
                    waiters.remove(fut)
                if not waiters:
                    self._waiters.pop(key, None)
        return obj

    async def run(self) -> None:
        """List, then follow the watch, until cancelled."""
        while True:
            try:
                items, revision = await self.store.list(self.kind, None)
                seen = set()
                for obj in items:
                    seen.add((obj.metadata.namespace, obj.metadata.name))
                    self.observe(obj)
                for key in set(self._items) - seen:
                    self.forget(*key)
                self.synced.set()
                async for event in self.store.watch(self.kind, None, revision):
                    if event.type is EventType.DELETED or event.resource is None:
                        self.forget(event.namespace, event.name)
                    else:
                        self.observe(event.resource)
            except SandpodError as exc:
                log.warning("mirror_watch_failed", kind=self.kind, error=exc.message)
                await asyncio.sleep(0.5)
