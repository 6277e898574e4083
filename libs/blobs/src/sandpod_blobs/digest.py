"""Blob names: ``sha256:<64 lowercase hex>`` digests, and hashing a file to get one.

Every blob store is keyed by the digest of the bytes it holds, so a name is also the proof of the
content: readers recompute it (:mod:`sandpod_blobs.verify`) and refuse a mismatch. A digest string
comes from callers (and from listings of a store other programs can write), so it is checked here
once, before it ever becomes an object key or a path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from pathlib import Path

from sandpod_contract.errors import BlobInvalidDigest

__all__ = ["CHUNK", "BlobRef", "check_digest", "hash_file", "is_digest"]

CHUNK = 1024 * 1024  # bytes read or written at a time: memory stays bounded by this
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True, slots=True)
class BlobRef:
    """A stored blob: its digest (``sha256:<hex>``) and its size in bytes."""

    digest: str
    size: int


def is_digest(value: str) -> bool:
    """True when ``value`` is exactly ``sha256:`` and 64 lowercase hex digits."""
    return _DIGEST.fullmatch(value) is not None


def check_digest(value: object) -> str:
    """Return ``value`` when it is a blob digest.

    Raises:
        BlobInvalidDigest: anything else (wrong algorithm, case, length, a path, not a str).
    """
    if isinstance(value, str) and is_digest(value):
        return value
    shown = value[:100] if isinstance(value, str) else type(value).__name__
    raise BlobInvalidDigest(digest=shown)


def _hash_file_sync(path: Path) -> BlobRef:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
            size += len(block)
    return BlobRef(f"sha256:{h.hexdigest()}", size)


async def hash_file(path: Path) -> BlobRef:
    """The digest and size of the file at ``path``, read in chunks in a worker thread."""
    return await asyncio.to_thread(_hash_file_sync, path)
