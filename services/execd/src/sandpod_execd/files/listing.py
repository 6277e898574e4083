"""Walking directory trees: listings in pages, and glob patterns with ``**``.

The walk is depth-first with each directory's children sorted by name, so walk order equals the
order of relative paths compared component by component. That makes a page cursor cheap and
stateless: it is the relative path of the last entry returned, and the next page skips every
subtree that sorts before it. Symlinks are listed, never descended into, so loops cannot trap a
walk. Everything is bounded: entries read per directory, entries visited and wall time
(:class:`Budget`); when a bound cuts a walk short the result says ``truncated``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import threading
import time
from collections.abc import Iterator

from sandpod_execd.files.entries import Entry, EntryType, entry_of

__all__ = ["Budget", "Found", "glob", "glob_regex", "list_dir", "split_pattern", "walk"]

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


def _children(path: str, budget: Budget) -> list[os.DirEntry[str]]:
    out: list[os.DirEntry[str]] = []
    with os.scandir(path) as it:
        for item in it:
            if len(out) >= MAX_DIR_ENTRIES:
                budget.exhausted = True  # the listing of this directory is incomplete
                break
            out.append(item)
    out.sort(key=lambda e: e.name)
    return out


def walk(
    root: str,
    *,
    depth: int | None,
    hidden: bool,
    budget: Budget,
    after: tuple[str, ...] | None = None,
) -> Iterator[tuple[tuple[str, ...], os.DirEntry[str]]]:
    """Yield ``(relative path components, entry)`` below ``root`` in walk order.

    ``depth`` levels (None: unlimited, up to MAX_DEPTH); entries up to and including ``after``
    are skipped. An unreadable root raises ``OSError``; unreadable subdirectories are skipped.
    """
    levels = min(depth or MAX_DEPTH, MAX_DEPTH)
    yield from _walk(root, (), levels=levels, hidden=hidden, budget=budget, after=after)


def _walk(
    path: str,
    rel: tuple[str, ...],
    *,
    levels: int,
    hidden: bool,
    budget: Budget,
    after: tuple[str, ...] | None,
) -> Iterator[tuple[tuple[str, ...], os.DirEntry[str]]]:
    try:
        children = _children(path, budget)
    except OSError:
        if not rel:
            raise
        return  # a subdirectory we may not read: list it, skip its content
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
            yield key, child
        if levels > 1 and _is_dir(child):
            yield from _walk(
                child.path, key, levels=levels - 1, hidden=hidden, budget=budget, after=after
            )
            if budget.exhausted:
                return


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _entry(item: os.DirEntry[str]) -> Entry | None:
    try:
        return entry_of(item.path, st=item.stat(follow_symlinks=False))
    except OSError:
        return None  # removed while we walked


def list_dir(
    root: str, *, depth: int, hidden: bool, limit: int, cursor: str | None, budget: Budget
) -> Found:
    """Up to ``limit`` entries below directory ``root`` after ``cursor``. Raises ``OSError``."""
    after = tuple(cursor.split("/")) if cursor else None
    out: list[tuple[str, Entry]] = []
    items = walk(root, depth=depth, hidden=hidden, budget=budget, after=after)
    for key, item in items:
        if len(out) >= limit:
            return Found(out, truncated=True, cursor=out[-1][0])
        if (entry := _entry(item)) is not None:
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
    root: str, pattern: str, *, hidden: bool, kind: EntryType | None, limit: int, budget: Budget
) -> Found:
    """Entries below ``root`` whose relative path matches ``pattern``. Raises ``OSError``."""
    if not stat.S_ISDIR(os.stat(root).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), root)
    segs = [s for s in pattern.split("/") if s not in ("", ".")]
    prefix: list[str] = []
    for seg in segs:
        if seg == "**" or WILDCARDS & set(seg):
            break
        prefix.append(seg)
    rest = segs[len(prefix) :]
    start = os.path.join(root, *prefix)
    if not rest:  # nothing to expand: the pattern names one path
        try:
            entry = entry_of(start)
        except (FileNotFoundError, NotADirectoryError):
            return Found([], truncated=False)
        keep = kind is None or entry.type == kind
        return Found([("/".join(prefix), entry)] if keep else [], truncated=False)
    rx = glob_regex(pattern, hidden)
    depth = None if "**" in rest else len(rest)
    see_hidden = hidden or any(s.startswith(".") for s in rest)
    out: list[tuple[str, Entry]] = []
    try:
        for rel, item in _glob_walk(start, prefix, depth, see_hidden, budget):
            if not rx.fullmatch(rel):
                continue
            hit = _entry(item)
            if hit is None or (kind is not None and hit.type != kind):
                continue
            if len(out) >= limit:
                return Found(out, truncated=True)
            out.append((rel, hit))
    except (FileNotFoundError, NotADirectoryError):
        pass  # only the walk's start raises here: a literal prefix that is missing matches nothing
    return Found(out, truncated=budget.exhausted)


def _glob_walk(
    start: str, prefix: list[str], depth: int | None, hidden: bool, budget: Budget
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    for key, item in walk(start, depth=depth, hidden=hidden, budget=budget):
        yield "/".join((*prefix, *key)), item
