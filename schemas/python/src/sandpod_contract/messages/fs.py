"""``fs`` family: files in the sandbox (read/write of any size, stat, list, glob, search, replace,
mkdir, remove, move, copy, chmod/chown, exists).

Paths are strings: ``/workspace`` (and below) and relative paths resolve into the sandbox
workspace; other absolute paths are taken as they are. Replies show paths in that same form
(``/workspace/...`` for anything inside the workspace). Hostile paths (NUL bytes, too long, ``..``
climbing out of ``/workspace``, symlink loops) are answered with ``fs.invalid_path`` rather than
``bad_request``, so a client can tell "this path is unusable" from "this message is malformed".

Reads are stateless and pulled: ``fs.read`` returns one :class:`FsChunk` (at most one NATS message)
of a byte range; a client reads a file of any size by asking for successive offsets, several
requests in flight if it likes. Small writes are one ``fs.write``; larger ones are an upload:
``fs.write_open`` -> ``fs.write_chunk`` (in offset order) ... -> ``fs.write_commit`` (or
``fs.write_abort``). Every write lands atomically: execd writes a temporary file in the target's
directory, fsyncs it and renames it over the target, so readers see the old or the new content,
never a mix.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "OPERATIONS",
    "EntryType",
    "FsChmod",
    "FsChown",
    "FsChunk",
    "FsCopy",
    "FsEntry",
    "FsExistence",
    "FsGlob",
    "FsList",
    "FsListing",
    "FsMatch",
    "FsMkdir",
    "FsMove",
    "FsOwner",
    "FsPath",
    "FsRead",
    "FsRemove",
    "FsRemoved",
    "FsReplace",
    "FsReplaceResult",
    "FsReplaced",
    "FsSearch",
    "FsSearchResult",
    "FsSkipped",
    "FsUpload",
    "FsUploadRef",
    "FsUploadStatus",
    "FsWrite",
    "FsWriteChunk",
    "FsWriteCommit",
    "FsWriteOpen",
]

EntryType = Literal["file", "dir", "symlink", "other"]
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _at_least(name: str, value: int | None, low: int) -> None:
    if value is not None and value < low:
        raise ValueError(f"{name} must be >= {low} (got {value})")


def _check_mode(mode: int | None) -> None:
    if mode is not None and not 0 <= mode <= 0o7777:
        raise ValueError(f"mode must be 0..0o7777 (got {mode:#o})")


def _non_empty(name: str, value: str) -> None:
    if not value:
        raise ValueError(f"{name} must not be empty")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsOwner(Message):
    """Who should own a file: a user and/or a group, each by number or by name (not both)."""

    TYPE = "fs.owner"
    uid: int | None = None
    gid: int | None = None
    user: str | None = None  # user name, resolved in the sandbox
    group: str | None = None  # group name, resolved in the sandbox

    def __post_init__(self) -> None:
        if self.uid is not None and self.user is not None:
            raise ValueError("give uid or user, not both")
        if self.gid is not None and self.group is not None:
            raise ValueError("give gid or group, not both")
        if (self.uid, self.gid, self.user, self.group) == (None, None, None, None):
            raise ValueError("an owner needs at least one of uid, gid, user, group")
        _at_least("uid", self.uid, 0)
        _at_least("gid", self.gid, 0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsEntry(Message):
    """One file, directory or link: what ``fs.stat`` says and what listings are made of."""

    TYPE = "fs.entry"
    name: str  # last path component
    path: str  # in the request's form: /workspace/... inside the workspace
    type: EntryType
    size: int  # bytes (of the link itself for a symlink)
    mode: int  # permission bits, st_mode & 0o7777
    permissions: str  # ls-style mode string, e.g. "-rwxr-xr-x"
    uid: int
    gid: int
    owner: str | None = None  # user name of uid, absent when it has none
    group: str | None = None  # group name of gid, absent when it has none
    mtime: float  # modification time, seconds since the epoch
    target: str | None = None  # a symlink's target, as stored in the link


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsPath(Message):
    """``fs.stat`` / ``fs.exists``: one path; ``follow`` describes a symlink's target instead."""

    TYPE = "fs.path"
    path: str
    follow: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsExistence(Message):
    """Reply to ``fs.exists``."""

    TYPE = "fs.existence"
    path: str
    exists: bool
    type: EntryType | None = None  # set when it exists


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsRead(Message):
    """``fs.read``: up to ``length`` bytes from ``offset`` (one message at most; ask again for
    more). Refused with ``fs.too_large`` when ``max_size`` is set and the file is larger."""

    TYPE = "fs.read"
    path: str
    offset: int = 0
    length: int | None = None  # default and cap: what fits in one reply (max_payload - 1 KiB)
    max_size: int | None = None  # refuse files larger than this many bytes

    def __post_init__(self) -> None:
        _at_least("offset", self.offset, 0)
        _at_least("length", self.length, 0)
        _at_least("max_size", self.max_size, 0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsChunk(Message):
    """Reply to ``fs.read``: ``data`` starts at ``offset``; ``eof`` when nothing follows it.

    ``size`` is the file's size when read (0 for files the kernel does not size, such as
    ``/proc`` files: read until ``eof``). ``len(data)`` may be less than asked without ``eof``
    when the request asked for more than one reply holds: continue at ``offset + len(data)``.
    """

    TYPE = "fs.chunk"
    data: bytes
    offset: int
    size: int
    eof: bool
    mtime: float  # modification time when read: a change between chunks means it changed


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsWrite(Message):
    """``fs.write``: replace (or create) a file with ``data`` atomically, in one request.

    Without ``mode``/``owner`` an existing file keeps its mode and owner (a new one gets 0o644
    and execd's user). Larger data: use ``fs.write_open`` (the request must fit
    ``max_request_bytes``).
    """

    TYPE = "fs.write"
    path: str
    data: bytes = b""
    mode: int | None = None  # permission bits, e.g. 0o755
    owner: FsOwner | None = None
    make_parents: bool = True  # create missing parent directories
    exclusive: bool = False  # fail with fs.already_exists if the path exists

    def __post_init__(self) -> None:
        _check_mode(self.mode)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsWriteOpen(Message):
    """``fs.write_open``: start an upload (a streamed atomic write). Same options as ``fs.write``.

    The target is checked now (parent, directory, exclusive), so a doomed upload fails before
    any data is sent.
    """

    TYPE = "fs.write_open"
    path: str
    mode: int | None = None
    owner: FsOwner | None = None
    make_parents: bool = True
    exclusive: bool = False

    def __post_init__(self) -> None:
        _check_mode(self.mode)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsUpload(Message):
    """Reply to ``fs.write_open``."""

    TYPE = "fs.upload"
    upload_id: str
    chunk_size: int  # largest data per fs.write_chunk that fits a request
    idle_timeout: float  # seconds without a chunk after which execd aborts the upload


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsWriteChunk(Message):
    """``fs.write_chunk``: bytes at ``offset`` of the upload.

    ``offset`` must not be beyond the bytes received so far: bytes already received are skipped
    (re-sending a chunk is harmless), a gap is refused with ``bad_request`` (``details.received``)
    after a short wait for the missing chunk (pipelined chunks may overtake each other).
    """

    TYPE = "fs.write_chunk"
    upload_id: str
    offset: int
    data: bytes

    def __post_init__(self) -> None:
        _non_empty("upload_id", self.upload_id)
        _at_least("offset", self.offset, 0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsUploadStatus(Message):
    """Reply to ``fs.write_chunk`` and ``fs.write_abort``."""

    TYPE = "fs.upload_status"
    upload_id: str
    received: int  # bytes written so far (contiguous from 0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsWriteCommit(Message):
    """``fs.write_commit``: verify and move the upload into place; replies the file's entry.

    A ``size`` or ``sha256`` that does not match what was received aborts the upload with
    ``bad_request`` and leaves the target untouched.
    """

    TYPE = "fs.write_commit"
    upload_id: str
    size: int | None = None  # total bytes the client sent
    sha256: str | None = None  # hex digest of the whole content

    def __post_init__(self) -> None:
        _non_empty("upload_id", self.upload_id)
        _at_least("size", self.size, 0)
        if self.sha256 is not None and not _SHA256.fullmatch(self.sha256):
            raise ValueError("sha256 must be 64 hex digits")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsUploadRef(Message):
    """``fs.write_abort``: drop an upload and its temporary file (unknown ids are fine)."""

    TYPE = "fs.upload_ref"
    upload_id: str

    def __post_init__(self) -> None:
        _non_empty("upload_id", self.upload_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsList(Message):
    """``fs.list``: a directory's entries, ``depth`` levels deep, sorted, in pages.

    Symlinks are listed, never followed (except a symlink given as ``path``). A page ends at
    ``limit`` entries or when the reply is full: then ``truncated`` is set and ``cursor`` continues.
    """

    TYPE = "fs.list"
    path: str
    depth: int = 1  # 1: the directory's children; 2: and grandchildren; ...
    hidden: bool = True  # include dot files (a hidden directory's content too)
    limit: int | None = None  # entries per page (default 1000, at most 10000)
    cursor: str | None = None  # from the previous page's reply

    def __post_init__(self) -> None:
        _at_least("depth", self.depth, 1)
        _at_least("limit", self.limit, 1)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsListing(Message):
    """Reply to ``fs.list`` and ``fs.glob``: entries in walk order (sorted, parents first)."""

    TYPE = "fs.listing"
    path: str
    entries: tuple[FsEntry, ...] = ()
    truncated: bool = False  # more entries exist than this reply carries
    cursor: str | None = None  # fs.list: pass it back to get the next page


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsGlob(Message):
    """``fs.glob``: entries whose path below ``path`` matches ``pattern``.

    ``*``, ``?`` and ``[...]`` match within one path component, ``**`` matches any number of
    components. Without ``hidden``, wildcards do not match a leading ``.`` (as in a shell).
    """

    TYPE = "fs.glob"
    pattern: str  # relative to path, e.g. "src/**/*.py"
    path: str | None = None  # where to search (default: the workspace)
    hidden: bool = False
    type: EntryType | None = None  # only entries of this type
    limit: int | None = None  # most entries returned (default 1000, at most 10000)

    def __post_init__(self) -> None:
        _non_empty("pattern", self.pattern)
        _at_least("limit", self.limit, 1)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsSearch(Message):
    """``fs.search``: lines of text files containing ``query`` (a substring, or a regex).

    Binary files (a NUL byte in their first 8 KiB) are skipped unless ``binary``.
    """

    TYPE = "fs.search"
    query: str
    path: str | None = None  # a file, or a directory searched recursively (default: workspace)
    glob: str | None = None  # only files whose path below ``path`` matches, e.g. "**/*.py"
    regex: bool = False  # query is a Python-syntax regular expression
    case_sensitive: bool = True
    hidden: bool = False
    binary: bool = False
    limit: int | None = None  # most matches returned (default 1000, at most 10000)

    def __post_init__(self) -> None:
        _non_empty("query", self.query)
        _at_least("limit", self.limit, 1)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsMatch(Message):
    """One matching line."""

    TYPE = "fs.match"
    path: str
    line: int  # 1-based line number
    column: int  # 1-based character column of the first match
    text: str  # the line without its newline (at most 1000 characters)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsSearchResult(Message):
    """Reply to ``fs.search``."""

    TYPE = "fs.search_result"
    matches: tuple[FsMatch, ...] = ()
    files_scanned: int = 0
    truncated: bool = False  # stopped at the limit, the reply size or the time budget


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsReplace(Message):
    """``fs.replace``: replace ``old`` with ``new`` in a file, or in files below a directory.

    Each file is rewritten atomically (mode and owner kept); a file that changed while being
    rewritten is skipped. Binary files are skipped unless ``binary``. With ``regex``, ``new`` may
    use ``\\1``/``\\g<name>`` group references.
    """

    TYPE = "fs.replace"
    path: str  # a file, or a directory (then every file below it matching ``glob``)
    old: str
    new: str
    glob: str | None = None  # e.g. "**/*.py" (default: every file)
    regex: bool = False
    count: int | None = None  # at most this many replacements per file (default: all)
    hidden: bool = False
    binary: bool = False
    dry_run: bool = False  # count, change nothing

    def __post_init__(self) -> None:
        _non_empty("old", self.old)
        _at_least("count", self.count, 1)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsReplaced(Message):
    """A file ``fs.replace`` changed (or would change, in a dry run)."""

    TYPE = "fs.replaced"
    path: str
    count: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsSkipped(Message):
    """A file ``fs.replace`` left alone, and why."""

    TYPE = "fs.skipped"
    path: str
    reason: str  # "binary", "too_large", "changed", or an fs error code


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsReplaceResult(Message):
    """Reply to ``fs.replace``."""

    TYPE = "fs.replace_result"
    files: tuple[FsReplaced, ...] = ()
    total: int = 0  # replacements over all files
    skipped: tuple[FsSkipped, ...] = ()
    truncated: bool = False  # more files than the reply lists, or the time budget ran out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsMkdir(Message):
    """``fs.mkdir``: create a directory (with ``parents``, like ``mkdir -p``: existing is fine)."""

    TYPE = "fs.mkdir"
    path: str
    parents: bool = True
    mode: int | None = None  # of the new directory (default 0o755)
    owner: FsOwner | None = None

    def __post_init__(self) -> None:
        _check_mode(self.mode)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsRemove(Message):
    """``fs.remove``: delete a file, a symlink (not its target) or a directory.

    A non-empty directory needs ``recursive`` (else ``fs.not_empty``). The workspace itself and
    ``/`` cannot be removed.
    """

    TYPE = "fs.remove"
    path: str
    recursive: bool = False
    missing_ok: bool = False  # a missing path is not an error


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsRemoved(Message):
    """Reply to ``fs.remove``."""

    TYPE = "fs.removed"
    path: str
    existed: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsMove(Message):
    """``fs.move``: rename ``src`` to ``dst`` (across filesystems too); replies ``dst``'s entry.

    ``dst`` is the new path (not a directory to move into). An existing ``dst`` is an error
    (``fs.already_exists``) unless ``overwrite``; a directory is only replaced when empty.
    """

    TYPE = "fs.move"
    src: str
    dst: str
    overwrite: bool = False
    make_parents: bool = False  # create dst's missing parent directories


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsCopy(Message):
    """``fs.copy``: copy a file (atomically, mode kept) or, with ``recursive``, a directory."""

    TYPE = "fs.copy"
    src: str
    dst: str
    recursive: bool = False
    overwrite: bool = False
    make_parents: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsChmod(Message):
    """``fs.chmod``: set permission bits (a symlink's target's; recursion skips symlinks)."""

    TYPE = "fs.chmod"
    path: str
    mode: int
    recursive: bool = False

    def __post_init__(self) -> None:
        _check_mode(self.mode)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FsChown(Message):
    """``fs.chown``: set owner and/or group (recursion changes symlinks themselves)."""

    TYPE = "fs.chown"
    path: str
    owner: FsOwner
    recursive: bool = False


OPERATIONS: tuple[Operation, ...] = (
    Operation("fs", "read", FsRead, FsChunk, "read a byte range (one message at most)"),
    Operation("fs", "write", FsWrite, FsEntry, "write a whole file atomically in one request"),
    Operation("fs", "write_open", FsWriteOpen, FsUpload, "start a streamed atomic write"),
    Operation("fs", "write_chunk", FsWriteChunk, FsUploadStatus, "append bytes to an upload"),
    Operation("fs", "write_commit", FsWriteCommit, FsEntry, "verify an upload, move it in place"),
    Operation("fs", "write_abort", FsUploadRef, FsUploadStatus, "drop an upload"),
    Operation("fs", "stat", FsPath, FsEntry, "describe one path"),
    Operation("fs", "exists", FsPath, FsExistence, "does a path exist"),
    Operation("fs", "list", FsList, FsListing, "list a directory (depth, hidden, pages)"),
    Operation("fs", "glob", FsGlob, FsListing, "find paths matching a glob pattern"),
    Operation("fs", "search", FsSearch, FsSearchResult, "find lines containing text or a regex"),
    Operation("fs", "replace", FsReplace, FsReplaceResult, "search and replace in files"),
    Operation("fs", "mkdir", FsMkdir, FsEntry, "create a directory (-p by default)"),
    Operation("fs", "remove", FsRemove, FsRemoved, "delete a file or directory"),
    Operation("fs", "move", FsMove, FsEntry, "rename or move a path"),
    Operation("fs", "copy", FsCopy, FsEntry, "copy a file or directory"),
    Operation("fs", "chmod", FsChmod, FsEntry, "set permission bits"),
    Operation("fs", "chown", FsChown, FsEntry, "set owner and group"),
)

FRAMES: tuple[type[Message], ...] = ()
