"""Blocking twin of the ``fs`` family (:class:`~sandpod.fs.api.AsyncFiles`): ``Sandbox.fs``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING

from sandpod._loop import run
from sandpod._twins import iterate
from sandpod.fs.stream import IN_FLIGHT, READ_LIMIT, FileReader, FileWriter, Progress
from sandpod.fs.types import FileInfo, FileList, FileType, ReplaceResult, SearchResult

if TYPE_CHECKING:
    from sandpod.fs.api import AsyncFiles

__all__ = ["Files"]


class Files:
    """Blocking twin of :class:`AsyncFiles` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncFiles) -> None:
        self._inner = inner

    def read(self, path: str, *, max_size: int | None = READ_LIMIT) -> bytes:
        """See :meth:`AsyncFiles.read`."""
        return run(self._inner.read(path, max_size=max_size))

    def read_text(
        self,
        path: str,
        *,
        encoding: str = "utf-8",
        errors: str = "strict",
        max_size: int | None = READ_LIMIT,
    ) -> str:
        """See :meth:`AsyncFiles.read_text`."""
        return run(self._inner.read_text(path, encoding=encoding, errors=errors, max_size=max_size))

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """See :meth:`AsyncFiles.read_range`."""
        return run(self._inner.read_range(path, offset, length))

    def read_lines(
        self,
        path: str,
        start: int = 1,
        count: int | None = None,
        *,
        encoding: str = "utf-8",
        errors: str = "replace",
    ) -> list[str]:
        """See :meth:`AsyncFiles.read_lines`."""
        return run(self._inner.read_lines(path, start, count, encoding=encoding, errors=errors))

    def read_stream(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        chunk_size: int | None = None,
        in_flight: int = IN_FLIGHT,
    ) -> FileReader:
        """Iterate a file's chunks: ``with fs.read_stream(p) as r: for chunk in r: ...``."""
        inner = self._inner.read_stream(
            path, offset=offset, length=length, chunk_size=chunk_size, in_flight=in_flight
        )
        return FileReader(inner)

    def download(
        self, path: str, local: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> FileInfo:
        """See :meth:`AsyncFiles.download`."""
        return run(self._inner.download(path, local, progress=progress))

    def archive(
        self, path: str, *, gzip: bool = False, progress: Progress | None = None
    ) -> Iterator[bytes]:
        """See :meth:`AsyncFiles.archive`: ``for chunk in sbx.fs.archive("/workspace")``
        (leaving the loop early stops the sandbox's ``tar``)."""
        return iterate(self._inner.archive(path, gzip=gzip, progress=progress))

    def archive_to(
        self,
        path: str,
        local: str | os.PathLike[str],
        *,
        gzip: bool = False,
        progress: Progress | None = None,
    ) -> int:
        """See :meth:`AsyncFiles.archive_to`."""
        return run(self._inner.archive_to(path, local, gzip=gzip, progress=progress))

    def extract(
        self,
        path: str,
        source: bytes | Iterable[bytes] | IO[bytes] | os.PathLike[str],
        *,
        gzip: bool = False,
        progress: Progress | None = None,
    ) -> int:
        """See :meth:`AsyncFiles.extract` (a file is read on a thread, an iterable on the SDK's
        loop: keep its steps cheap; neither is held in memory whole)."""
        return run(self._inner.extract(path, source, gzip=gzip, progress=progress))

    def write(
        self,
        path: str,
        data: bytes | bytearray | memoryview | str | IO[bytes] | Iterable[bytes],
        *,
        mode: int | None = None,
        owner: str | int | None = None,
        group: str | int | None = None,
        make_parents: bool = True,
        exclusive: bool = False,
    ) -> FileInfo:
        """See :meth:`AsyncFiles.write`."""
        return run(
            self._inner.write(
                path,
                data,
                mode=mode,
                owner=owner,
                group=group,
                make_parents=make_parents,
                exclusive=exclusive,
            )
        )

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
    ) -> FileWriter:
        """``with fs.open_writer(p) as w: w.write(b"...")`` (see :meth:`AsyncFiles.open_writer`)."""
        return FileWriter(
            self._inner.open_writer(
                path,
                mode=mode,
                owner=owner,
                group=group,
                make_parents=make_parents,
                exclusive=exclusive,
                chunk_size=chunk_size,
                in_flight=in_flight,
            )
        )

    def upload(
        self,
        local: str | os.PathLike[str],
        path: str,
        *,
        mode: int | None = None,
        progress: Progress | None = None,
    ) -> FileInfo:
        """See :meth:`AsyncFiles.upload`."""
        return run(self._inner.upload(local, path, mode=mode, progress=progress))

    def write_files(
        self,
        files: Mapping[str, bytes | str],
        *,
        make_parents: bool = True,
        concurrency: int = 8,
    ) -> list[FileInfo]:
        """See :meth:`AsyncFiles.write_files`."""
        return run(
            self._inner.write_files(files, make_parents=make_parents, concurrency=concurrency)
        )

    def stat(self, path: str, *, follow_symlinks: bool = False) -> FileInfo:
        """See :meth:`AsyncFiles.stat`."""
        return run(self._inner.stat(path, follow_symlinks=follow_symlinks))

    def exists(self, path: str, *, follow_symlinks: bool = False) -> bool:
        """See :meth:`AsyncFiles.exists`."""
        return run(self._inner.exists(path, follow_symlinks=follow_symlinks))

    def list(
        self,
        path: str = "/workspace",
        *,
        depth: int = 1,
        hidden: bool = True,
        limit: int | None = None,
    ) -> FileList:
        """See :meth:`AsyncFiles.list`."""
        return run(self._inner.list(path, depth=depth, hidden=hidden, limit=limit))

    def glob(
        self,
        pattern: str,
        *,
        path: str | None = None,
        hidden: bool = False,
        type: FileType | None = None,
        limit: int = 1000,
    ) -> FileList:
        """See :meth:`AsyncFiles.glob`."""
        return run(self._inner.glob(pattern, path=path, hidden=hidden, type=type, limit=limit))

    def search(
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
        """See :meth:`AsyncFiles.search`."""
        return run(
            self._inner.search(
                query,
                path=path,
                glob=glob,
                regex=regex,
                case_sensitive=case_sensitive,
                hidden=hidden,
                binary=binary,
                limit=limit,
            )
        )

    def replace(
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
        """See :meth:`AsyncFiles.replace`."""
        return run(
            self._inner.replace(
                path,
                old,
                new,
                glob=glob,
                regex=regex,
                count=count,
                hidden=hidden,
                binary=binary,
                dry_run=dry_run,
            )
        )

    def mkdir(
        self,
        path: str,
        *,
        parents: bool = True,
        mode: int | None = None,
        owner: str | int | None = None,
        group: str | int | None = None,
    ) -> FileInfo:
        """See :meth:`AsyncFiles.mkdir`."""
        return run(self._inner.mkdir(path, parents=parents, mode=mode, owner=owner, group=group))

    def remove(self, path: str, *, recursive: bool = False, missing_ok: bool = False) -> bool:
        """See :meth:`AsyncFiles.remove`."""
        return run(self._inner.remove(path, recursive=recursive, missing_ok=missing_ok))

    def move(
        self, src: str, dst: str, *, overwrite: bool = False, make_parents: bool = False
    ) -> FileInfo:
        """See :meth:`AsyncFiles.move`."""
        return run(self._inner.move(src, dst, overwrite=overwrite, make_parents=make_parents))

    rename = move

    def copy(
        self,
        src: str,
        dst: str,
        *,
        recursive: bool = False,
        overwrite: bool = False,
        make_parents: bool = False,
    ) -> FileInfo:
        """See :meth:`AsyncFiles.copy`."""
        return run(
            self._inner.copy(
                src, dst, recursive=recursive, overwrite=overwrite, make_parents=make_parents
            )
        )

    def chmod(self, path: str, mode: int, *, recursive: bool = False) -> FileInfo:
        """See :meth:`AsyncFiles.chmod`."""
        return run(self._inner.chmod(path, mode, recursive=recursive))

    def chown(
        self,
        path: str,
        owner: str | int | None = None,
        group: str | int | None = None,
        *,
        recursive: bool = False,
    ) -> FileInfo:
        """See :meth:`AsyncFiles.chown`."""
        return run(self._inner.chown(path, owner, group, recursive=recursive))
