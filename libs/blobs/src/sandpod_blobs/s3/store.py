"""The cluster mode's :class:`~sandpod_blobs.BlobStore`: any S3-compatible bucket.

Data flow. ``put_file``: hash the file (worker thread) -> HEAD ``<prefix><digest>``; the same
size there means the blob is stored and nothing is sent -> otherwise one signed PUT for a file up
to ``part_size``, else a multipart upload (create, one signed PUT per part, complete; abort on
any failure so no parts are left billed). Each PUT body is hashed from disk first (SigV4 signs
the payload's SHA-256, so the server checks every byte it receives), then streamed from disk in
1 MiB chunks: a part is never held in memory. ``get_file``: one streaming GET into a
:class:`~sandpod_blobs.verify.VerifiedFile`, which checks the announced Content-Length and the
sha256 against the digest. Memory stays at about one chunk either way (measured:
bench/blob_store.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from sandpod_blobs.digest import CHUNK, BlobRef, check_digest, hash_file, is_digest
from sandpod_blobs.s3.client import S3Client, xml_text, xml_values
from sandpod_blobs.s3.settings import S3Settings
from sandpod_blobs.verify import VerifiedFile
from sandpod_contract.errors import BlobError, BlobUnavailable

__all__ = ["S3BlobStore"]


def _hash_range(path: Path, offset: int, size: int) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        f.seek(offset)
        while size > 0 and (block := f.read(min(CHUNK, size))):
            h.update(block)
            size -= len(block)
    return h.hexdigest()


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(size)


async def _stream_range(path: Path, offset: int, size: int) -> AsyncIterator[bytes]:
    """``size`` bytes of ``path`` from ``offset``, one chunk per worker-thread read."""
    end = offset + size
    while offset < end:
        block = await asyncio.to_thread(_read_at, path, offset, min(CHUNK, end - offset))
        if not block:  # the file shrank under us: the server sees a short body and refuses
            return
        offset += len(block)
        yield block


def _complete_body(etags: list[str]) -> bytes:
    parts = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
        for n, etag in enumerate(etags, start=1)
    )
    return f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()


class S3BlobStore:
    """Blobs as objects ``<prefix><digest>`` in one S3 bucket. Close it (or use ``async with``)."""

    def __init__(
        self, settings: S3Settings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        """``transport``: an httpx transport (tests); default: a real connection pool."""
        self.settings = settings
        self._s3 = S3Client(settings, transport=transport)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._s3.aclose()

    def _key(self, digest: str) -> str:
        return f"{self.settings.prefix}{digest}"

    async def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (for setups that do not pre-create it)."""
        await self._s3.call("PUT", None, ok_statuses=frozenset({409}))

    async def put_file(self, path: Path) -> BlobRef:
        ref = await hash_file(path)
        if await self.stat(ref.digest) == ref.size:
            return ref
        if ref.size <= self.settings.part_size:
            await self._put_part(ref.digest, path, 0, ref.size, ())
        else:
            await self._multipart(path, ref)
        return ref

    async def _put_part(
        self,
        digest: str,
        path: Path,
        offset: int,
        size: int,
        params: tuple[tuple[str, str], ...],
    ) -> str:
        """PUT ``size`` bytes of ``path`` from ``offset`` (an object, or a part); its ETag."""
        sha = await asyncio.to_thread(_hash_range, path, offset, size)
        response = await self._s3.call(
            "PUT",
            self._key(digest),
            params,
            body=_stream_range(path, offset, size),
            length=size,
            payload_sha256=sha,
            digest=digest,
        )
        return str(response.headers.get("etag", ""))

    async def _multipart(self, path: Path, ref: BlobRef) -> None:
        key = self._key(ref.digest)
        created = await self._s3.call("POST", key, (("uploads", ""),), digest=ref.digest)
        upload_id = xml_text(created.content, "UploadId")
        if not upload_id:
            raise BlobError("S3 started no multipart upload (no UploadId)", digest=ref.digest)
        try:
            etags = []
            part = self.settings.part_size
            for number, offset in enumerate(range(0, ref.size, part), start=1):
                params = (("partNumber", str(number)), ("uploadId", upload_id))
                size = min(part, ref.size - offset)
                etags.append(await self._put_part(ref.digest, path, offset, size, params))
            done_body = _complete_body(etags)
            done = await self._s3.call(
                "POST",
                key,
                (("uploadId", upload_id),),
                body=done_body,
                payload_sha256=hashlib.sha256(done_body).hexdigest(),
                digest=ref.digest,
            )
            # S3 may answer 200 and put the failure in the body.
            if code := xml_text(done.content, "Code"):
                raise BlobUnavailable(
                    f"S3 could not complete the upload: {code}", digest=ref.digest
                )
        except BaseException:
            await self._abort(key, upload_id)
            raise

    async def _abort(self, key: str, upload_id: str) -> None:
        # Best effort: the failure being raised matters more; a store's lifecycle rule for
        # incomplete uploads cleans up what this cannot.
        try:
            await self._s3.call("DELETE", key, (("uploadId", upload_id),))
        except BlobError:
            return

    async def get_file(self, digest: str, dest: Path) -> int:
        check_digest(digest)
        async with self._s3.stream(self._key(digest), digest=digest) as response:
            length = response.headers.get("content-length")
            announced = int(length) if length and length.isdigit() else None
            chunks = self._s3.chunks(response, CHUNK, digest=digest)
            with VerifiedFile(dest, digest, announced) as out:
                async with aclosing(chunks):  # closed now, not by GC, when a write refuses
                    async for chunk in chunks:
                        out.write(chunk)
                return out.commit()

    async def stat(self, digest: str) -> int | None:
        check_digest(digest)
        response = await self._s3.call(
            "HEAD", self._key(digest), digest=digest, ok_statuses=frozenset({404})
        )
        if response.status_code == 404:
            return None
        return int(response.headers.get("content-length", "0"))

    async def delete(self, digest: str) -> None:
        check_digest(digest)
        await self._s3.call(
            "DELETE", self._key(digest), digest=digest, ok_statuses=frozenset({404})
        )

    async def list(self) -> list[BlobRef]:
        prefix = self.settings.prefix
        found: list[BlobRef] = []
        token: str | None = None
        while True:
            params = [("list-type", "2"), ("prefix", prefix)]
            if token:
                params.append(("continuation-token", token))
            body = (await self._s3.call("GET", None, params)).content
            keys = xml_values(body, "Contents/Key")
            sizes = xml_values(body, "Contents/Size")
            for key, size in zip(keys, sizes, strict=True):
                name = key.removeprefix(prefix)
                if key.startswith(prefix) and is_digest(name) and size.isdigit():
                    found.append(BlobRef(name, int(size)))
            token = xml_text(body, "NextContinuationToken")
            if xml_text(body, "IsTruncated") != "true" or not token:
                return found
