"""Walking directory trees: listings in pages, and glob patterns with ``**``.

The walk is depth-first with each directory's children sorted by name, so walk order equals the
order of relative paths compared component by component. That makes a page cursor cheap and
stateless: it is the relative path of the last entry returned, and the next page skips every
subtree that sorts before it. Symlinks are listed, never descended into, so loops cannot trap a
walk: each directory is opened through its parent's descriptor with ``O_NOFOLLOW``, so a
sandbox process swapping one for a link mid-walk cannot lead the walk out of the sandbox.
Everything is bounded: entries read per directory, entries visited and wall time
(:class:`Budget`); when a bound cuts a walk short the result says ``truncated``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import posixpath
import re
import stat
import threading
import time
from collections.abc import Generator, Iterator

from sandpod_execd.files.entries import Entry, EntryType, entry_at, entry_of
from sandpod_execd.files.rooted import Root, naming, open_dir

__all__ = [
    "Budget",
    "Found",
    "Walked",
    "entry_of_walked",
    "glob",
    "glob_regex",
    "list_dir",
    "split_pattern",
    "walk",
]

MAX_DIR_ENTRIES = 100_000  # children read from one directory (sorting needs them all in memory)
MAX_DEPTH = 256
WILDCARDS = frozenset("*?[")


@dataclasses.dataclass
class Budget:
    """How much a walk may visit and for how long; ``exhausted`` once either runs out."""

    seconds: float = 20.0
    entries: int = 1_000_000
    stop: threading.Event | None = None  # set at shutdown: walks end early instead of finishing
    started: float = dataclasses.field(default_factory=time.monotonic)
    visited: int = 0
    exhausted: bool = False

    def spend(self) -> bool:
        """Count one visited entry; False (and ``exhausted``) once over budget."""
        self.visited += 1
        if self.visited > self.entries or (
            self.visited % 256 == 0
            and (
                time.monotonic() - self.started > self.seconds
                or (self.stop is not None and self.stop.is_set())
            )
        ):
            self.exhausted = True
        return not self.exhausted


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """Entries a walk produced, in walk order, and whether it stopped early."""

    entries: list[tuple[str, Entry]]  # (path relative to the walk's root, entry)
    truncated: bool
    cursor: str | None = None  # set when truncated: where the next page starts


def _children(fd: int, budget: Budget) -> list[os.DirEntry[str]]:
    out: list[os.DirEntry[str]] = []
    with os.scandir(fd) as it:
        for item in it:
            if len(out) >= MAX_DIR_ENTRIES:
                budget.exhausted = True  # the listing of this directory is incomplete
                break
            out.append(item)
    out.sort(key=lambda e: e.name)
    return out


Walked = tuple[tuple[str, ...], os.DirEntry[str], int]  # (relative path, entry, its dir's fd)


def walk(
    root: Root,
    path: str,
    *,
    depth: int | None,
    hidden: bool,
    budget: Budget,
    after: tuple[str, ...] | None = None,
) -> Generator[Walked, None, None]:
    """Yield ``(relative path components, entry, fd of the entry's directory)`` below ``path``
    in walk order; the fd is valid until the next item (use it at once, close the generator).

    ``path`` is resolved in ``root`` (links followed there); below it every directory is opened
    through its parent's descriptor with ``O_NOFOLLOW``. ``depth`` levels (None: unlimited, up to
    MAX_DEPTH); entries up to and including ``after`` are skipped. An unreadable ``path`` raises
    ``OSError``; unreadable subdirectories are skipped.
    """
    levels = min(depth or MAX_DEPTH, MAX_DEPTH)
    fd = root.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    try:
        with naming(path):
            children = _children(fd, budget)
        yield from _walk(fd, children, (), levels=levels, hidden=hidden, budget=budget, after=after)
    finally:
        os.close(fd)


def _walk(
    fd: int,
    children: list[os.DirEntry[str]],
    rel: tuple[str, ...],
    *,
    levels: int,
    hidden: bool,
    budget: Budget,
    after: tuple[str, ...] | None,
) -> Iterator[Walked]:
    for child in children:
        if not hidden and child.name.startswith("."):
            continue
        key = (*rel, child.name)
        inside_cursor = after is not None and after[: len(key)] == key
        if after is not None and key <= after and not inside_cursor:
            continue  # this whole subtree came before the cursor
        if not budget.spend():
            return
        if after is None or key > after:
            yield key, child, fd
        if levels > 1 and _is_dir(child):
            try:
                sub = open_dir(child.name, fd)
            except OSError:
                continue  # swapped for a link, or a directory we may not open: skip its content
            try:
                grand = _children(sub, budget)
            except OSError:
                grand = []  # a directory we may not read: listed, its content skipped
            try:
                yield from _walk(
                    sub, grand, key, levels=levels - 1, hidden=hidden, budget=budget, after=after
                )
            finally:
                os.close(sub)
            if budget.exhausted:
                return


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def entry_of_walked(
    base: str, key: tuple[str, ...], item: os.DirEntry[str], fd: int
) -> Entry | None:
    """The entry a walk found (shown as ``base/key...``), or None if it went away."""
    try:
        return entry_at(fd, item.name, posixpath.join(base, *key), item.stat(follow_symlinks=False))
    except OSError:
        return None  # removed while we walked


def list_dir(
    root: Root,
    path: str,
    *,
    depth: int,
    hidden: bool,
    limit: int,
    cursor: str | None,
    budget: Budget,
) -> Found:
    """Up to ``limit`` entries below directory ``path`` after ``cursor``. Raises ``OSError``."""
    after = tuple(cursor.split("/")) if cursor else None
    out: list[tuple[str, Entry]] = []
    items = walk(root, path, depth=depth, hidden=hidden, budget=budget, after=after)
    with contextlib.closing(items):
        for key, item, fd in items:
            if len(out) >= limit:
                return Found(out, truncated=True, cursor=out[-1][0])
            if (entry := entry_of_walked(path, key, item, fd)) is not None:
                out.append(("/".join(key), entry))
    if budget.exhausted and out:
        return Found(out, truncated=True, cursor=out[-1][0])
    return Found(out, truncated=budget.exhausted)


# -- glob ------------------------------------------------------------------------------------------


def _class(seg: str, i: int) -> tuple[str, int] | None:
    """The regex of the ``[...]`` class opening at ``seg[i]`` and the index after it."""
    j = i + 1
    if j < len(seg) and seg[j] in "!^":
        j += 1
    if j < len(seg) and seg[j] == "]":
        j += 1
    while j < len(seg) and seg[j] != "]":
        j += 1
    if j >= len(seg):
        return None  # no closing bracket: a literal '['
    body = seg[i + 1 : j].replace("\\", "\\\\")
    if body.startswith("!"):
        body = "^" + body[1:]
    elif body.startswith("^"):
        body = "\\" + body
    return f"(?!/)[{body}]", j + 1


def _segment(seg: str, hidden: bool) -> str:
    out: list[str] = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (cls := _class(seg, i)) is not None:
            out.append(cls[0])
            i = cls[1]
            continue
        else:
            out.append(re.escape(c))
        i += 1
    rx = "".join(out)
    return rx if hidden or seg.startswith(".") else r"(?!\.)" + rx


def split_pattern(pattern: str) -> tuple[str | None, str]:
    """An absolute pattern's literal leading directories and the rest: ``/a/b/*.py`` ->
    ``("/a/b", "*.py")``; a relative pattern -> ``(None, pattern)``."""
    if not pattern.startswith("/"):
        return None, pattern
    segs = pattern.split("/")
    literal = 0
    while literal < len(segs) - 1 and not WILDCARDS & set(segs[literal]):
        literal += 1
    if segs[literal] != "**" and not WILDCARDS & set(segs[literal]):
        literal = len(segs) - 1  # no wildcard at all: the last name is the pattern
    return "/".join(segs[:literal]) or "/", "/".join(segs[literal:])


def glob_regex(pattern: str, hidden: bool) -> re.Pattern[str]:
    """A regex that fullmatches the relative paths ``pattern`` matches."""
    segs = [s for s in pattern.split("/") if s not in ("", ".")]
    one = r"[^/]+" if hidden else r"(?!\.)[^/]+"
    parts: list[str] = []
    for i, seg in enumerate(segs):
        last = i == len(segs) - 1
        if seg == "**":
            parts.append(f"{one}(?:/{one})*" if last else f"(?:{one}/)*")
        else:
            parts.append(_segment(seg, hidden) + ("" if last else "/"))
    return re.compile("".join(parts))


def glob(
    root: Root,
    base: str,
    pattern: str,
    *,
    hidden: bool,
    kind: EntryType | None,
    limit: int,
    budget: Budget,
) -> Found:
    """Entries below ``base`` whose relative path matches ``pattern``. Raises ``OSError``."""
    if not stat.S_ISDIR(root.stat(base).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), base)
    segs = [s for s in pattern.split("/") if s not in ("", ".")]
    prefix: list[str] = []
    for seg in segs:
        if seg == "**" or WILDCARDS & set(seg):
            break
        prefix.append(seg)
    rest = segs[len(prefix) :]
    start = posixpath.join(base, *prefix)
    if not rest:  # nothing to expand: the pattern names one path
        try:
            entry = entry_of(root, start)
        except (FileNotFoundError, NotADirectoryError):
            return Found([], truncated=False)
        keep = kind is None or entry.type == kind
        return Found([("/".join(prefix), entry)] if keep else [], truncated=False)
    rx = glob_regex(pattern, hidden)
    depth = None if "**" in rest else len(rest)
    see_hidden = hidden or any(s.startswith(".") for s in rest)
    out: list[tuple[str, Entry]] = []
    items = walk(root, start, depth=depth, hidden=see_hidden, budget=budget)
    try:
        with contextlib.closing(items):
            for key, item, fd in items:
                rel = "/".join((*prefix, *key))
                if not rx.fullmatch(rel):
                    continue
                hit = entry_of_walked(start, key, item, fd)
                if hit is None or (kind is not None and hit.type != kind):
                    continue
                if len(out) >= limit:
                    return Found(out, truncated=True)
                out.append((rel, hit))
    except (FileNotFoundError, NotADirectoryError):
        pass  # only the walk's start raises here: a literal prefix that is missing matches nothing
    return Found(out, truncated=budget.exhausted)
