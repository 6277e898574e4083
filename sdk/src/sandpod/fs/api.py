"""The async client of files in the sandbox (``sbx.fs``); the blocking twin is ``sync``.

Every method is one or a few ``fs.*`` requests to the sandbox's execd (see ``schemas/docs/fs.md``).
Paths are sandbox paths: ``/workspace/...`` or relative to the workspace. Whole-file calls
(:meth:`AsyncFiles.read`, :meth:`AsyncFiles.write`) move any size in pipelined chunks; ``read``
refuses files over ``READ_LIMIT`` unless told otherwise, pointing at :meth:`AsyncFiles.read_stream`.
Errors are the contract's ``fs.*`` exceptions (``FsNotFound``, ``FsIsADirectory``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, TypeVar

from sandpod.fs.stream import (
    CHUNK,
    IN_FLIGHT,
    READ_LIMIT,
    AsyncFileReader,
    AsyncFileWriter,
    Progress,
    lines_window,
)
from sandpod.fs.types import (
    FileInfo,
    FileList,
    FileType,
    ReplaceResult,
    SearchResult,
)
from sandpod_client.archive import archive, extract
from sandpod_contract.codec import Message
from sandpod_contract.errors import FsTooLarge
from sandpod_contract.messages.fs import (
    FsChmod,
    FsChown,
    FsCopy,
    FsEntry,
    FsExistence,
    FsGlob,
    FsList,
    FsListing,
    FsMkdir,
    FsMove,
    FsOwner,
    FsPath,
    FsRemove,
    FsRemoved,
    FsReplace,
    FsReplaceResult,
    FsSearch,
    FsSearchResult,
    FsWrite,
)

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["AsyncFiles"]

R = TypeVar("R", bound=Message)
Stream = bytes | bytearray | memoryview | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes]
Data = str | Stream

SMALL_WRITE = 512 * 1024  # up to this, write() is one fs.write request
OP_TIMEOUT = 60.0
WALK_TIMEOUT = 120.0  # search/replace/glob walk trees (execd bounds them at 20-60 s)


def owner_of(owner: str | int | None, group: str | int | None) -> FsOwner | None:
    """An :class:`FsOwner` from names (str) or ids (int); None when both are None."""
    if owner is None and group is None:
        return None
    return FsOwner(
        uid=owner if isinstance(owner, int) else None,
        user=owner if isinstance(owner, str) else None,
        gid=group if isinstance(group, int) else None,
        group=group if isinstance(group, str) else None,
    )


class AsyncFiles:
    """Files in one sandbox (``sbx.fs``)."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    async def _call(self, verb: str, msg: Message, reply: type[R], timeout: float) -> R:
        return await self._channel.call("fs", verb, msg, reply, timeout)

    async def _entry(self, verb: str, msg: Message, timeout: float = OP_TIMEOUT) -> FileInfo:
        return FileInfo.from_wire(await self._call(verb, msg, FsEntry, timeout))

    # -- read ----------------------------------------------------------------------------------

    async def read(self, path: str, *, max_size: int | None = READ_LIMIT) -> bytes:
        """The whole content of a file, as bytes.

        Args:
            max_size: refuse files larger than this (default ``READ_LIMIT``, 64 MiB); ``None``
                reads any size into memory. For big files prefer :meth:`read_stream`.

        Raises:
            FsTooLarge: the file is larger than ``max_size``.
            FsNotFound, FsIsADirectory, FsPermissionDenied, FsInvalidPath: see ``fs.*`` codes.
        """
        parts: list[bytes] = []
        try:
            async with AsyncFileReader(self._channel, path, max_size=max_size) as reader:
                async for chunk in reader:
                    parts.append(chunk)
        except FsTooLarge as exc:
            raise FsTooLarge(
                f"{exc.message}; use fs.read_stream() or fs.download(), or read(max_size=None)",
                **exc.details,
            ) from exc
        return b"".join(parts)

    async def read_text(
        self,
        path: str,
        *,
        encoding: str = "utf-8",
        errors: str = "strict",
        max_size: int | None = READ_LIMIT,
    ) -> str:
        """The whole content of a file decoded as text (see :meth:`read`)."""
        return (await self.read(path, max_size=max_size)).decode(encoding, errors)

    async def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end of the file)."""
        parts: list[bytes] = []
        async with AsyncFileReader(self._channel, path, offset=offset, length=length) as reader:
            async for chunk in reader:
                parts.append(chunk)
        return b"".join(parts)

    async def read_lines(
        self,
        path: str,
        start: int = 1,
        count: int | None = None,
        *,
        encoding: str = "utf-8",
        errors: str = "replace",
    ) -> list[str]:
        """Lines ``start`` to ``start + count - 1`` (1-based, without line endings) of a text
        file of any size: the file is streamed and only those lines are kept, so a window into a
        huge log costs little memory. ``count=None`` reads to the end.

        Raises:
            FsTooLarge: one requested line is longer than ``READ_LIMIT``.
        """
        if start < 1 or (count is not None and count < 0):
            raise ValueError("start must be >= 1 and count >= 0")
        async with self.read_stream(path) as reader:
            return await lines_window(reader, start, count, encoding=encoding, errors=errors)

    def read_stream(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        chunk_size: int | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> AsyncFileReader:
        """Chunks of a file of any size, in order: ``async with fs.read_stream(p) as r:
        async for chunk in r: ...``. ``in_flight`` reads are kept outstanding for throughput."""
        return AsyncFileReader(
            self._channel,
            path,
            offset=offset,
            length=length,
            chunk_size=chunk_size,
            in_flight=in_flight,
        )

    async def download(
        self, path: str, local: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> FileInfo:
        """Copy a sandbox file to a local path (atomically, with the sandbox file's mode).

        Returns the sandbox file's :class:`FileInfo` (as stat'ed before the copy).
        """
        info = await self.stat(path, follow_symlinks=True)

        async def chunks() -> AsyncIterator[bytes]:
            done = 0
            async with AsyncFileReader(self._channel, path, size_hint=info.size) as reader:
                async for chunk in reader:
                    yield chunk
                    done += len(chunk)
                    if progress is not None:
                        progress(done, reader.size or None)

        await _save(os.fspath(local), chunks(), info.mode)
        return info

    # -- write ---------------------------------------------------------------------------------

    async def write(
        self,
        path: str,
        data: Data,
        *,
        mode: int | None = None,
        owner: str | int | None = None,
        group: str | int | None = None,
        make_parents: bool = True,
        exclusive: bool = False,
    ) -> FileInfo:
        """Write a whole file atomically (readers see the old or the new content, never a mix).

        Args:
            data: bytes or str (UTF-8), a binary file object, or an (async) iterable of bytes;
                anything above 512 KiB is streamed in chunks, never held whole by execd.
            mode: permission bits; default keeps an existing file's mode (new files: 0o644).
            owner, group: user/group name or numeric id (default: keep / execd's user).
            make_parents: create missing parent directories.
            exclusive: fail with ``FsAlreadyExists`` if the path exists.

        Raises:
            FsIsADirectory, FsNotADirectory, FsAlreadyExists, FsPermissionDenied, FsNoSpace.
        """
        owner_msg = owner_of(owner, group)
        payload: Stream = data.encode() if isinstance(data, str) else data
        if isinstance(payload, bytes | bytearray | memoryview) and len(payload) <= SMALL_WRITE:
            req = FsWrite(
                path=path,
                data=bytes(payload),
                mode=mode,
                owner=owner_msg,
                make_parents=make_parents,
                exclusive=exclusive,
            )
            return await self._entry("write", req)
        writer = AsyncFileWriter(
            self._channel,
            path,
            mode=mode,
            owner=owner_msg,
            make_parents=make_parents,
            exclusive=exclusive,
        )
        async with writer:
            await _pump(payload, writer)
            return await writer.commit()

    def open_writer(
        self,
        path: str,
        *,
        mode: int | None = None,
        owner: str | int | None = None,
        group: str | int | None = None,
        make_parents: bool = True,
        exclusive: bool = False,
        chunk_size: int | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> AsyncFileWriter:
        """An upload to write piece by piece: ``async with fs.open_writer(p) as w:
        await w.write(b"...")`` commits on exit (aborts on an exception)."""
        return AsyncFileWriter(
            self._channel,
            path,
            mode=mode,
            owner=owner_of(owner, group),
            make_parents=make_parents,
            exclusive=exclusive,
            chunk_size=chunk_size,
            in_flight=in_flight,
        )

    async def upload(
        self,
        local: str | os.PathLike[str],
        path: str,
        *,
        mode: int | None = None,
        progress: Progress | None = None,
    ) -> FileInfo:
        """Copy a local file into the sandbox (streamed; keeps the local mode unless ``mode``)."""
        with open(local, "rb") as f:  # noqa: ASYNC230 - reads below run on a thread
            st = os.fstat(f.fileno())
            mode = mode if mode is not None else st.st_mode & 0o7777
            async with self.open_writer(path, mode=mode) as writer:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    await writer.write(chunk)
                    if progress is not None:
                        progress(writer.written, st.st_size)
                return await writer.commit()

    # -- directories as tar streams -------------------------------------------------------------

    def archive(
        self, path: str, *, gzip: bool = False, progress: Progress | None = None
    ) -> AsyncIterator[bytes]:
        """The directory ``path`` as a tar stream (names relative to it), any size, in chunks
        as the sandbox's ``tar`` makes them: ``async for chunk in sbx.fs.archive("/workspace")``.
        Modes, symlinks, hard links, mtimes, empty directories (and with GNU tar, xattrs and
        sparse files) are kept. ``progress(done, None)`` after each chunk.

        Raises (from the iteration): FsNotFound, FsNotADirectory, FsPermissionDenied;
        ArchiveUnsupported (no ``tar`` in the image); ArchiveFailed (``tar`` failed midway:
        the chunks already given are then incomplete).
        """
        return archive(self._channel, path, gzip=gzip, progress=_no_total(progress))

    async def archive_to(
        self,
        path: str,
        local: str | os.PathLike[str],
        *,
        gzip: bool = False,
        progress: Progress | None = None,
    ) -> int:
        """Save the directory ``path`` as a tar file ``local`` (written whole or not at all);
        returns its size. Raises as :meth:`archive`."""
        return await _save(os.fspath(local), self.archive(path, gzip=gzip, progress=progress))

    async def extract(
        self,
        path: str,
        source: bytes | AsyncIterable[bytes] | Iterable[bytes] | IO[bytes] | os.PathLike[str],
        *,
        gzip: bool = False,
        progress: Progress | None = None,
    ) -> int:
        """Unpack a tar stream into the directory ``path`` (made if missing; what is there stays
        unless the archive replaces it), as the sandbox's user: the archive can write nothing
        that user could not. ``source``: bytes, chunks (sync or async), a binary file object,
        or a local tar file's path. Returns the bytes sent.

        Raises: FsNotADirectory, FsPermissionDenied; ArchiveUnsupported (no ``tar``);
        ArchiveFailed (not a tar, truncated, no space: ``details["stderr"]`` says).
        """
        if isinstance(source, os.PathLike):
            with open(source, "rb") as f:  # noqa: ASYNC230 - reads run on a thread
                return await self.extract(path, f, gzip=gzip, progress=progress)
        return await extract(
            self._channel, path, _chunks(source), gzip=gzip, progress=_no_total(progress)
        )

    async def write_files(
        self,
        files: Mapping[str, bytes | str],
        *,
        make_parents: bool = True,
        concurrency: int = 8,
    ) -> list[FileInfo]:
        """Write several files (each atomically), ``concurrency`` at a time; results in order."""
        gate = asyncio.Semaphore(max(concurrency, 1))

        async def one(path: str, data: bytes | str) -> FileInfo:
            async with gate:
                return await self.write(path, data, make_parents=make_parents)

        return list(await asyncio.gather(*(one(p, d) for p, d in files.items())))

    # -- describe ------------------------------------------------------------------------------

    async def stat(self, path: str, *, follow_symlinks: bool = False) -> FileInfo:
        """Describe a path (a symlink itself unless ``follow_symlinks``). Raises FsNotFound."""
        return await self._entry("stat", FsPath(path=path, follow=follow_symlinks))

    async def exists(self, path: str, *, follow_symlinks: bool = False) -> bool:
        """Whether ``path`` exists (a dangling symlink exists unless ``follow_symlinks``)."""
        r = await self._call(
            "exists", FsPath(path=path, follow=follow_symlinks), FsExistence, OP_TIMEOUT
        )
        return r.exists

    async def list(
        self,
        path: str = "/workspace",
        *,
        depth: int = 1,
        hidden: bool = True,
        limit: int | None = None,
    ) -> FileList:
        """Entries below a directory, ``depth`` levels deep, sorted, parents before children.

        Pages are fetched as needed; ``limit`` caps the total (then ``truncated`` is set).
        Symlinks are listed (with ``target``), never followed.

        Raises:
            FsNotFound, FsNotADirectory, FsPermissionDenied.
        """
        entries: list[FileInfo] = []
        cursor: str | None = None
        while True:
            page = None if limit is None else min(limit - len(entries), 10_000)
            req = FsList(path=path, depth=depth, hidden=hidden, limit=page, cursor=cursor)
            r = await self._call("list", req, FsListing, WALK_TIMEOUT)
            entries.extend(FileInfo.from_wire(e) for e in r.entries)
            if not r.truncated or r.cursor is None:
                return FileList(tuple(entries), truncated=r.truncated)
            if limit is not None and len(entries) >= limit:
                return FileList(tuple(entries), truncated=True)
            cursor = r.cursor

    async def glob(
        self,
        pattern: str,
        *,
        path: str | None = None,
        hidden: bool = False,
        type: FileType | None = None,
        limit: int = 1000,
    ) -> FileList:
        """Entries matching a glob (``*``, ``?``, ``[..]`` within a name, ``**`` across
        directories), relative to ``path`` (default the workspace) or absolute."""
        req = FsGlob(pattern=pattern, path=path, hidden=hidden, type=type, limit=limit)
        r = await self._call("glob", req, FsListing, WALK_TIMEOUT)
        return FileList(tuple(FileInfo.from_wire(e) for e in r.entries), truncated=r.truncated)

    async def search(
        self,
        query: str,
        *,
        path: str | None = None,
        glob: str | None = None,
        regex: bool = False,
        case_sensitive: bool = True,
        hidden: bool = False,
        binary: bool = False,
        limit: int = 1000,
    ) -> SearchResult:
        """Lines containing ``query`` (substring, or a Python regex with ``regex``) in a file or
        below a directory (default: the workspace), optionally only files matching ``glob``.
        Binary files are skipped unless ``binary``."""
        req = FsSearch(
            query=query,
            path=path,
            glob=glob,
            regex=regex,
            hidden=hidden,
            case_sensitive=case_sensitive,
            binary=binary,
            limit=limit,
        )
        return SearchResult.from_wire(await self._call("search", req, FsSearchResult, WALK_TIMEOUT))

    async def replace(
        self,
        path: str,
        old: str,
        new: str,
        *,
        glob: str | None = None,
        regex: bool = False,
        count: int | None = None,
        hidden: bool = False,
        binary: bool = False,
        dry_run: bool = False,
    ) -> ReplaceResult:
        """Replace ``old`` with ``new`` in a file, or in every file below a directory matching
        ``glob``; each file is rewritten atomically keeping its mode. With ``regex``, ``new``
        may use ``\\1`` group references. Binary files are skipped unless ``binary``."""
        req = FsReplace(
            path=path,
            old=old,
            new=new,
            glob=glob,
            regex=regex,
            count=count,
            hidden=hidden,
            binary=binary,
            dry_run=dry_run,
        )
        return ReplaceResult.from_wire(
            await self._call("replace", req, FsReplaceResult, WALK_TIMEOUT)
        )

    # -- change --------------------------------------------------------------------------------

    async def mkdir(
        self,
        path: str,
        *,
        parents: bool = True,
        mode: int | None = None,
        owner: str | int | None = None,
        group: str | int | None = None,
    ) -> FileInfo:
        """Create a directory; with ``parents`` (default) like ``mkdir -p``."""
        req = FsMkdir(path=path, parents=parents, mode=mode, owner=owner_of(owner, group))
        return await self._entry("mkdir", req)

    async def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        """Delete a file, symlink or directory (non-empty ones need ``recursive``); returns
        whether it existed. Raises FsNotEmpty, FsNotFound (unless ``missing_ok``)."""
        req = FsRemove(path=path, recursive=recursive, missing_ok=missing_ok)
        return (await self._call("remove", req, FsRemoved, WALK_TIMEOUT)).existed

    async def move(
        self, src: str, dst: str, *, overwrite: bool = False, make_parents: bool = False
    ) -> FileInfo:
        """Rename ``src`` to the new path ``dst``. Raises FsAlreadyExists unless ``overwrite``."""
        req = FsMove(src=src, dst=dst, overwrite=overwrite, make_parents=make_parents)
        return await self._entry("move", req, WALK_TIMEOUT)

    rename = move

    async def copy(
        self,
        src: str,
        dst: str,
        *,
        recursive: bool = False,
        overwrite: bool = False,
        make_parents: bool = False,
    ) -> FileInfo:
        """Copy a file (atomically, mode kept) or, with ``recursive``, a directory tree."""
        req = FsCopy(
            src=src, dst=dst, recursive=recursive, overwrite=overwrite, make_parents=make_parents
        )
        return await self._entry("copy", req, WALK_TIMEOUT)

    async def chmod(self, path: str, mode: int, *, recursive: bool = False) -> FileInfo:
        """Set permission bits, e.g. ``chmod("run.sh", 0o755)``."""
        return await self._entry("chmod", FsChmod(path=path, mode=mode, recursive=recursive))

    async def chown(
        self,
        path: str,
        owner: str | int | None = None,
        group: str | int | None = None,
        *,
        recursive: bool = False,
    ) -> FileInfo:
        """Set owner and/or group, by name or numeric id."""
        who = owner_of(owner, group)
        if who is None:
            raise ValueError("chown needs an owner or a group")
        return await self._entry("chown", FsChown(path=path, owner=who, recursive=recursive))


async def _pump(data: Stream, writer: AsyncFileWriter) -> None:
    """Feed ``data`` of any accepted shape to ``writer``."""
    if isinstance(data, bytes | bytearray | memoryview):
        await writer.write(data)  # sent in chunks straight from this buffer
    elif hasattr(data, "read"):
        reader: IO[bytes] = data  # type: ignore[assignment]
        while chunk := await asyncio.to_thread(reader.read, CHUNK):
            await writer.write(chunk)
    elif isinstance(data, AsyncIterable):
        async for chunk in data:
            await writer.write(chunk)
    else:
        for piece in data:
            await writer.write(piece)


async def _save(local: str, chunks: AsyncIterator[bytes], mode: int | None = None) -> int:
    """Write ``chunks`` to ``local`` whole or not at all (a temporary file beside it, renamed
    over it at the end; with ``mode`` if given). Returns the bytes written."""
    fd, tmp = tempfile.mkstemp(prefix=".sandpod-", dir=os.path.dirname(local) or ".")
    try:
        size = 0
        with os.fdopen(fd, "wb") as out:
            async for chunk in chunks:
                await asyncio.to_thread(out.write, chunk)
                size += len(chunk)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:  # a source left early (an error here) stops its reads in the sandbox now
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
    return size


def _no_total(progress: Progress | None) -> Callable[[int], None] | None:
    """A tar stream's size is not known ahead: ``progress(done, None)``."""
    if progress is None:
        return None

    def relay(done: int) -> None:
        progress(done, None)

    return relay


async def _chunks(
    source: bytes | AsyncIterable[bytes] | Iterable[bytes] | IO[bytes],
) -> AsyncIterator[bytes]:
    """Any of :meth:`AsyncFiles.extract`'s sources as chunks (files read on a thread)."""
    if isinstance(source, bytes | bytearray | memoryview):
        yield bytes(source)
    elif isinstance(source, AsyncIterable):
        async for piece in source:
            yield piece
    elif hasattr(source, "read"):
        while piece := await asyncio.to_thread(source.read, CHUNK):
            yield piece
    else:
        for piece in source:
            yield piece
