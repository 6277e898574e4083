"""Idle keep-alive connections by target, bounded: what both preview paths' pools keep between
requests (the slow path's streams in :mod:`sandpod_gateway.proxy`, the fast path's protocols in
:mod:`sandpod_gateway.upconn`)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["IdleConnections"]

C = TypeVar("C")
Key = tuple[str, int]


class IdleConnections(Generic[C]):
    """At most ``max_idle`` connections per (address, port) and ``max_total`` in all; past that
    the least recently used target's go first, so a deleted sandbox's connections do not
    linger. ``close`` closes one connection (any it drops)."""

    def __init__(self, close: Callable[[C], None], max_idle: int, max_total: int) -> None:
        self._close = close
        self._max_idle = max_idle
        self._max_total = max_total
        self._total = 0
        self._idle: collections.OrderedDict[Key, collections.deque[C]] = collections.OrderedDict()

    def __len__(self) -> int:
        return self._total

    def __iter__(self) -> Iterator[C]:
        for idle in self._idle.values():
            yield from idle

    def targets(self) -> list[Key]:
        """The targets with idle connections, the least recently used first."""
        return list(self._idle)

    def count(self, key: Key) -> int:
        idle = self._idle.get(key)
        return len(idle) if idle else 0

    def take(self, key: Key, alive: Callable[[C], bool]) -> C | None:
        """The most recently kept connection to ``key`` that is ``alive`` (dead ones on the
        way are closed), or None."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            self._total -= 1
            if not idle:
                del self._idle[key]  # no empty entries left behind for gone sandboxes
            if alive(conn):
                return conn
            self._close(conn)
        return None

    def keep(self, key: Key, conn: C) -> None:
        """Keep ``conn`` for the next request to ``key``, or close it when there is no room."""
        idle = self._idle.setdefault(key, collections.deque())
        self._idle.move_to_end(key)
        if len(idle) >= self._max_idle:
            self._close(conn)
            return
        idle.append(conn)
        self._total += 1
        while self._total > self._max_total:
            oldest_key, oldest = next(iter(self._idle.items()))
            self._close(oldest.popleft())
            self._total -= 1
            if not oldest:
                del self._idle[oldest_key]

    def close_all(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                self._close(conn)
        self._idle.clear()
        self._total = 0
