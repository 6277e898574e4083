"""The embedded mode's :class:`~sandpod_blobs.BlobStore`: a JetStream object-store bucket.

Data flow: ``put_file`` hashes the file (worker thread), asks the bucket whether that digest is
there with that size, and if not streams the file into the bucket under the digest
(:meth:`sandpod_bus.ObjectBucket.put_stream`, 128 KiB chunks). ``get_file`` reads the chunks one
JetStream request at a time (:meth:`sandpod_bus.ObjectBucket.read_chunks`) into a
:class:`~sandpod_blobs.verify.VerifiedFile`, which checks size and sha256 against the digest itself
(not against the digest nats recorded: whoever can write the bucket can record any digest).

The bus raises transport errors; here they become blob errors: an absent key ``BlobNotFound``, a
lost or silent server ``BlobUnavailable`` (retryable), anything else ``BlobError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path

from sandpod_blobs.digest import BlobRef, check_digest, hash_file, is_digest
from sandpod_blobs.verify import VerifiedFile
from sandpod_bus import Bus, ObjectBucket
from sandpod_contract.errors import (
    BlobError,
    BlobNotFound,
    BlobUnavailable,
    ConnectionLost,
    RequestTimeout,
    ResourceNotFound,
    StoreError,
)

__all__ = ["DEFAULT_BUCKET", "JetStreamBlobStore"]

DEFAULT_BUCKET = "sandpod-blobs"


@contextmanager
def _mapped(digest: str | None, what: str) -> Iterator[None]:
    """Turn the bus's transport and store errors into blob errors."""
    try:
        yield
    except ResourceNotFound as exc:
        raise BlobNotFound(digest=digest) from exc
    except (ConnectionLost, RequestTimeout) as exc:
        raise BlobUnavailable(f"{what}: {exc.message}", digest=digest) from exc
    except StoreError as exc:
        cls = BlobUnavailable if exc.retryable else BlobError
        raise cls(f"{what}: {exc.message}", digest=digest) from exc


class JetStreamBlobStore:
    """Blobs in one JetStream object-store bucket, keyed by digest."""

    def __init__(self, bucket: ObjectBucket) -> None:
        self._bucket = bucket

    @classmethod
    async def open(cls, bus: Bus, bucket: str = DEFAULT_BUCKET) -> JetStreamBlobStore:
        """The store on ``bus``'s bucket ``bucket`` (created if missing).

        Raises:
            BlobUnavailable: JetStream could not be reached.
        """
        with _mapped(None, f"cannot open bucket {bucket}"):
            return cls(await bus.objects(bucket))

    async def put_file(self, path: Path) -> BlobRef:
        ref = await hash_file(path)
        with _mapped(ref.digest, f"cannot store {ref.digest}"):
            existing = await self._bucket.stat(ref.digest)
            if existing is None or existing.size != ref.size:
                await self._bucket.put_file(ref.digest, path)
        return ref

    async def get_file(self, digest: str, dest: Path) -> int:
        check_digest(digest)
        with _mapped(digest, f"cannot read {digest}"):
            stat = await self._bucket.stat(digest)
            if stat is None:
                raise BlobNotFound(digest=digest)
            chunks = self._bucket.read_chunks(digest)
            with VerifiedFile(dest, digest, stat.size) as out:
                async with aclosing(chunks):  # closed now, not by GC, when a write refuses
                    async for chunk in chunks:
                        out.write(chunk)
                return out.commit()

    async def stat(self, digest: str) -> int | None:
        check_digest(digest)
        with _mapped(digest, f"cannot look up {digest}"):
            found = await self._bucket.stat(digest)
        return None if found is None else found.size

    async def delete(self, digest: str) -> None:
        check_digest(digest)
        with _mapped(digest, f"cannot delete {digest}"):
            await self._bucket.delete(digest)

    async def list(self) -> list[BlobRef]:
        with _mapped(None, f"cannot list {self._bucket.name}"):
            stats = await self._bucket.list()
        return [BlobRef(s.name, s.size) for s in stats if is_digest(s.name)]
