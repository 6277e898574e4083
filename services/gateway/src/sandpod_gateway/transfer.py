"""File bytes between an HTTP body and a sandbox, streamed both ways with bounded memory.

Download: ``fs.read`` ranges of at most one NATS message each, with up to ``IN_FLIGHT`` ranges
requested ahead (the gateway holds at most that many chunks), yielded in order; a ``Range`` is a
start offset and a length. Upload: the request body is cut into ``chunk_size`` pieces (what one
``fs.write_chunk`` may carry) and each is written before the next is read, so a fast client is
slowed to the sandbox's pace by TCP instead of filling the gateway's memory; the commit checks
the size and the SHA-256 (the client's, if it sent ``X-Content-SHA256``, else the one computed
here), so a truncated body never replaces the file.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator

from sandpod_contract.errors import BadRequest, SandpodError
from sandpod_contract.messages.fs import (
    FsChunk,
    FsEntry,
    FsRead,
    FsUpload,
    FsUploadRef,
    FsUploadStatus,
    FsWriteChunk,
    FsWriteCommit,
    FsWriteOpen,
)
from sandpod_gateway.errors import RangeNotSatisfiable
from sandpod_gateway.upstream import Target

__all__ = ["download", "parse_range", "upload"]

IN_FLIGHT = 4
REPLY_ROOM = 4096
IO_TIMEOUT = 60.0
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, length)`` of a single-range ``Range`` header, None for the whole file.

    Raises:
        RangeNotSatisfiable: the range lies outside ``size`` (or is malformed).
    """
    if header is None:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        raise RangeNotSatisfiable(f"unsupported Range {header!r}: use bytes=start-end", size=size)
    if not m.group(1):  # suffix: the last N bytes
        n = min(int(m.group(2)), size)
        if n == 0:
            raise RangeNotSatisfiable("empty suffix range", size=size)
        return size - n, n
    start = int(m.group(1))
    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    if start >= size or end < start:
        raise RangeNotSatisfiable(f"range {header!r} outside a file of {size} bytes", size=size)
    return start, end - start + 1


async def download(sbx: Target, path: str, start: int, length: int) -> AsyncIterator[bytes]:
    """The bytes ``[start, start + length)`` of ``path``, in order."""
    chunk = max(sbx.upstream.bus.max_payload - REPLY_ROOM, 4096)
    end = start + length
    pending: collections.deque[asyncio.Task[FsChunk]] = collections.deque()
    nxt = start
    try:
        while pending or nxt < end:
            while len(pending) < IN_FLIGHT and nxt < end:
                n = min(chunk, end - nxt)
                req = FsRead(path=path, offset=nxt, length=n)
                pending.append(
                    asyncio.ensure_future(sbx.call("fs", "read", req, FsChunk, IO_TIMEOUT))
                )
                nxt += n
            got = await pending.popleft()
            if got.data:
                yield got.data
            if got.eof and len(got.data) < chunk:  # the file shrank: stop at its end
                return
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def upload(
    sbx: Target,
    path: str,
    body: AsyncIterator[bytes],
    *,
    mode: int | None,
    make_parents: bool,
    expected_sha256: str | None,
) -> tuple[FsEntry, int]:
    """Write the body to ``path`` atomically; (the new entry, bytes received)."""
    up = await sbx.call(
        "fs",
        "write_open",
        FsWriteOpen(path=path, mode=mode, make_parents=make_parents),
        FsUpload,
        IO_TIMEOUT,
    )
    limit = max(min(up.chunk_size, sbx.upstream.bus.max_payload - REPLY_ROOM), 1)
    digest = hashlib.sha256()
    buf = bytearray()
    sent = 0
    committed = False
    try:
        async for part in body:
            buf += part
            while len(buf) >= limit:
                piece = bytes(buf[:limit])
                del buf[:limit]
                digest.update(piece)
                sent = await _write(sbx, up.upload_id, sent, piece)
        if buf:
            digest.update(buf)
            sent = await _write(sbx, up.upload_id, sent, bytes(buf))
        want = expected_sha256.lower() if expected_sha256 else digest.hexdigest()
        if want != digest.hexdigest():
            raise BadRequest("X-Content-SHA256 does not match the body", field="x-content-sha256")
        commit = FsWriteCommit(upload_id=up.upload_id, size=sent, sha256=want)
        entry = await sbx.call("fs", "write_commit", commit, FsEntry, IO_TIMEOUT)
        committed = True
        return entry, sent
    finally:
        if not committed:
            with contextlib.suppress(SandpodError):
                await asyncio.shield(
                    sbx.call(
                        "fs",
                        "write_abort",
                        FsUploadRef(upload_id=up.upload_id),
                        FsUploadStatus,
                        5.0,
                    )
                )


async def _write(sbx: Target, upload_id: str, offset: int, data: bytes) -> int:
    req = FsWriteChunk(upload_id=upload_id, offset=offset, data=data)
    await sbx.call("fs", "write_chunk", req, FsUploadStatus, IO_TIMEOUT)
    return offset + len(data)
