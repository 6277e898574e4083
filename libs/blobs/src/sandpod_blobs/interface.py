"""The blob store seam: content-addressed blobs (snapshot layers) behind one Protocol.

Callers (the snapshot code) hold a :class:`BlobStore` and never know which one it is: the
JetStream object store in embedded mode (:mod:`sandpod_blobs.jetstream`), any S3-compatible
store in a cluster (:mod:`sandpod_blobs.s3`), or the in-memory fake in tests
(:mod:`sandpod_blobs.memory`).
Every implementation passes the same contract suite (tests/integration/test_blob_contract.py).

Semantics every implementation keeps:
- keys are digests ``sha256:<64 hex>``; anything else is ``BlobInvalidDigest`` before any I/O;
- ``put_file`` hashes while streaming, then uploads unless a blob of that digest and size is
  already there (idempotent, no re-upload);
- ``get_file`` writes through :class:`sandpod_blobs.verify.VerifiedFile`: ``dest`` ends up with
  the verified bytes or is left untouched (``BlobCorrupt`` when the store's bytes do not match);
- memory stays bounded by a chunk (or one multipart part), whatever the blob's size;
- errors are the contract's blob family: ``BlobNotFound``, ``BlobCorrupt``, ``BlobInvalidDigest``,
  ``BlobAuthFailed``, ``BlobUnavailable`` (retryable), ``BlobError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from sandpod_blobs.digest import BlobRef

__all__ = ["BlobStore"]


@runtime_checkable
class BlobStore(Protocol):
    """A content-addressed blob store."""

    async def put_file(self, path: Path) -> BlobRef:
        """Store the file at ``path`` under its sha256; return its digest and size.

        Idempotent: when the store already holds that digest with that size nothing is sent.
        The stored bytes are not re-read to decide that: a blob a ``get_file`` found corrupt is
        repaired by ``delete`` then ``put_file``.

        Raises:
            BlobUnavailable: the store could not be reached or failed mid-upload (retry).
            BlobAuthFailed: the store refused the credentials.
            BlobError: the store refused the upload for another reason.
        """
        ...

    async def get_file(self, digest: str, dest: Path) -> int:
        """Write blob ``digest`` to ``dest`` (atomically, verified); return its size.

        Raises:
            BlobInvalidDigest: ``digest`` is not ``sha256:<64 hex>``.
            BlobNotFound: the store has no such blob.
            BlobCorrupt: the stored bytes do not match the digest; ``dest`` is untouched.
            BlobUnavailable: the store went away mid-transfer; ``dest`` is untouched (retry).
            BlobAuthFailed, BlobError: as for put_file.
        """
        ...

    async def stat(self, digest: str) -> int | None:
        """The stored size of blob ``digest``, or None when absent (BlobInvalidDigest, ...)."""
        ...

    async def delete(self, digest: str) -> None:
        """Delete blob ``digest``; deleting an absent blob is not an error (for GC retries)."""
        ...

    async def list(self) -> list[BlobRef]:
        """Every blob in the store, in no particular order (for garbage collection).

        Objects under the store's keys that are not digests (written by something else) are
        left out.
        """
        ...
