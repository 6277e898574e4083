"""File bytes between an HTTP body and a sandbox, streamed both ways with bounded memory.

The transfer itself is the protocol client's (:mod:`sandpod_client.transfer`, the SDK's too,
each wait on execd watched, so a dead execd ends a transfer within seconds). Download:
``fs.read`` ranges of at most one NATS message each, with up to ``IN_FLIGHT`` ranges requested
ahead (the gateway holds at most that many chunks), yielded in order; a ``Range`` is a start
offset and a length. Upload: the request body is cut into ``chunk_size`` pieces (what one
``fs.write_chunk`` may carry), with at most ``IN_FLIGHT`` unanswered, so a fast client is
slowed to the sandbox's pace by TCP instead of filling the gateway's memory; the commit checks
the size and the SHA-256 (the client's ``X-Content-SHA256`` must match the one computed here),
so a truncated body never replaces the file.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from sandpod_client.transfer import FileUpload, read_range
from sandpod_contract.errors import BadRequest
from sandpod_contract.messages.fs import FsEntry
from sandpod_gateway.errors import RangeNotSatisfiable
from sandpod_gateway.upstream import Target

__all__ = ["download", "parse_range", "upload"]

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
    """The bytes ``[start, start + length)`` of ``path``, in order (``IN_FLIGHT`` reads ahead).

    Raises (while iterating): SandboxUnavailable when execd dies mid-download, FsError.
    """
    async for chunk in read_range(sbx.channel, path, start, length, size_hint=start + length):
        yield chunk


async def upload(
    sbx: Target,
    path: str,
    body: AsyncIterator[bytes],
    *,
    mode: int | None,
    make_parents: bool,
    expected_sha256: str | None,
) -> tuple[FsEntry, int]:
    """Write the body to ``path`` atomically; (the new entry, bytes received).

    Raises:
        BadRequest: ``expected_sha256`` is not the body's (the upload is aborted).
        FsError, SandboxUnavailable: execd refused or died (the upload is aborted).
    """
    up = FileUpload(sbx.channel, path, mode=mode, make_parents=make_parents)
    await up.open()
    try:
        async for part in body:
            await up.write(part)
        await up.flush()
        if expected_sha256 is not None and expected_sha256.lower() != up.sha256:
            raise BadRequest("X-Content-SHA256 does not match the body", field="x-content-sha256")
        entry = await up.finish()
    finally:
        await up.abort_unfinished()
    return entry, up.written
