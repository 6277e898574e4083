"""A keyed work queue: each key is handled by one worker at a time, in order; keys in parallel.

Asking for a key already queued is a no-op; asking while it is being handled marks it dirty so
it runs once more right after (no event is lost, none is handled twice concurrently). Timers
re-queue a key later (the earliest timer wins). The handler returns how long to wait before the
key is due again (None: only when something asks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

__all__ = ["WorkQueue"]

log = structlog.get_logger("sandpod.pool.workqueue")

Handler = Callable[[str], Awaitable[float | None]]


class WorkQueue:
    def __init__(self, name: str, handler: Handler, *, workers: int = 4) -> None:
        self.name = name
        self._handler = handler
        self._workers = workers
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.handled = 0

    def add(self, key: str) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        old = self._timers.get(key)
        if old is not None and old.when() <= loop.time() + delay:
            return
        if old is not None:
            old.cancel()
        self._timers[key] = loop.call_later(max(delay, 0.0), self._fire, key)

    def forget(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def run(self) -> None:
        """Work until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self._workers):
                    tg.create_task(self._worker(), name=f"{self.name}-{i}")
        finally:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                again = await self._handler(key)
            except Exception:
                log.exception("work_item_crashed", queue=self.name, key=key)
                again = 1.0
            finally:
                self._active.discard(key)
            self.handled += 1
            if again is not None:
                self.add_after(key, again)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
