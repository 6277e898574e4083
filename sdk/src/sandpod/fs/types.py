"""What the ``fs`` family returns (plain, frozen; no wire details)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator
from typing import Literal, overload

from sandpod_contract.messages.fs import FsEntry, FsReplaceResult, FsSearchResult

__all__ = [
    "FileInfo",
    "FileList",
    "FileType",
    "ReplaceResult",
    "Replacement",
    "SearchMatch",
    "SearchResult",
    "SkippedFile",
]

FileType = Literal["file", "dir", "symlink", "other"]


@dataclasses.dataclass(frozen=True, slots=True)
class FileInfo:
    """One file, directory or symlink in the sandbox.

    ``path`` is in the sandbox's form (``/workspace/...`` inside the workspace). ``size`` of a
    symlink is the link's own; ``target`` is what it points to. ``mode`` holds the permission
    bits (``0o755``), ``permissions`` the same as ``ls`` shows them (``-rwxr-xr-x``).
    """

    name: str
    path: str
    type: FileType
    size: int
    mode: int
    permissions: str
    uid: int
    gid: int
    owner: str | None
    group: str | None
    mtime: float
    target: str | None = None

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"

    @property
    def modified(self) -> datetime.datetime:
        """``mtime`` as an aware UTC datetime."""
        return datetime.datetime.fromtimestamp(self.mtime, tz=datetime.UTC)

    @classmethod
    def from_wire(cls, e: FsEntry) -> FileInfo:
        return cls(
            name=e.name,
            path=e.path,
            type=e.type,
            size=e.size,
            mode=e.mode,
            permissions=e.permissions,
            uid=e.uid,
            gid=e.gid,
            owner=e.owner,
            group=e.group,
            mtime=e.mtime,
            target=e.target,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class FileList:
    """Entries of a listing or glob, in walk order; ``truncated`` when more exist."""

    entries: tuple[FileInfo, ...]
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[FileInfo]:
        return iter(self.entries)

    @overload
    def __getitem__(self, i: int) -> FileInfo: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[FileInfo, ...]: ...
    def __getitem__(self, i: int | slice) -> FileInfo | tuple[FileInfo, ...]:
        return self.entries[i]

    @property
    def paths(self) -> list[str]:
        return [e.path for e in self.entries]


@dataclasses.dataclass(frozen=True, slots=True)
class SearchMatch:
    """A line containing the query: 1-based ``line`` and ``column`` (of the first match)."""

    path: str
    line: int
    column: int
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class SearchResult:
    """Matches in walk and line order; ``truncated`` when the limit or time budget cut it."""

    matches: tuple[SearchMatch, ...]
    files_scanned: int
    truncated: bool

    def __len__(self) -> int:
        return len(self.matches)

    def __iter__(self) -> Iterator[SearchMatch]:
        return iter(self.matches)

    @classmethod
    def from_wire(cls, r: FsSearchResult) -> SearchResult:
        return cls(
            matches=tuple(SearchMatch(m.path, m.line, m.column, m.text) for m in r.matches),
            files_scanned=r.files_scanned,
            truncated=r.truncated,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Replacement:
    path: str
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class SkippedFile:
    """A file replace left alone: ``binary``, ``too_large`` (over 16 MiB), ``changed`` (modified
    while being rewritten) or an ``fs.*`` error code."""

    path: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class ReplaceResult:
    """Files changed (or that would be, in a dry run) with their counts, and files skipped."""

    files: tuple[Replacement, ...]
    total: int
    skipped: tuple[SkippedFile, ...]
    truncated: bool

    @classmethod
    def from_wire(cls, r: FsReplaceResult) -> ReplaceResult:
        return cls(
            files=tuple(Replacement(f.path, f.count) for f in r.files),
            total=r.total,
            skipped=tuple(SkippedFile(s.path, s.reason) for s in r.skipped),
            truncated=r.truncated,
        )
