"""``watch`` family: start, poll (long-poll by cursor), stop and list file watches.

Each watch is a :class:`~sandpod_execd.watching.Watcher` owned by this class, per sandbox, at most
``MAX_WATCHES`` per sandbox. Watches hold no task: their fd is on the loop and their idle expiry is
a loop timer, rearmed while clients keep polling. ``close()`` stops them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import time
import uuid
from typing import cast

from sandpod_contract.errors import (
    FsInvalidPath,
    FsNotFound,
    FsPermissionDenied,
    WatchError,
    WatchLimit,
    WatchNotFound,
)
from sandpod_contract.messages.common import Empty
from sandpod_contract.messages.watch import (
    OverflowReason,
    WatchEvent,
    WatchEvents,
    WatchEventType,
    WatchInfo,
    WatchList,
    WatchPoll,
    WatchRef,
    WatchStart,
)
from sandpod_execd.clientpath import client_path
from sandpod_execd.coalesce import Event
from sandpod_execd.handlers import Deps, Route
from sandpod_execd.pathglob import GlobSet
from sandpod_execd.sandbox import SandboxContext
from sandpod_execd.watching import WatchCapacity, Watcher

__all__ = ["WatchHandlers"]

MAX_WATCHES = 32  # per sandbox (each holds one inotify instance; the kernel allows 128 per user)
MAX_DIRS = 8192  # directories under one watch (each costs the kernel ~1 KiB)
DEFAULT_QUEUE, MAX_QUEUE = 4096, 16384  # events kept per watch
DEFAULT_COALESCE = 0.05  # seconds
DEFAULT_IDLE = 600.0  # seconds without a poll before a watch is stopped
DEFAULT_MAX_EVENTS, MAX_EVENTS = 256, 4096  # per poll reply
MAX_WAIT = 60.0  # longest long-poll
EVENT_OVERHEAD = 96  # bytes of a wire event besides its paths
REPLY_OVERHEAD = 4096  # room for the reply's other fields


def _text(path: str) -> str:
    """Names that are not UTF-8 (kept as surrogates internally) shown with U+FFFD."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclasses.dataclass(slots=True)
class _Entry:
    watcher: Watcher
    display: str  # the root as clients see it
    events: tuple[WatchEventType, ...]
    idle: float
    timer: asyncio.TimerHandle | None = None
    polling: int = 0  # polls waiting right now (a long poll is not idleness)

    def path(self, rel: str) -> str:
        if not rel:
            return _text(self.display)
        return _text(f"{self.display.rstrip('/')}/{rel}")


class WatchHandlers:
    def __init__(self, deps: Deps) -> None:
        self._budget = max(deps.max_payload - REPLY_OVERHEAD, 4096)
        self._by_sandbox: dict[str, dict[str, _Entry]] = {}

    def routes(self) -> dict[tuple[str, str], Route]:
        return {
            ("watch", "start"): Route(self.start),
            # A parked poll is a passive observer: a forgotten `sandpod watch` must not keep an
            # idle sandbox alive (as for pty.read). start and stop are real activity.
            ("watch", "poll"): Route(self.poll, activity=False),
            ("watch", "stop"): Route(self.stop, inline=True),
            ("watch", "list"): Route(self.list, inline=True, activity=False),
        }

    async def close(self) -> None:
        """Stop every watch (wakes their pollers, which answer ``closed``)."""
        for entries in self._by_sandbox.values():
            for entry in entries.values():
                self._drop(entry)
            entries.clear()

    # -- verbs ------------------------------------------------------------------------------------

    async def start(self, sbx: SandboxContext, req: WatchStart) -> WatchInfo:
        entries = self._by_sandbox.setdefault(sbx.sandbox_id, {})
        if len(entries) >= MAX_WATCHES:
            raise WatchLimit(
                f"{len(entries)} watches open (limit {MAX_WATCHES}); stop one first",
                limit=MAX_WATCHES,
            )
        try:
            include, exclude = GlobSet(req.include), GlobSet(req.exclude)
        except ValueError as exc:
            raise WatchError(str(exc)) from exc
        # In a jail: the path inside it, resolved in the jail's root by the watcher itself.
        host = sbx.jail.inside(req.path) if sbx.jail is not None else sbx.resolve_cwd(req.path)
        watch_id = uuid.uuid4().hex[:16]
        watcher = Watcher(
            watch_id,
            host,
            recursive=req.recursive,
            include=include,
            exclude=exclude,
            types=frozenset(req.events),
            window=DEFAULT_COALESCE if req.coalesce is None else req.coalesce,
            queue=min(req.queue or DEFAULT_QUEUE, MAX_QUEUE),
            max_dirs=MAX_DIRS,
            fs_root=sbx.fs_root,
        )
        entry = _Entry(
            watcher,
            client_path(sbx.workspace, host),
            tuple(req.events),
            req.idle_timeout or DEFAULT_IDLE,
        )
        entries[watch_id] = entry  # holds the slot while the first walk yields
        try:
            await watcher.start()
        except BaseException as exc:
            entries.pop(watch_id, None)
            watcher.close()
            if isinstance(exc, Exception) and (mapped := _start_error(exc, req.path)) is not exc:
                raise mapped from exc
            raise
        self._arm(sbx.sandbox_id, entry, entry.idle)
        return self._info(entry)

    async def poll(self, sbx: SandboxContext, req: WatchPoll) -> WatchEvents:
        entry = self._get(sbx, req.watch_id)
        watcher = entry.watcher
        wait = min(req.wait or 0.0, MAX_WAIT)
        entry.polling += 1
        try:
            read = await watcher.log.read_wait(
                req.cursor, min(req.max_events or DEFAULT_MAX_EVENTS, MAX_EVENTS), wait
            )
        finally:
            entry.polling -= 1
            watcher.last_poll = time.monotonic()
        out: list[WatchEvent] = []
        if read.skipped:
            out.append(
                WatchEvent(
                    seq=read.cursor,
                    type="overflow",
                    path=entry.path(""),
                    is_dir=watcher.is_dir,
                    time=time.time(),
                    count=read.skipped,
                    reason="queue",
                )
            )
        size = 0
        for ev in read.events:
            wire = _wire(entry, ev)
            size += EVENT_OVERHEAD + len(wire.path) * 4 + len(wire.old_path or "") * 4
            if size > self._budget and len(out) > bool(read.skipped):
                break
            out.append(wire)
        taken = len(out) - bool(read.skipped)
        next_cursor = read.cursor + taken
        watcher.read_upto = max(watcher.read_upto, next_cursor)
        return WatchEvents(
            watch_id=req.watch_id,
            events=tuple(out),
            cursor=read.cursor,
            next_cursor=next_cursor,
            skipped=read.skipped,
            closed=watcher.closed and next_cursor >= watcher.log.total,
        )

    async def stop(self, sbx: SandboxContext, req: WatchRef) -> WatchInfo:
        entry = self._get(sbx, req.watch_id)
        self._by_sandbox[sbx.sandbox_id].pop(req.watch_id, None)
        self._drop(entry)
        return self._info(entry)

    async def list(self, sbx: SandboxContext, _: Empty) -> WatchList:
        entries = self._by_sandbox.get(sbx.sandbox_id, {})
        return WatchList(watches=tuple(self._info(e) for e in entries.values()), limit=MAX_WATCHES)

    # -- helpers ----------------------------------------------------------------------------------

    def _get(self, sbx: SandboxContext, watch_id: str) -> _Entry:
        entry = self._by_sandbox.get(sbx.sandbox_id, {}).get(watch_id)
        if entry is None:
            raise WatchNotFound(
                f"no watch {watch_id!r} in this sandbox (stopped, expired after its idle "
                "timeout, or execd restarted)",
                watch_id=watch_id,
            )
        return entry

    def _drop(self, entry: _Entry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        entry.watcher.close()

    def _arm(self, sandbox_id: str, entry: _Entry, delay: float) -> None:
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(delay, self._expire, sandbox_id, entry)

    def _expire(self, sandbox_id: str, entry: _Entry) -> None:
        """Idle timer: stop the watch unless a client polled within ``idle`` seconds."""
        entry.timer = None
        left = entry.idle - (time.monotonic() - entry.watcher.last_poll)
        if entry.polling or left > 0:
            self._arm(sandbox_id, entry, max(left, 1.0))
            return
        entries = self._by_sandbox.get(sandbox_id, {})
        if entries.get(entry.watcher.watch_id) is entry:
            del entries[entry.watcher.watch_id]
        self._drop(entry)

    def _info(self, entry: _Entry) -> WatchInfo:
        w = entry.watcher
        return WatchInfo(
            watch_id=w.watch_id,
            path=_text(entry.display),
            state="closed" if w.closed else "active",
            recursive=w.recursive,
            include=w.include.patterns,
            exclude=w.exclude.patterns,
            events=entry.events,
            coalesce=w.window,
            queue=w.log.capacity,
            idle_timeout=entry.idle,
            dirs=w.dirs,
            next_cursor=w.log.total,
            created=w.created,
        )


def _wire(entry: _Entry, ev: Event) -> WatchEvent:
    return WatchEvent(
        seq=ev.seq,
        type=cast(WatchEventType, ev.type),  # one of them by construction
        path=entry.path(ev.rel),
        old_path=entry.path(ev.old_rel) if ev.old_rel is not None else None,
        is_dir=ev.is_dir,
        time=ev.time,
        count=ev.count,
        reason=cast(OverflowReason | None, ev.reason),
    )


def _start_error(exc: Exception, path: str) -> Exception:  # noqa: PLR0911 - one per errno
    """Map what setting a watch up raised to the contract's typed errors."""
    if isinstance(exc, WatchCapacity):
        return WatchLimit(str(exc), limit=MAX_DIRS, dirs=exc.dirs)
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return FsNotFound(f"{path!r} does not exist", path=path)
    if isinstance(exc, PermissionError):
        return FsPermissionDenied(f"cannot watch {path!r}: permission denied", path=path)
    if isinstance(exc, OSError):
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return WatchLimit(
                "the kernel's inotify instance limit (fs.inotify.max_user_instances) is reached",
                reason="inotify_instances",
            )
        if exc.errno == errno.ENAMETOOLONG:
            return FsInvalidPath(f"path too long: {path[:64]!r}...", path=path[:256])
        return WatchError(f"cannot watch {path!r}: {exc.strerror}", path=path, errno=exc.errno)
    return exc
