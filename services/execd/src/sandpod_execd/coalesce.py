"""The coalescing window between raw inotify events and a watch's event log.

Raw events arrive in bursts (an editor's save is create + several modifies + attrib). Each event
goes into a pending list; the first one arms a timer of ``window`` seconds, and when it fires the
whole list goes to the sink in order. Inside the window an event merges into the last pending event
for the same path when they say the same thing (modify after modify, attrib after attrib, or either
after a create: "created with this content"), so N writes become one ``modify`` with ``count`` N.
Merging only with the *last* event for a path keeps the order of what happened to that path.

Renames: inotify reports ``IN_MOVED_FROM`` and ``IN_MOVED_TO`` as two events sharing a cookie.
The from-half is put in the list at once as a placeholder (so it keeps its place in the order);
the to-half fills it in, giving one ``move`` with both paths. A placeholder still alone when the
list is flushed (at least ``MOVE_PAIR_WAIT`` after it arrived) moved out of the watch and becomes
a ``delete``. The list is bounded: at ``max_pending`` events it is flushed at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

__all__ = ["MOVE_PAIR_WAIT", "Coalescer", "Event"]

MOVE_PAIR_WAIT = 0.02  # seconds a lone IN_MOVED_FROM waits for its IN_MOVED_TO


@dataclasses.dataclass(slots=True)
class Event:
    """One change, in the watch's terms (paths relative to the watched root; "" is the root)."""

    type: str  # create, modify, delete, move, attrib, overflow
    rel: str
    is_dir: bool
    time: float  # wall clock of the last merged raw event
    old_rel: str | None = None  # move: where it came from
    count: int = 1  # raw events merged; overflow: events lost (0: unknown)
    reason: str | None = None  # overflow: queue, kernel, limit
    seq: int = -1  # cursor, set when the event enters the log
    cookie: int = 0  # non-zero while a move placeholder waits for its other half
    since: float = 0.0  # monotonic arrival of a move placeholder


def _merges(prev: Event, new: Event) -> bool:
    if prev.cookie or new.type not in ("modify", "attrib", "create"):
        return False
    return prev.type == new.type or (prev.type == "create" and new.type != "create")


class Coalescer:
    def __init__(
        self,
        sink: Callable[[Event], None],
        *,
        window: float,
        max_pending: int,
        on_moved_out: Callable[[str, bool], None],
    ) -> None:
        self._sink = sink
        self._window = window
        self._max_pending = max(max_pending, 1)
        self._on_moved_out = on_moved_out
        self._loop = asyncio.get_running_loop()
        self._pending: list[Event] = []
        self._last: dict[str, Event] = {}  # path -> the last pending event about it
        self._moves: dict[int, Event] = {}  # cookie -> placeholder
        self._timer: asyncio.TimerHandle | None = None

    def add(self, ev: Event) -> None:
        """Queue ``ev``, merging it into the last pending event of its path when they agree."""
        prev = self._last.get(ev.rel)
        if self._window > 0 and prev is not None and _merges(prev, ev):
            prev.count += ev.count
            prev.time = ev.time
            return
        self._push(ev)

    def move_from(self, cookie: int, rel: str, is_dir: bool, when: float) -> None:
        """The first half of a rename: hold its place until the second half arrives."""
        ev = Event("move", "", is_dir, when, old_rel=rel, cookie=cookie, since=time.monotonic())
        self._moves[cookie] = ev
        self._last[rel] = ev  # later events about the old path come after the move
        self._push(ev)

    def move_to(self, cookie: int, rel: str, when: float) -> str | None:
        """The second half of a rename: complete the move; the old path, or None if unpaired."""
        ev = self._moves.pop(cookie, None)
        if ev is None:
            return None
        ev.rel, ev.cookie, ev.time = rel, 0, when
        self._last[rel] = ev
        return ev.old_rel

    def _push(self, ev: Event) -> None:
        self._pending.append(ev)
        if not ev.cookie:
            self._last[ev.rel] = ev
        if len(self._pending) >= self._max_pending:
            self.flush(force=True)
        else:
            self._arm(self._window)

    def _arm(self, delay: float) -> None:
        if self._timer is None:
            self._timer = self._loop.call_later(delay, self.flush)

    def flush(self, force: bool = False) -> None:
        """Hand pending events to the sink in order, up to a move still waiting for its pair."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.monotonic()
        ready = 0
        for ev in self._pending:
            if ev.cookie:
                if not force and now - ev.since < MOVE_PAIR_WAIT:
                    break
                # Moved out of the watch (or into an excluded path): gone, from our view.
                del self._moves[ev.cookie]
                ev.type, ev.rel, ev.old_rel, ev.cookie = "delete", ev.old_rel or "", None, 0
                self._on_moved_out(ev.rel, ev.is_dir)
            ready += 1
        out, self._pending = self._pending[:ready], self._pending[ready:]
        self._last = {}
        for ev in self._pending:
            self._last[ev.old_rel if ev.cookie and ev.old_rel is not None else ev.rel] = ev
        for ev in out:
            self._sink(ev)
        if self._pending:
            self._arm(MOVE_PAIR_WAIT)

    def close(self, flush: bool) -> None:
        """Stop the timer; with ``flush``, hand over what is pending first."""
        if flush:
            self.flush(force=True)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
        self._last.clear()
        self._moves.clear()
