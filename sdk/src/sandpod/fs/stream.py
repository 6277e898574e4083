"""Streaming file transfer for ``sbx.fs``: a pipelined reader and a pipelined upload writer.

Reading pulls ``fs.read`` ranges at successive offsets with up to ``in_flight`` requests
outstanding (only one until the first reply tells the file's size, and one at a time past the
size the file had, since it may be growing). Chunks come back in order whatever order the replies
arrive in. Writing is an upload (``fs.write_open`` / ``fs.write_chunk`` / ``fs.write_commit``):
chunks are sent in offset order with up to ``in_flight`` unanswered, the SHA-256 of everything
sent is computed on the way and checked by execd at commit, and any failure aborts the upload so
the target is never left half written. Memory on either side: ``in_flight`` chunks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sandpod._iteration import items_then
from sandpod._loop import run
from sandpod._twins import iterate
from sandpod.fs.types import FileInfo
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

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = [
    "CHUNK",
    "IN_FLIGHT",
    "READ_LIMIT",
    "AsyncFileReader",
    "AsyncFileWriter",
    "FileReader",
    "FileWriter",
    "Progress",
    "lines_window",
]

CHUNK = 1024 * 1024  # local read size when streaming a local file or buffer up
REPLY_ROOM = 4096  # a read asks for max_payload minus this: one reply, fields included
READ_LIMIT = 64 * 1024 * 1024  # fs.read() refuses larger files unless max_size says otherwise
Progress = Callable[[int, int | None], object]  # (bytes done, total if known)
IN_FLIGHT = 4
IO_TIMEOUT = 60.0  # one chunk request; a slow disk, not a slow network, is what takes long


class AsyncFileReader:
    """The chunks of a file in the sandbox, in order: ``async with`` it and ``async for`` it.

    ``size`` and ``mtime`` are known after the first chunk. Without ``async with``, the
    iteration owns the reads: leaving an ``async for`` early (``break``, an exception, the
    iterator collected) cancels the reads still in flight; inside ``async with`` the block does.
    """

    def __init__(
        self,
        sbx: Channel,
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
        self._sbx = sbx
        self.path = path
        self._next = offset
        self._end = None if length is None else offset + length
        # Default: as much as one reply holds (fewer, bigger messages are faster over NATS).
        self._chunk = chunk_size or max(sbx.limits.max_payload - REPLY_ROOM, 4096)
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
        self._managed = False  # inside ``async with``: the block, not an iteration, closes it
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
            task = asyncio.ensure_future(self._sbx.call("fs", "read", req, FsChunk, IO_TIMEOUT))
            self._pending.append((self._next, n, task))
            self._next += n

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The chunks in order; a generator, so leaving the loop early runs its cleanup (at
        once on ``aclose``, else when the loop collects the abandoned generator)."""
        return items_then(self.__anext__, self._iteration_ended)

    async def _iteration_ended(self) -> None:
        if not self._managed:  # no block to close it later: an iteration left is the end
            await self.aclose()

    async def __anext__(self) -> bytes:
        while True:
            self._fill()
            if self._done or not self._pending:
                self._done = True
                raise StopAsyncIteration
            offset, asked, task = self._pending.popleft()
            try:
                chunk = await task
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

    async def __aenter__(self) -> Self:
        self._managed = True
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


async def lines_window(
    reader: AsyncFileReader, start: int, count: int | None, *, encoding: str, errors: str
) -> list[str]:
    """Lines ``start`` .. ``start + count - 1`` (1-based, endings stripped) of ``reader``'s file;
    only those are kept (a line longer than ``READ_LIMIT`` raises ``FsTooLarge``)."""
    out: list[str] = []
    if count == 0:
        return out
    line, tail = 1, bytearray()
    async for chunk in reader:
        if not tail and line + chunk.count(b"\n") < start:
            line += chunk.count(b"\n")  # the whole chunk is before the window
            continue
        pos = 0
        while (nl := chunk.find(b"\n", pos)) >= 0:
            if line >= start:
                tail += chunk[pos:nl]
                out.append(tail.rstrip(b"\r").decode(encoding, errors))
                tail.clear()
                if count is not None and len(out) >= count:
                    return out
            line, pos = line + 1, nl + 1
        if line >= start:
            tail += chunk[pos:]
            if len(tail) > READ_LIMIT:
                raise FsTooLarge(
                    f"{reader.path}: line {line} is longer than {READ_LIMIT} bytes",
                    path=reader.path,
                    limit=READ_LIMIT,
                )
    if tail:
        out.append(tail.rstrip(b"\r").decode(encoding, errors))
    return out


def _consume(task: asyncio.Task[object]) -> None:
    """Retrieve a dropped task's outcome, so a failure is not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


class AsyncFileWriter:
    """An upload to ``path``: :meth:`write` bytes, then :meth:`commit` (or :meth:`abort`).

    As an async context manager it commits on normal exit and aborts on an exception.
    """

    def __init__(
        self,
        sbx: Channel,
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
        self._sbx = sbx
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

    async def open(self) -> Self:
        """Start the upload (implicit on first write); checks the target now."""
        if self._id is None:
            up = await self._sbx.call("fs", "write_open", self._open, FsUpload, IO_TIMEOUT)
            self._id = up.upload_id
            limit = min(up.chunk_size, self._sbx.limits.max_payload - REPLY_ROOM)
            self._chunk = max(1, min(self._chunk or limit, limit))
        return self

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
        assert self._id is not None
        req = FsWriteChunk(upload_id=self._id, offset=self._offset, data=piece)
        self._sha.update(piece)
        self._offset += len(piece)
        self._pending.append(
            asyncio.ensure_future(
                self._sbx.call("fs", "write_chunk", req, FsUploadStatus, IO_TIMEOUT)
            )
        )
        while len(self._pending) >= self._in_flight:
            await self._pending.popleft()

    async def commit(self) -> FileInfo:
        """Send what is left, let execd verify size and SHA-256, move the file into place."""
        if self._finished:
            raise ValueError("upload already committed or aborted")
        await self.open()
        assert self._id is not None
        try:
            if self._buf:
                piece = bytes(self._buf)
                self._buf.clear()
                await self._send(piece)
            while self._pending:
                await self._pending.popleft()
            req = FsWriteCommit(upload_id=self._id, size=self._offset, sha256=self._sha.hexdigest())
            entry = await self._sbx.call("fs", "write_commit", req, FsEntry, IO_TIMEOUT)
        except BaseException:
            await self.abort()
            raise
        self._finished = True
        return FileInfo.from_wire(entry)

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
                await asyncio.shield(
                    self._sbx.call("fs", "write_abort", req, FsUploadStatus, IO_TIMEOUT)
                )

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._finished:
            return
        if et is None:
            await self.commit()
        else:
            await self.abort()


class FileReader:
    """Blocking twin of :class:`AsyncFileReader`: iterate for chunks; ``with`` closes it."""

    def __init__(self, inner: AsyncFileReader) -> None:
        self._inner = inner

    @property
    def path(self) -> str:
        return self._inner.path

    @property
    def size(self) -> int | None:
        return self._inner.size

    @property
    def mtime(self) -> float | None:
        return self._inner.mtime

    def __iter__(self) -> Iterator[bytes]:
        """The chunks in order. Outside ``with``, leaving the loop early (``break``, an
        exception, the iterator collected) cancels the reads still in flight."""
        return iterate(aiter(self._inner))

    def __next__(self) -> bytes:
        try:
            return run(self._inner.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        run(self._inner.aclose())

    def __enter__(self) -> Self:
        run(self._inner.__aenter__())
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class FileWriter:
    """Blocking twin of :class:`AsyncFileWriter`; ``with`` commits, or aborts on an exception."""

    def __init__(self, inner: AsyncFileWriter) -> None:
        self._inner = inner

    @property
    def path(self) -> str:
        return self._inner.path

    @property
    def written(self) -> int:
        return self._inner.written

    def open(self) -> Self:
        """Start the upload (implicit on first write); checks the target now."""
        run(self._inner.open())
        return self

    def write(self, data: bytes | bytearray | memoryview) -> None:
        run(self._inner.write(data))

    def commit(self) -> FileInfo:
        return run(self._inner.commit())

    def abort(self) -> None:
        run(self._inner.abort())

    def __enter__(self) -> Self:
        run(self._inner.open())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        run(self._inner.__aexit__(et, e, tb))
