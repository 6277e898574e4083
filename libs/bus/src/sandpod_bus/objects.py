"""JetStream object-store buckets behind Sandpod's own types (the bus stays the only nats user).

Template builds carry a client's files this way: the client puts a tar under its content digest
(``sha256:<hex>``, so an upload is idempotent and the name is the proof of the content), the
lifecycle gets it back while building the ``copy`` step. nats-py errors become the contract's
store errors at this boundary.
"""

from __future__ import annotations

from pathlib import Path

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

from sandpod_contract.errors import ResourceNotFound, StoreError

__all__ = ["ObjectBucket", "open_objects"]


class ObjectBucket:
    """One object-store bucket. Get it with :meth:`sandpod_bus.Bus.objects`."""

    def __init__(self, store: ObjectStore, name: str) -> None:
        self._store = store
        self.name = name

    async def exists(self, key: str) -> bool:
        try:
            await self._store.get_info(key)
        except nats.js.errors.ObjectNotFoundError:
            return False
        except nats.errors.Error as exc:
            raise StoreError(f"cannot look up {key} in {self.name}: {exc}") from exc
        return True

    async def put_file(self, key: str, path: Path) -> None:
        """Store the file at ``path`` as ``key`` (streamed in chunks, never read whole)."""
        try:
            with path.open("rb") as f:
                await self._store.put(key, f)
        except nats.errors.Error as exc:
            raise StoreError(f"cannot store {key} in {self.name}: {exc}") from exc

    async def get_file(self, key: str, path: Path) -> None:
        """Write object ``key`` to ``path``. Raises ResourceNotFound when it is absent."""
        try:
            with path.open("wb") as f:
                await self._store.get(key, writeinto=f)
        except nats.js.errors.ObjectNotFoundError as exc:
            raise ResourceNotFound(f"{key} is not in {self.name}", key=key) from exc
        except nats.errors.Error as exc:
            raise StoreError(f"cannot read {key} from {self.name}: {exc}") from exc

    async def delete(self, key: str) -> None:
        """Remove object ``key`` (nothing happens when it is absent)."""
        try:
            await self._store.delete(key)
        except nats.js.errors.ObjectNotFoundError:
            return
        except nats.errors.Error as exc:
            raise StoreError(f"cannot delete {key} from {self.name}: {exc}") from exc

    async def keys(self) -> list[str]:
        """The names of every object in the bucket (deleted ones left out)."""
        try:
            infos = await self._store.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return []  # an empty bucket
        except nats.errors.Error as exc:
            raise StoreError(f"cannot list {self.name}: {exc}") from exc
        return [info.name for info in infos if info.name]


async def open_objects(js: JetStreamContext, bucket: str) -> ObjectBucket:
    """The bucket ``bucket``, created if missing."""
    try:
        try:
            store = await js.object_store(bucket)
        except nats.js.errors.BucketNotFoundError:
            store = await js.create_object_store(bucket)
    except nats.errors.Error as exc:
        raise StoreError(f"cannot open object store {bucket}: {exc}") from exc
    return ObjectBucket(store, bucket)
