"""JetStream object-store buckets behind Sandpod's own types (the bus stays the only nats user).

Template builds carry a client's files this way: the client puts a tar under its content digest
(``sha256:<hex>``, so an upload is idempotent and the name is the proof of the content), the
lifecycle gets it back while building the ``copy`` step. Snapshot blobs (``sandpod_blobs``) use
the same bucket type through the streaming calls: :meth:`ObjectBucket.put_stream` reads a file in
128 KiB chunks (nats-py's own put), :meth:`ObjectBucket.read_chunks` fetches the stored chunks one
JetStream request at a time (never more than one chunk in memory, every request under a timeout,
so a server that dies mid-transfer raises instead of hanging).

This is the transport: nats-py errors become the contract's transport and store errors here
(``ResourceNotFound`` for an absent key, ``ConnectionLost`` and ``RequestTimeout`` when the server
is gone or silent, ``StoreError`` otherwise); what they mean for blobs is decided above.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import BinaryIO

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

from sandpod_bus.capacity import insufficient_storage, out_of_storage
from sandpod_contract.errors import (
    ConnectionLost,
    RequestTimeout,
    ResourceNotFound,
    SandpodError,
    StoreError,
)

__all__ = ["ObjectBucket", "ObjectStat", "open_objects"]

_DIGEST_PREFIX = "SHA-256="


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectStat:
    """What the bucket says about one stored object.

    Attributes:
        name: the object's key.
        size: its size in bytes, as recorded when it was put.
        sha256: the SHA-256 nats recorded at put time (raw 32 bytes; empty if it recorded none).
    """

    name: str
    size: int
    sha256: bytes


def _transport_error(exc: Exception, what: str) -> SandpodError:
    """The contract's error for a nats-py failure while doing ``what``."""
    if isinstance(exc, nats.errors.TimeoutError):
        return RequestTimeout(f"{what}: JetStream did not answer in time")
    if isinstance(exc, nats.errors.ConnectionClosedError | nats.errors.NoRespondersError):
        return ConnectionLost(f"{what}: {type(exc).__name__}")
    return StoreError(f"{what}: {exc}")


def _sha256_of(digest: str | None) -> bytes:
    if not digest or not digest.upper().startswith(_DIGEST_PREFIX):
        return b""
    try:
        return base64.urlsafe_b64decode(digest[len(_DIGEST_PREFIX) :])
    except (binascii.Error, ValueError):
        return b""


class ObjectBucket:
    """One object-store bucket. Get it with :meth:`sandpod_bus.Bus.objects`."""

    def __init__(self, store: ObjectStore, name: str, js: JetStreamContext | None = None) -> None:
        self._store = store
        self._js = js
        self.name = name

    async def exists(self, key: str) -> bool:
        return await self.stat(key) is not None

    async def stat(self, key: str) -> ObjectStat | None:
        """The object's size and recorded digest, or None when ``key`` is absent."""
        try:
            info = await self._store.get_info(key)
        except nats.js.errors.ObjectNotFoundError:
            return None
        except nats.errors.Error as exc:
            raise _transport_error(exc, f"cannot look up {key} in {self.name}") from exc
        return ObjectStat(key, int(info.size or 0), _sha256_of(info.digest))

    async def put_file(self, key: str, path: Path) -> None:
        """Store the file at ``path`` as ``key`` (streamed in chunks, never read whole)."""
        with path.open("rb") as f:
            await self.put_stream(key, f)

    async def put_stream(self, key: str, reader: BinaryIO) -> None:
        """Store what ``reader`` yields until EOF as ``key`` (replacing any object there)."""
        try:
            await self._store.put(key, reader)  # type: ignore[arg-type]
        except nats.errors.Error as exc:
            raise _transport_error(exc, f"cannot store {key} in {self.name}") from exc

    async def get_file(self, key: str, path: Path) -> None:
        """Write object ``key`` to ``path``. Raises ResourceNotFound when it is absent."""
        try:
            with path.open("wb") as f:
                await self._store.get(key, writeinto=f)
        except nats.js.errors.ObjectNotFoundError as exc:
            raise ResourceNotFound(f"{key} is not in {self.name}", key=key) from exc
        except nats.errors.Error as exc:
            raise StoreError(f"cannot read {key} from {self.name}: {exc}") from exc

    async def read_chunks(self, key: str) -> AsyncGenerator[bytes, None]:
        """Yield the stored chunks of ``key`` in order, fetching one per JetStream request.

        Raises:
            ResourceNotFound: ``key`` is absent.
            ConnectionLost, RequestTimeout: the server went away or stopped answering.
            StoreError: the object was replaced mid-read (retry), or another JetStream failure.
        """
        if self._js is None:
            raise StoreError(f"bucket {self.name} was opened without a JetStream context")
        try:
            info = await self._store.get_info(key)
        except nats.js.errors.ObjectNotFoundError as exc:
            raise ResourceNotFound(f"{key} is not in {self.name}", key=key) from exc
        except nats.errors.Error as exc:
            raise _transport_error(exc, f"cannot look up {key} in {self.name}") from exc
        subject = f"$O.{self.name}.C.{info.nuid}"
        stream = f"OBJ_{self.name}"
        seq = 1
        for _ in range(int(info.chunks or 0)):
            try:
                msg = await self._js.get_msg(stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError as exc:
                # Replaced (its chunks purged) while we read: a retry reads the new copy.
                raise StoreError(f"{key} changed in {self.name} while being read") from exc
            except nats.errors.Error as exc:
                raise _transport_error(exc, f"cannot read {key} from {self.name}") from exc
            seq = int(msg.seq or seq) + 1
            yield msg.data or b""

    async def delete(self, key: str) -> bool:
        """Delete ``key`` (its chunks are purged). Returns False when it was already absent."""
        try:
            await self._store.delete(key)
        except nats.js.errors.ObjectNotFoundError:
            return False
        except nats.js.errors.ObjectDeletedError:
            return False
        except nats.errors.Error as exc:
            raise _transport_error(exc, f"cannot delete {key} from {self.name}") from exc
        return True

    async def list(self) -> list[ObjectStat]:
        """Every live object in the bucket."""
        try:
            infos = await self._store.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return []
        except nats.errors.Error as exc:
            raise _transport_error(exc, f"cannot list {self.name}") from exc
        return [
            ObjectStat(i.name, int(i.size or 0), _sha256_of(i.digest))
            for i in infos
            if not i.deleted
        ]


async def open_objects(nc: NatsClient, bucket: str) -> ObjectBucket:
    """The bucket ``bucket``, created if missing.

    Raises:
        InsufficientStorage: JetStream has no room left to create it.
        ConnectionLost, RequestTimeout, StoreError: the connection or JetStream failed.
    """
    js = nc.jetstream()
    try:
        try:
            store = await js.object_store(bucket)
        except nats.js.errors.BucketNotFoundError:
            store = await js.create_object_store(bucket)
    except nats.errors.Error as exc:
        if out_of_storage(exc):
            raise await insufficient_storage(
                nc, what=f"object store {bucket}", stream=f"OBJ_{bucket}", reserve=-1
            ) from exc
        raise _transport_error(exc, f"cannot open object store {bucket}") from exc
    return ObjectBucket(store, bucket, js)
