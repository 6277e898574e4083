"""Chunked file transfer's client side: a pipelined reader and a pipelined upload writer.

Reading pulls ``fs.read`` ranges at successive offsets with up to ``in_flight`` requests
outstanding (only one until the first reply tells the file's size, unless the caller knows it,
and one at a time past the size the file had, since it may be growing). Chunks come back in
order whatever order the replies arrive in. Writing is an upload (``fs.write_open`` /
``fs.write_chunk`` / ``fs.write_commit``): chunks are sent in offset order with up to
``in_flight`` unanswered, the SHA-256 of everything sent is computed on the way and checked by
execd at commit, and any failure aborts the upload so the target is never left half written.
Memory on either side: ``in_flight`` chunks. Every wait on execd is watched with ``sys.ping``
probes (:func:`sandpod_client.liveness.ping_probe`), so a transfer whose execd died ends with
``SandboxUnavailable`` within seconds instead of waiting out ``IO_TIMEOUT`` per chunk.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable
from typing import Self, TypeVar

from sandpod_client.channel import Link
from sandpod_client.liveness import ping_probe, watch
from sandpod_contract.codec import Message
from sandpod_contract.errors import FsTooLarge, SandpodError
from sandpod_contract.messages.fs import (
    FsChunk,
    FsEntry,
    FsOwner,
    FsRead,
    FsUpload,
    FsUploadRef,
    FsUploadStatus,
    FsWriteChunk,
    FsWriteCommit,
    FsWriteOpen,
)

__all__ = ["IN_FLIGHT", "IO_TIMEOUT", "REPLY_ROOM", "FileReader", "FileUpload", "read_range"]

T = TypeVar("T")
R = TypeVar("R", bound=Message)
REPLY_ROOM = 4096  # a read asks for max_payload minus this: one reply, fields included
IN_FLIGHT = 4
IO_TIMEOUT = 60.0  # one chunk request; a slow disk, not a slow network, is what takes long


async def _watched(ch: Link, work: Awaitable[T], what: str) -> T:
    return await watch(work, ping_probe(ch), what=what, exit_means_lost=False)


def _consume(task: asyncio.Task[object]) -> None:
    """Retrieve a dropped task's outcome, so a failure is not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


class FileReader:
    """The chunks of a file in the sandbox, in order: ``async for`` them, then :meth:`aclose`.

    ``size`` and ``mtime`` are known after the first chunk.

    Raises (while iterating):
        FsTooLarge: the file grew past ``max_size`` while being read.
        SandboxUnavailable: execd died during the read.
        FsError: what execd answered (not found, permission denied...).
    """

    def __init__(
        self,
        ch: Link,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        chunk_size: int | None = None,
        in_flight: int = IN_FLIGHT,
        max_size: int | None = None,
        size_hint: int | None = None,
    ) -> None:
        if offset < 0 or (length is not None and length < 0) or in_flight < 1:
            raise ValueError("offset and length must be >= 0, in_flight >= 1")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self._ch = ch
        self.path = path
        self._next = offset
        self._end = None if length is None else offset + length
        # Default: as much as one reply holds (fewer, bigger messages are faster over NATS).
        self._chunk = chunk_size or max(ch.limits.max_payload - REPLY_ROOM, 4096)
        self._in_flight = in_flight
        self._max_size = max_size
        # Bytes known to exist, so safe to read ahead up to (from a stat, or the first reply).
        self._horizon: int | None = size_hint or None
        self._pending: collections.deque[tuple[int, int, asyncio.Task[FsChunk]]] = (
            collections.deque()
        )
        self._first = True
        self._done = False
        self._read = 0
        self.size: int | None = None
        self.mtime: float | None = None

    def _fill(self) -> None:
        while len(self._pending) < self._in_flight and not self._done:
            if self._end is not None and self._next >= self._end:
                return
            if self._pending and (self._horizon is None or self._next >= self._horizon):
                return  # beyond what is known to exist: one request at a time
            n = self._chunk if self._end is None else min(self._chunk, self._end - self._next)
            req = FsRead(
                path=self.path,
                offset=self._next,
                length=n,
                max_size=self._max_size if self._first else None,
            )
            self._first = False
            task = asyncio.ensure_future(self._ch.call("fs", "read", req, FsChunk, IO_TIMEOUT))
            self._pending.append((self._next, n, task))
            self._next += n

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while True:
            self._fill()
            if self._done or not self._pending:
                self._done = True
                raise StopAsyncIteration
            offset, asked, task = self._pending.popleft()
            try:
                chunk = await _watched(self._ch, task, f"a read of {self.path}")
            except BaseException:
                await self.aclose()
                raise
            data = self._take(offset, asked, chunk)
            if data:
                return data

    def _take(self, offset: int, asked: int, chunk: FsChunk) -> bytes:
        self.size, self.mtime = chunk.size, chunk.mtime
        if self._horizon is None and chunk.size > 0:
            self._horizon = chunk.size
        data = chunk.data
        end = offset + len(data)
        self._read += len(data)
        if self._max_size is not None and self._read > self._max_size:
            self._stop()
            raise FsTooLarge(
                f"{self.path} grew past {self._max_size} bytes while being read; stream it",
                path=self.path,
                limit=self._max_size,
            )
        if chunk.eof or (self._end is not None and end >= self._end):
            self._stop()
        elif len(data) < asked:
            # execd sends less than asked when a reply cannot hold more: re-plan from here.
            self._stop(keep_going=True)
            self._next = end
            self._chunk = max(len(data), 1)
            if not data:
                self._done = True  # no progress and no eof: do not spin
        return data

    def _stop(self, keep_going: bool = False) -> None:
        for _, _, task in self._pending:
            task.cancel()
            task.add_done_callback(_consume)
        self._pending.clear()
        self._done = not keep_going

    async def aclose(self) -> None:
        """Cancel outstanding reads (idempotent)."""
        tasks = [t for _, _, t in self._pending]
        self._stop()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class FileUpload:
    """An upload to ``path``: :meth:`write` bytes, then :meth:`finish` (or :meth:`abort`)."""

    def __init__(
        self,
        ch: Link,
        path: str,
        *,
        mode: int | None = None,
        owner: FsOwner | None = None,
        make_parents: bool = True,
        exclusive: bool = False,
        chunk_size: int | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self._ch = ch
        self.path = path
        self._open = FsWriteOpen(
            path=path, mode=mode, owner=owner, make_parents=make_parents, exclusive=exclusive
        )
        self._chunk = chunk_size or 0  # 0: the largest execd accepts (known at open)
        self._in_flight = max(in_flight, 1)
        self._id: str | None = None
        self._buf = bytearray()
        self._offset = 0
        self._sha = hashlib.sha256()
        self._pending: collections.deque[asyncio.Task[FsUploadStatus]] = collections.deque()
        self._finished = False

    @property
    def written(self) -> int:
        """Bytes accepted so far (sent or buffered)."""
        return self._offset + len(self._buf)

    @property
    def sha256(self) -> str:
        """The hex SHA-256 of the bytes sent so far (all of them once :meth:`flush` returned)."""
        return self._sha.hexdigest()

    async def open(self) -> Self:
        """Start the upload (implicit on first write); checks the target now."""
        if self._id is None:
            up = await self._call("write_open", self._open, FsUpload)
            self._id = up.upload_id
            limit = min(up.chunk_size, self._ch.limits.max_payload - REPLY_ROOM)
            self._chunk = max(1, min(self._chunk or limit, limit))
        return self

    async def _call(self, verb: str, msg: Message, reply: type[R]) -> R:
        work = self._ch.call("fs", verb, msg, reply, IO_TIMEOUT)
        return await _watched(self._ch, work, f"an upload to {self.path}")

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; full chunks are sent as they form (waits when ``in_flight`` are out)."""
        if self._finished:
            raise ValueError("upload already committed or aborted")
        await self.open()
        view = memoryview(data).cast("B")
        try:
            if self._buf:  # top up the partial chunk first
                room = self._chunk - len(self._buf)
                self._buf += view[:room]
                view = view[room:]
                if len(self._buf) < self._chunk:
                    return
                piece = bytes(self._buf)
                self._buf.clear()
                await self._send(piece)
            while len(view) >= self._chunk:  # whole chunks straight from the caller's buffer
                await self._send(bytes(view[: self._chunk]))
                view = view[self._chunk :]
            self._buf += view
        except BaseException:
            await self.abort()
            raise

    async def _send(self, piece: bytes) -> None:
        req = FsWriteChunk(upload_id=self._id or "", offset=self._offset, data=piece)
        self._sha.update(piece)
        self._offset += len(piece)
        self._pending.append(
            asyncio.ensure_future(
                self._ch.call("fs", "write_chunk", req, FsUploadStatus, IO_TIMEOUT)
            )
        )
        while len(self._pending) >= self._in_flight:
            await _watched(self._ch, self._pending.popleft(), f"an upload to {self.path}")

    async def flush(self) -> None:
        """Send what is buffered and wait until execd has every chunk (aborts on failure)."""
        await self.open()
        try:
            if self._buf:
                piece = bytes(self._buf)
                self._buf.clear()
                await self._send(piece)
            while self._pending:
                await _watched(self._ch, self._pending.popleft(), f"an upload to {self.path}")
        except BaseException:
            await self.abort()
            raise

    async def finish(self) -> FsEntry:
        """Send what is left, let execd verify size and SHA-256, move the file into place.

        Raises:
            ValueError: the upload was already committed or aborted.
            FsError, SandboxUnavailable: execd refused the commit or died (upload aborted).
        """
        if self._finished:
            raise ValueError("upload already committed or aborted")
        await self.flush()
        try:
            req = FsWriteCommit(upload_id=self._id or "", size=self._offset, sha256=self.sha256)
            entry = await self._call("write_commit", req, FsEntry)
        except BaseException:
            await self.abort()
            raise
        self._finished = True
        return entry

    async def finish_unless_done(self) -> FsEntry | None:
        """:meth:`finish` unless committed or aborted already (a ``with`` block's normal end)."""
        return None if self._finished else await self.finish()

    async def abort_unfinished(self) -> None:
        """:meth:`abort` unless committed: the ``finally`` of an upload that may have failed."""
        if not self._finished:
            await self.abort()

    async def abort(self) -> None:
        """Drop the upload; the target is left as it was (idempotent, never raises)."""
        self._finished = True
        tasks = list(self._pending)
        self._pending.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._id is not None:
            req = FsUploadRef(upload_id=self._id)
            with contextlib.suppress(SandpodError):
                await asyncio.shield(self._ch.call("fs", "write_abort", req, FsUploadStatus, 5.0))


async def read_range(
    ch: Link, path: str, start: int, length: int, *, size_hint: int | None = None
) -> AsyncIterator[bytes]:
    """The bytes ``[start, start + length)`` of ``path``, in order (reads closed on exit)."""
    reader = FileReader(ch, path, offset=start, length=length, size_hint=size_hint)
    try:
        async for chunk in reader:
            yield chunk
    finally:
        await reader.aclose()
