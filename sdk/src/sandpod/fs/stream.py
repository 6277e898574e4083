"""Streaming file transfer for ``sbx.fs``: the protocol client's pipelined reader and upload
writer (:mod:`sandpod_client.transfer`, shared with the gateway) in the SDK's shape.

The SDK adds what only its users see: construction from the family's
:class:`~sandpod.channel.Channel`, ``async with`` / ``async for`` ownership of the reads
(leaving a bare loop early cancels them), a commit that returns :class:`FileInfo`, the line
window of ``read_lines``, and the blocking twins. Memory on either side: ``in_flight`` chunks.
"""

from __future__ import annotations

import collections.abc
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sandpod._iteration import items_then
from sandpod._loop import run
from sandpod._twins import iterate
from sandpod.fs.types import FileInfo
from sandpod_client.transfer import IN_FLIGHT, FileUpload
from sandpod_client.transfer import FileReader as WireReader
from sandpod_contract.errors import FsTooLarge
from sandpod_contract.messages.fs import FsOwner

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
READ_LIMIT = 64 * 1024 * 1024  # fs.read() refuses larger files unless max_size says otherwise
Progress = Callable[[int, int | None], object]  # (bytes done, total if known)


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
        self._reader = WireReader(
            sbx,
            path,
            offset=offset,
            length=length,
            chunk_size=chunk_size,
            in_flight=in_flight,
            max_size=max_size,
            size_hint=size_hint,
        )
        self.path = path
        self._managed = False  # inside ``async with``: the block, not an iteration, closes it

    @property
    def _pending(self) -> collections.abc.Sized:
        """The reads in flight (what a test checks is empty once an iteration was left)."""
        return self._reader._pending

    @property
    def size(self) -> int | None:
        """The file's size, known after the first chunk."""
        return self._reader.size

    @property
    def mtime(self) -> float | None:
        """The file's modification time, known after the first chunk."""
        return self._reader.mtime

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The chunks in order; a generator, so leaving the loop early runs its cleanup (at
        once on ``aclose``, else when the loop collects the abandoned generator)."""
        return items_then(self.__anext__, self._iteration_ended)

    async def __anext__(self) -> bytes:
        return await self._reader.__anext__()

    async def _iteration_ended(self) -> None:
        if not self._managed:  # no block to close it later: an iteration left is the end
            await self.aclose()

    async def aclose(self) -> None:
        """Cancel outstanding reads (idempotent)."""
        await self._reader.aclose()

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
        self._upload = FileUpload(
            sbx,
            path,
            mode=mode,
            owner=owner,
            make_parents=make_parents,
            exclusive=exclusive,
            chunk_size=chunk_size,
            in_flight=in_flight,
        )
        self.path = path

    @property
    def written(self) -> int:
        """Bytes accepted so far (sent or buffered)."""
        return self._upload.written

    async def open(self) -> Self:
        """Start the upload (implicit on first write); checks the target now."""
        await self._upload.open()
        return self

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; full chunks are sent as they form (waits when ``in_flight`` are out)."""
        await self._upload.write(data)

    async def commit(self) -> FileInfo:
        """Send what is left, let execd verify size and SHA-256, move the file into place."""
        return FileInfo.from_wire(await self._upload.finish())

    async def abort(self) -> None:
        """Drop the upload; the target is left as it was (idempotent, never raises)."""
        await self._upload.abort()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            await self._upload.finish_unless_done()
        else:
            await self._upload.abort_unfinished()


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
