"""Bounded logs readable by cursor, with waiting for news: the shared shape of process logs, PTY
replay buffers and watch event queues.

Positions are absolute and only grow, so a client that went away resumes from the cursor it
last saw. When the bound forces old data out, a reader whose cursor points before what is still
kept is told how much it missed (``skipped``) instead of silently getting a gap.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Generic, TypeVar

__all__ = ["ByteLog", "ByteRead", "EventLog", "EventRead"]

T = TypeVar("T")


class _Waitable:
    """Long-poll readers park on a future of their own; an append resolves them all.

    A bare future and a timer, not ``wait_for(Event.wait())``, which wraps every wait in a task
    of its own and wakes the reader a loop turn later.
    """

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()
        self.closed = False

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def close(self) -> None:
        """No more writes will come (e.g. the process exited); wakes every waiter."""
        self.closed = True
        self._notify()

    async def _wait_news(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclasses.dataclass(frozen=True, slots=True)
class ByteRead:
    data: bytes
    cursor: int  # where this read started (>= the requested cursor if bytes were dropped)
    next_cursor: int  # pass this next time
    skipped: int  # bytes between the requested cursor and ``cursor`` that were dropped
    eof: bool  # closed and nothing after ``next_cursor``


class ByteLog(_Waitable):
    """The last ``capacity`` bytes of a stream, addressed by absolute offset."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._buf = bytearray()
        self.start = 0  # absolute offset of _buf[0]
        self.total = 0  # bytes ever appended (the absolute end)

    def append(self, data: bytes) -> None:
        if not data:
            return
        self._buf += data
        self.total += len(data)
        excess = len(self._buf) - self.capacity
        if excess > 0:
            del self._buf[:excess]
            self.start += excess
        self._notify()

    def read(self, cursor: int, max_bytes: int) -> ByteRead:
        """Bytes from ``cursor`` (clamped to what is kept), at most ``max_bytes``."""
        cursor = max(cursor, 0)
        begin = max(cursor, self.start)
        begin = min(begin, self.total)
        offset = begin - self.start
        data = bytes(self._buf[offset : offset + max_bytes])
        nxt = begin + len(data)
        return ByteRead(
            data,
            begin,
            nxt,
            begin - cursor if begin > cursor else 0,
            self.closed and nxt >= self.total,
        )

    async def read_wait(self, cursor: int, max_bytes: int, timeout: float) -> ByteRead:
        """Like :meth:`read`, but wait up to ``timeout`` seconds for bytes past ``cursor``."""
        if cursor >= self.total and not self.closed and timeout > 0:
            await self._wait_news(timeout)
        return self.read(cursor, max_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class EventRead(Generic[T]):
    events: list[T]
    cursor: int  # seq of the first returned event (or where reading started)
    next_cursor: int
    skipped: int  # events dropped between the requested cursor and ``cursor`` (overflow)
    eof: bool


class EventLog(_Waitable, Generic[T]):
    """The last ``capacity`` events, numbered from 0 by an ever-growing sequence."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._items: collections.deque[T] = collections.deque(maxlen=capacity)
        self.total = 0

    @property
    def start(self) -> int:
        return self.total - len(self._items)

    def append(self, item: T) -> None:
        self._items.append(item)
        self.total += 1
        self._notify()

    def read(self, cursor: int, max_events: int) -> EventRead[T]:
        cursor = max(cursor, 0)
        begin = min(max(cursor, self.start), self.total)
        first = begin - self.start
        events = [self._items[i] for i in range(first, min(first + max_events, len(self._items)))]
        nxt = begin + len(events)
        return EventRead(
            events,
            begin,
            nxt,
            begin - cursor if begin > cursor else 0,
            self.closed and nxt >= self.total,
        )

    async def read_wait(self, cursor: int, max_events: int, timeout: float) -> EventRead[T]:
        if cursor >= self.total and not self.closed and timeout > 0:
            await self._wait_news(timeout)
        return self.read(cursor, max_events)
