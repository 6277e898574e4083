"""One file watch: an inotify fd on the event loop, a tree of watched directories, and the log
clients poll.

Data flow: the kernel queues raw events on the watch's own inotify fd; the loop calls
:meth:`Watcher._on_readable` (``add_reader``, no thread), which maps each event's watch descriptor
back to a path relative to the watched root, drops excluded paths, and feeds the
:class:`~sandpod_execd.coalesce.Coalescer`. When its window closes, events pass the include and
type filters, get the next cursor and enter a bounded :class:`~sandpod_execd.cursorlog.EventLog`,
which ``watch.poll`` reads by cursor.

Recursion: every directory under the root gets its own inotify watch. A directory that appears
later (created, or moved in) is watched at once and then scanned, and everything found inside is
reported as created, since it may have been made before the watch caught up. A directory renamed
inside the tree keeps its watches (only the path map changes); one moved out loses them.

Bounds: ``queue`` events kept in the log (older ones are evicted and readers told ``skipped``),
``max_dirs`` directories per watch, and the kernel's own limits (``fs.inotify.max_user_watches``:
ENOSPC, ``max_queued_events``: ``IN_Q_OVERFLOW``). Each lost event is reported, never silent: an
``overflow`` event with reason ``kernel`` or ``limit``; eviction shows as ``skipped`` to readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time

import structlog

from sandpod_execd import inotify
from sandpod_execd.coalesce import Coalescer, Event
from sandpod_execd.cursorlog import EventLog
from sandpod_execd.files.rooted import (
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    Root,
    host_root,
    openat2,
    openat2_available,
)
from sandpod_execd.pathglob import GlobSet

__all__ = ["WatchCapacity", "Watcher"]

log = structlog.get_logger("sandpod.execd.watch")

WALK_YIELD = 256  # directories added between yields to the loop during the first walk
_MASK = inotify.ALL_EVENTS & ~inotify.IN_DONT_FOLLOW
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP, errno.EPERM)


class WatchCapacity(Exception):
    """The kernel's or our own watch limit was reached while setting the watch up."""

    def __init__(self, message: str, dirs: int) -> None:
        super().__init__(message)
        self.dirs = dirs


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


class Watcher:
    """Watches ``root`` (a directory, or a single file; a path in ``fs_root``, by default the
    host's ``/``) until :meth:`close`.

    ``root`` is resolved in ``fs_root`` (a jailed sandbox's own root: links resolve as the
    sandbox sees them) whenever a directory is added or listed; directories below it are reached
    from that descriptor with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` and watched and
    listed through their own descriptors (``/proc/self/fd/<fd>``), so a sandbox process swapping
    one for a link to the host cannot make execd watch or list a host directory. No descriptor
    is held between calls: one held on the root would delay its ``IN_DELETE_SELF``. Every
    open, listing and ``inotify_add_watch`` runs with the sandbox user's rights
    (``fs_root.acting()``): a directory that user cannot read cannot be watched.
    """

    def __init__(
        self,
        watch_id: str,
        root: str,
        *,
        recursive: bool,
        include: GlobSet,
        exclude: GlobSet,
        types: frozenset[str],
        window: float,
        queue: int,
        max_dirs: int,
        fs_root: Root | None = None,
    ) -> None:
        self.watch_id = watch_id
        self.fs_root = fs_root if fs_root is not None else host_root()
        self.root = root if self.fs_root.jailed else os.path.realpath(root)
        self.recursive = recursive
        self.include = include
        self.exclude = exclude
        self.types = types
        self.window = window
        self.max_dirs = max_dirs
        self.log: EventLog[Event] = EventLog(queue)
        self.created = time.time()
        self.last_poll = time.monotonic()
        self.read_upto = 0  # highest cursor a reader was given: evicting below it loses nothing
        self.dropped = 0  # events evicted before any reader saw them
        self.is_dir = False
        self.closed = False
        self._fd = -1
        self._wds: dict[int, str] = {}  # watch descriptor -> directory relative to the root
        self._rels: dict[str, int] = {}
        self._co = Coalescer(
            self._sink, window=window, max_pending=queue, on_moved_out=self._moved_out
        )

    @property
    def dirs(self) -> int:
        return len(self._wds)

    # -- set-up and tear-down --------------------------------------------------------------------

    async def start(self) -> None:
        """Watch the root (and, if recursive, every directory below it).

        Raises:
            OSError: the root is missing or unreadable (ENOENT, EACCES...), or EMFILE (too many
                inotify instances).
            WatchCapacity: ENOSPC from the kernel or more than ``max_dirs`` directories.
        """
        with self.fs_root.acting():
            self.is_dir = stat.S_ISDIR(self.fs_root.stat(self.root).st_mode)
        self._fd = inotify.init()
        try:
            self._add("")
            asyncio.get_running_loop().add_reader(self._fd, self._on_readable)
            if self.is_dir and self.recursive:
                await self._first_walk()
        except OSError as exc:
            self.close()
            if exc.errno == errno.ENOSPC:
                raise WatchCapacity(
                    "the kernel's inotify watch limit (fs.inotify.max_user_watches) is reached",
                    self.dirs,
                ) from exc
            raise
        except BaseException:
            self.close()
            raise

    async def _first_walk(self) -> None:
        pending = [""]
        added = 0
        while pending:
            rel = pending.pop()
            for child in self._subdirs(rel):
                if self.closed:
                    return
                if len(self._wds) >= self.max_dirs:
                    raise WatchCapacity(
                        f"more than {self.max_dirs} directories under the watched path; watch a "
                        "smaller tree or exclude some (e.g. node_modules)",
                        self.dirs,
                    )
                with contextlib.suppress(FileNotFoundError, NotADirectoryError, PermissionError):
                    self._add(child)
                    pending.append(child)
                added += 1
                if added % WALK_YIELD == 0:
                    await asyncio.sleep(0)  # let other requests (and this watch's events) run

    def _open(self, rel: str, flags: int) -> int:
        """A descriptor of ``rel`` below the root: a real directory reached without following
        any link (ELOOP if one is in the way now), or the root itself for ``""``."""
        if not rel:
            return self.fs_root.open(self.root, flags)
        top = self.fs_root.open(self.root, os.O_PATH | os.O_DIRECTORY)
        try:
            if not openat2_available():  # only without a jail (a jailed root refused above)
                return os.open(rel, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
            resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
            return openat2(top, rel, flags | os.O_DIRECTORY, 0, resolve)
        finally:
            os.close(top)

    def _entries(self, rel: str) -> list[tuple[str, bool]]:
        """``(name, is a directory)`` of each child of ``rel``. Raises ``OSError``."""
        with self.fs_root.acting():
            fd = self._open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
            try:
                with os.scandir(fd) as it:
                    return [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            finally:
                os.close(fd)

    def _subdirs(self, rel: str) -> list[str]:
        try:
            entries = self._entries(rel)
        except OSError:
            return []
        return [
            child
            for name, is_dir in entries
            if is_dir and not self.exclude.matches(child := _join(rel, name))
        ]

    def _add(self, rel: str) -> None:
        with self.fs_root.acting():  # the kernel checks the user may read what it watches
            fd = self._open(rel, os.O_PATH)
            try:
                # Following this magic link is the point (it names fd's object and nothing
                # else); IN_DONT_FOLLOW would watch the /proc link itself.
                wd = inotify.add_watch(self._fd, f"/proc/self/fd/{fd}", _MASK)
            finally:
                os.close(fd)
        old = self._wds.get(wd)
        if old is not None and self._rels.get(old) == wd:
            del self._rels[old]
        self._wds[wd] = rel
        self._rels[rel] = wd

    def close(self, flush: bool = False) -> None:
        """Stop watching; ``flush`` hands pending events to the log first. Idempotent."""
        if self._fd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)  # drops every watch descriptor with it
            self._fd = -1
        if not self.closed:
            self._co.close(flush=flush)
            self.closed = True
            self.log.close()
        self._wds.clear()
        self._rels.clear()

    # -- events in ------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            raw_events = inotify.read_events(self._fd)
        except OSError as exc:  # the fd broke: end the watch rather than spin
            log.warning("watch_read_failed", watch_id=self.watch_id, error=str(exc))
            self._co.add(Event("overflow", "", self.is_dir, time.time(), count=0, reason="kernel"))
            self.close(flush=True)
            return
        for raw in raw_events:
            if self.closed:
                return
            self._handle(raw)

    def _handle(self, raw: inotify.RawEvent) -> None:
        now = time.time()
        mask = raw.mask
        if mask & inotify.IN_Q_OVERFLOW:
            self._co.add(Event("overflow", "", self.is_dir, now, count=0, reason="kernel"))
            if self.is_dir and self.recursive:  # directories made meanwhile need their watches
                self._add_tree("", emit=False)
            return
        parent = self._wds.get(raw.wd)
        if mask & inotify.IN_IGNORED:
            if parent is not None:
                self._forget(raw.wd)
            if parent == "":
                self._root_gone(now)
        elif parent is None:
            return  # a descriptor we already dropped
        elif raw.name:
            self._child(_join(parent, os.fsdecode(raw.name)), raw, now)
        elif parent == "":  # about the root itself (for subdirectories their parent reports it)
            if mask & (inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
                self._root_gone(now)
            elif mask & (inotify.IN_MODIFY | inotify.IN_ATTRIB):
                kind = "modify" if mask & inotify.IN_MODIFY else "attrib"
                self._co.add(Event(kind, "", self.is_dir, now))

    def _child(self, rel: str, raw: inotify.RawEvent, now: float) -> None:
        mask = raw.mask
        is_dir = bool(mask & inotify.IN_ISDIR)
        if mask & inotify.IN_MOVED_TO:
            self._moved_in(raw.cookie, rel, is_dir, now)
            return
        if self.exclude.matches(rel):
            return
        if mask & inotify.IN_MOVED_FROM:
            self._co.move_from(raw.cookie, rel, is_dir, now)
        elif mask & inotify.IN_CREATE:
            self._co.add(Event("create", rel, is_dir, now))
            if is_dir and self.recursive:
                self._add_tree(rel, emit=True)
        elif mask & inotify.IN_DELETE:
            self._co.add(Event("delete", rel, is_dir, now))
        elif mask & inotify.IN_MODIFY:
            self._co.add(Event("modify", rel, is_dir, now))
        elif mask & inotify.IN_ATTRIB:
            self._co.add(Event("attrib", rel, is_dir, now))

    def _moved_in(self, cookie: int, rel: str, is_dir: bool, now: float) -> None:
        if self.exclude.matches(rel):
            return  # a lone from-half (if any) becomes a delete when flushed
        old = self._co.move_to(cookie, rel, now)
        if old is not None:
            if is_dir:
                self._rename(old, rel)
            return
        self._co.add(Event("create", rel, is_dir, now))
        if is_dir and self.recursive:
            self._add_tree(rel, emit=True)

    def _add_tree(self, top: str, *, emit: bool) -> None:
        """Watch ``top`` and every directory below it; with ``emit``, report what is inside."""
        stack = [top]
        unwatched, first = 0, None
        while stack:
            rel = stack.pop()
            if rel not in self._rels:
                if len(self._wds) >= self.max_dirs:
                    unwatched, first = unwatched + 1, first if first is not None else rel
                    continue
                try:
                    self._add(rel)
                except OSError as exc:
                    if exc.errno not in _GONE:  # ENOSPC: the kernel's limit
                        unwatched, first = unwatched + 1, first if first is not None else rel
                    continue
            try:
                entries = self._entries(rel)
            except OSError:
                continue
            now = time.time()
            for name, child_is_dir in entries:
                child = _join(rel, name)
                if self.exclude.matches(child):
                    continue
                if emit:
                    self._co.add(Event("create", child, child_is_dir, now))
                if child_is_dir:
                    stack.append(child)
        if unwatched:
            log.warning("watch_dirs_unwatched", watch_id=self.watch_id, count=unwatched)
            self._co.add(
                Event("overflow", first or "", True, time.time(), count=unwatched, reason="limit")
            )

    def _rename(self, old: str, new: str) -> None:
        for rel, wd in [
            (r, w) for r, w in self._rels.items() if r == old or r.startswith(old + "/")
        ]:
            moved = new + rel[len(old) :]
            del self._rels[rel]
            self._rels[moved] = wd
            self._wds[wd] = moved

    def _moved_out(self, rel: str, is_dir: bool) -> None:
        if not is_dir or self._fd < 0:
            return
        for sub, wd in [
            (r, w) for r, w in self._rels.items() if r == rel or r.startswith(rel + "/")
        ]:
            with contextlib.suppress(OSError):
                inotify.rm_watch(self._fd, wd)
            self._forget(wd)
            self._rels.pop(sub, None)

    def _forget(self, wd: int) -> None:
        rel = self._wds.pop(wd, None)
        if rel is not None and self._rels.get(rel) == wd:
            del self._rels[rel]

    def _root_gone(self, now: float) -> None:
        if self.closed:
            return
        self._co.add(Event("delete", "", self.is_dir, now))
        self.close(flush=True)

    # -- events out -----------------------------------------------------------------------------

    def _sink(self, ev: Event) -> None:
        if ev.type != "overflow":
            if self.types and ev.type not in self.types:
                return
            if (
                self.include
                and ev.rel
                and not (
                    self.include.matches(ev.rel)
                    or (ev.old_rel and self.include.matches(ev.old_rel))
                )
            ):
                return
        full = self.log.total - self.log.start >= self.log.capacity
        if full and self.log.start >= self.read_upto:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("watch_queue_overflow", watch_id=self.watch_id, dropped=self.dropped)
        ev.seq = self.log.total
        self.log.append(ev)
