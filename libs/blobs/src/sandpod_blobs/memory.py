"""An in-memory :class:`~sandpod_blobs.BlobStore` for tests of code that uses the seam.

It keeps each blob as bytes (so it is for small blobs only), but goes through the same digest
checks and the same :class:`~sandpod_blobs.verify.VerifiedFile` as the real stores, and passes the
same contract suite. :meth:`MemoryBlobStore.tamper` replaces a blob's bytes behind the seam's
back, as a broken or hostile store would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandpod_blobs.digest import BlobRef, check_digest, hash_file
from sandpod_blobs.verify import VerifiedFile
from sandpod_contract.errors import BlobNotFound

__all__ = ["MemoryBlobStore"]


class MemoryBlobStore:
    """Blobs in a dict. ``puts`` counts the uploads that actually stored bytes."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self.puts = 0

    async def put_file(self, path: Path) -> BlobRef:
        ref = await hash_file(path)
        existing = self._blobs.get(ref.digest)
        if existing is None or len(existing) != ref.size:
            self._blobs[ref.digest] = await asyncio.to_thread(path.read_bytes)
            self.puts += 1
        return ref

    async def get_file(self, digest: str, dest: Path) -> int:
        data = self._blobs.get(check_digest(digest))
        if data is None:
            raise BlobNotFound(digest=digest)
        with VerifiedFile(dest, digest, len(data)) as out:
            out.write(data)
            return out.commit()

    async def stat(self, digest: str) -> int | None:
        data = self._blobs.get(check_digest(digest))
        return None if data is None else len(data)

    async def delete(self, digest: str) -> None:
        self._blobs.pop(check_digest(digest), None)

    async def list(self) -> list[BlobRef]:
        return [BlobRef(d, len(b)) for d, b in self._blobs.items()]

    def tamper(self, digest: str, data: bytes) -> None:
        """Replace the bytes stored under ``digest`` (tests: a corrupted store)."""
        self._blobs[check_digest(digest)] = data
