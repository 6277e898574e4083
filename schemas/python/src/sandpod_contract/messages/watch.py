"""``watch`` family: inotify-based file watching with cursors and explicit overflow.

``watch.start`` creates a watch on a file or directory (recursive by default, with include and
exclude globs) and replies :class:`WatchInfo`. execd coalesces raw filesystem events for a short
window, numbers them with an ever-growing cursor and keeps the last ``queue`` of them. Clients pull:
``watch.poll {watch_id, cursor, wait}`` answers as soon as there are events at or after ``cursor``
(or after ``wait`` seconds with none), so a client that went away asks "what changed since cursor
X" with the cursor it last saw. Nothing is dropped silently: events evicted before a client read
them, and the kernel's own queue overflow, come back as an ``overflow`` event.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sandpod_contract.codec import Message
from sandpod_contract.messages.common import Empty, check_text
from sandpod_contract.operations import Operation

__all__ = [
    "FRAMES",
    "MAX_GLOBS",
    "OPERATIONS",
    "OverflowReason",
    "WatchEvent",
    "WatchEventType",
    "WatchEvents",
    "WatchInfo",
    "WatchList",
    "WatchPoll",
    "WatchRef",
    "WatchStart",
]

WatchEventType = Literal["create", "modify", "delete", "move", "attrib", "overflow"]
OverflowReason = Literal["queue", "kernel", "limit"]
MAX_GLOBS = 64  # include/exclude patterns per watch
MAX_COALESCE = 10.0  # seconds


def _check_globs(name: str, globs: tuple[str, ...]) -> None:
    if len(globs) > MAX_GLOBS:
        raise ValueError(f"{name}: at most {MAX_GLOBS} patterns")
    if any(not g for g in globs):
        raise ValueError(f"{name}: patterns must be non-empty")
    check_text(name, globs)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchStart(Message):
    """``watch.start``: watch a file or directory for changes."""

    TYPE = "watch.start"
    path: str  # file or directory; /workspace and relative paths resolve into the workspace
    recursive: bool = True  # also watch subdirectories, including ones created later
    include: tuple[str, ...] = ()  # globs relative to path (** spans dirs): report only these
    exclude: tuple[str, ...] = ()  # globs: never report, and never watch, matching paths
    events: tuple[WatchEventType, ...] = ()  # report only these types (empty: all); overflow always
    coalesce: float | None = None  # seconds one path's events may be merged (default 0.05; 0: off)
    queue: int | None = None  # events kept for polling (default 4096, at most 16384)
    idle_timeout: float | None = None  # stop the watch after this long without a poll (default 600)

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path must be non-empty")
        check_text("path", [self.path])
        _check_globs("include", self.include)
        _check_globs("exclude", self.exclude)
        if self.coalesce is not None and not 0 <= self.coalesce <= MAX_COALESCE:
            raise ValueError(f"coalesce must be 0..{MAX_COALESCE:g} seconds")
        if self.queue is not None and self.queue < 1:
            raise ValueError("queue must be >= 1")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError("idle_timeout must be > 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchInfo(Message):
    """Reply to ``watch.start`` and ``watch.stop``; one entry of ``watch.list``."""

    TYPE = "watch.info"
    watch_id: str
    path: str  # the watched path as clients see it (/workspace/... inside the workspace)
    state: Literal["active", "closed"]  # closed: the watched path was removed or the watch stopped
    recursive: bool = True
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    events: tuple[WatchEventType, ...] = ()
    coalesce: float = 0.05  # the window execd applies
    queue: int = 4096  # the bound execd applies
    idle_timeout: float = 600.0
    dirs: int = 0  # directories (or the one file) under inotify watch
    next_cursor: int = 0  # cursor of the next event; poll from here to see only new ones
    created: float = 0.0  # wall clock


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchPoll(Message):
    """``watch.poll``: events with cursor >= ``cursor``; waits up to ``wait`` seconds for one."""

    TYPE = "watch.poll"
    watch_id: str
    cursor: int  # the next_cursor of the previous reply (0, or WatchInfo.next_cursor, at first)
    max_events: int | None = None  # default 256, at most 4096 (also cut to fit one message)
    wait: float | None = None  # seconds to wait for news (default 0: answer at once; max 60)

    def __post_init__(self) -> None:
        if self.cursor < 0:
            raise ValueError("cursor must be >= 0")
        if self.max_events is not None and self.max_events < 1:
            raise ValueError("max_events must be >= 1")
        if self.wait is not None and self.wait < 0:
            raise ValueError("wait must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvent(Message):
    """One (coalesced) change.

    ``move`` carries both paths (``old_path`` -> ``path``) when both ends are inside the watch; a
    file moved out is reported as ``delete``, one moved in as ``create``. ``overflow`` means events
    were lost (``reason``: ``queue`` = evicted before this client read them, ``kernel`` = the
    kernel's queue overflowed, ``limit`` = a directory could not be watched; its ``path``): rescan.
    """

    TYPE = "watch.event"
    seq: int  # this event's cursor (synthesized overflow events repeat the reply's cursor)
    type: WatchEventType
    path: str  # as clients see it; for overflow, the watch root or the directory not watched
    old_path: str | None = None  # move: where it was
    is_dir: bool = False
    time: float = 0.0  # wall clock of the (last merged) change
    count: int = 1  # raw events merged into this one; overflow: events lost (0: unknown)
    reason: OverflowReason | None = None  # overflow only


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvents(Message):
    """Reply to ``watch.poll``.

    ``skipped`` > 0 means events between the requested cursor and ``cursor`` were evicted before
    this client read them; the reply then starts with an ``overflow`` event saying so.
    """

    TYPE = "watch.events"
    watch_id: str
    events: tuple[WatchEvent, ...] = ()
    cursor: int = 0  # where this reply starts (> the requested cursor when events were evicted)
    next_cursor: int = 0  # pass this as ``cursor`` next time
    skipped: int = 0  # events evicted between the requested cursor and ``cursor``
    closed: bool = False  # the watch ended and nothing is left after next_cursor


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchRef(Message):
    """``watch.stop``: names one watch."""

    TYPE = "watch.ref"
    watch_id: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchList(Message):
    """Reply to ``watch.list``: this sandbox's watches."""

    TYPE = "watch.list"
    watches: tuple[WatchInfo, ...] = ()
    limit: int = 0  # most watches one sandbox may hold (more: watch.limit)


OPERATIONS: tuple[Operation, ...] = (
    Operation("watch", "start", WatchStart, WatchInfo, "watch a path (recursive, globs)"),
    Operation("watch", "poll", WatchPoll, WatchEvents, "events since a cursor (long-poll)"),
    Operation("watch", "stop", WatchRef, WatchInfo, "stop a watch and forget its events"),
    Operation("watch", "list", Empty, WatchList, "this sandbox's watches"),
)
FRAMES: tuple[type[Message], ...] = ()
