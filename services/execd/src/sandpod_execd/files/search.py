"""Content search (``grep``) and search-and-replace over a file or a directory tree.

Files come from the same bounded, symlink-free walk as listings, filtered by an optional glob.
Search reads files line by line (lines are read at most ``MAX_LINE_READ`` bytes at a time), so a
huge file costs time, not memory; the walk's :class:`~.listing.Budget` bounds the time. Replace
must rewrite whole files, so it skips files over ``MAX_REPLACE_FILE`` (reported, not silently):
each changed file is written atomically with its mode and owner kept, and a file modified between
our read and our write is skipped as ``changed`` rather than clobbered.

Binary files (a NUL byte in the first 8 KiB) are skipped unless asked for. Text is treated as
UTF-8; undecodable bytes survive a replace unchanged (``surrogateescape``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterator

from sandpod_contract.errors import BadRequest
from sandpod_execd.files.atomic import AtomicFile
from sandpod_execd.files.listing import Budget, glob_regex, walk
from sandpod_execd.files.paths import os_error
from sandpod_execd.files.rooted import Root, naming

__all__ = ["Match", "Replaced", "SearchFound", "files_below", "replace", "search"]

BINARY_SNIFF = 8192
MAX_LINE_READ = 1024 * 1024
MAX_LINE_TEXT = 1000  # characters of a matching line returned
MAX_REPLACE_FILE = 16 * 1024 * 1024
MAX_FILES_LISTED = 1000  # changed/skipped files named in one reply (the counts cover all)


@dataclasses.dataclass(frozen=True, slots=True)
class Match:
    path: str
    line: int
    column: int
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class SearchFound:
    matches: list[Match]
    files_scanned: int
    truncated: bool


@dataclasses.dataclass
class Replaced:
    files: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    total: int = 0
    truncated: bool = False

    def skip(self, path: str, reason: str) -> None:
        if len(self.skipped) < MAX_FILES_LISTED:
            self.skipped.append((path, reason))
        else:
            self.truncated = True


def _compile(pattern: str, flags: int = 0) -> re.Pattern[str]:
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise BadRequest(f"invalid regular expression: {exc}", pattern=pattern) from exc


Candidate = tuple[str, int, str]  # (path in the root, fd of its directory or -1, name in it)


def files_below(
    root: Root, path: str, pattern: str | None, hidden: bool, budget: Budget
) -> Iterator[Candidate]:
    """``path`` if it is a file (fd -1: open it through the root), else the regular files below
    it matching ``pattern``, each with its directory's descriptor (valid until the next item).

    Raises:
        OSError: ``path`` is missing or unreadable.
    """
    if not stat.S_ISDIR(root.stat(path).st_mode):
        yield path, -1, ""
        return
    rx = glob_regex(pattern, hidden) if pattern else None
    explicit_dot = pattern is not None and any(s.startswith(".") for s in pattern.split("/"))
    items = walk(root, path, depth=None, hidden=hidden or explicit_dot, budget=budget)
    with contextlib.closing(items):
        for key, item, fd in items:
            try:
                if not item.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            if rx is None or rx.fullmatch("/".join(key)):
                yield posixpath.join(path, *key), fd, item.name


def _open(root: Root, found: Candidate) -> int:
    """A readable descriptor of a regular file found (never through a link below the root).

    Raises:
        OSError: EINVAL when it is not a regular file (a FIFO could block a read forever).
    """
    path, dirfd, name = found
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if dirfd < 0:
        fd = root.open(path, flags)
    else:
        with naming(path):
            fd = os.open(name, flags | os.O_NOFOLLOW, dir_fd=dirfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def _lstat(root: Root, found: Candidate) -> os.stat_result:
    path, dirfd, name = found
    if dirfd < 0:
        return root.stat(path)
    with naming(path):
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)


def _finder(query: str, regex: bool, case_sensitive: bool) -> Callable[[str], int]:
    """A function returning the index of the first match in a line, or -1."""
    if not regex and case_sensitive:
        return lambda text: text.find(query)
    rx = _compile(query if regex else re.escape(query), 0 if case_sensitive else re.IGNORECASE)

    def find(text: str) -> int:
        m = rx.search(text)
        return m.start() if m else -1

    return find


def search(
    root: Root,
    path: str,
    query: str,
    *,
    regex: bool,
    case_sensitive: bool,
    pattern: str | None,
    hidden: bool,
    binary: bool,
    limit: int,
    budget: Budget,
) -> SearchFound:
    """Lines containing ``query`` (first match per line), in walk and line order."""
    find = _finder(query, regex, case_sensitive)
    matches: list[Match] = []
    scanned = 0
    for found in files_below(root, path, pattern, hidden, budget):
        scanned += 1
        try:
            if _scan(root, found, find, binary=binary, out=matches, limit=limit, budget=budget):
                return SearchFound(matches, scanned, truncated=True)
        except OSError:
            continue  # unreadable or vanished: skip it
        if budget.exhausted:
            break
    return SearchFound(matches, scanned, truncated=budget.exhausted)


def _scan(
    root: Root,
    found: Candidate,
    find: Callable[[str], int],
    *,
    binary: bool,
    out: list[Match],
    limit: int,
    budget: Budget,
) -> bool:
    """Append ``path``'s matching lines to ``out``; True once ``limit`` is exceeded."""
    path = found[0]
    with open(_open(root, found), "rb") as f:
        if not binary and b"\x00" in f.read(BINARY_SNIFF):
            return False
        f.seek(0)
        line = 1
        for raw in iter(lambda: f.readline(MAX_LINE_READ), b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            col = find(text)
            if col >= 0:
                if len(out) >= limit:
                    return True
                out.append(Match(path, line, col + 1, text[:MAX_LINE_TEXT]))
            if raw.endswith(b"\n"):
                line += 1  # a line longer than MAX_LINE_READ is read in parts, one number
            if line % 1024 == 0 and not budget.spend():
                return False
    return False


def replace(
    root: Root,
    path: str,
    old: str,
    new: str,
    *,
    regex: bool,
    count: int | None,
    pattern: str | None,
    hidden: bool,
    binary: bool,
    dry_run: bool,
    budget: Budget,
) -> Replaced:
    """Replace ``old`` by ``new`` in ``root`` or the files below it (see the module docstring)."""
    rx = _compile(old) if regex else None
    result = Replaced()
    for found in files_below(root, path, pattern, hidden, budget):
        shown = found[0]
        try:
            n = _replace_one(
                root,
                found,
                old=old,
                new=new,
                rx=rx,
                count=count,
                binary=binary,
                dry_run=dry_run,
                result=result,
            )
        except OSError as exc:
            result.skip(shown, os_error(exc).code)
            continue
        if n:
            result.total += n
            if len(result.files) < MAX_FILES_LISTED:
                result.files.append((shown, n))
            else:
                result.truncated = True
        if budget.exhausted:
            result.truncated = True
            break
    return result


def _replace_one(
    root: Root,
    found: Candidate,
    *,
    old: str,
    new: str,
    rx: re.Pattern[str] | None,
    count: int | None,
    binary: bool,
    dry_run: bool,
    result: Replaced,
) -> int:
    path = found[0]
    with open(_open(root, found), "rb") as f:
        before = os.fstat(f.fileno())
        if before.st_size > MAX_REPLACE_FILE:
            result.skip(path, "too_large")
            return 0
        data = f.read(MAX_REPLACE_FILE + 1)
    if not binary and b"\x00" in data[:BINARY_SNIFF]:
        result.skip(path, "binary")
        return 0
    if rx is None:
        old_b, new_b = old.encode(), new.encode()
        n = data.count(old_b) if count is None else min(count, data.count(old_b))
        changed = data.replace(old_b, new_b, -1 if count is None else count) if n else data
    else:
        text = data.decode("utf-8", "surrogateescape")
        try:
            out, n = rx.subn(new, text, count=count or 0)
        except (re.error, IndexError) as exc:
            raise BadRequest(f"invalid replacement {new!r}: {exc}", replacement=new) from exc
        changed = out.encode("utf-8", "surrogateescape")
    if not n or dry_run:
        return n
    now = _lstat(root, found)
    if (now.st_mtime_ns, now.st_size, now.st_ino) != (
        before.st_mtime_ns,
        before.st_size,
        before.st_ino,
    ):
        result.skip(path, "changed")
        return 0
    at = None if found[1] < 0 else (found[1], found[2])
    atomic = AtomicFile(root, path, make_parents=False, at=at)
    try:
        atomic.write(changed)
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()
    return n
