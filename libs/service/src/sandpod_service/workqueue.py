"""A keyed work queue: each key is handled by one worker at a time, in order; keys in parallel.

Asking for a key already queued is a no-op; asking while it is being handled marks it dirty so
it runs once more right after (no event is lost, none is handled twice concurrently). Timers
re-queue a key later (the earliest timer wins). The handler returns how long to wait before the
key is due again (None: only when something asks). The lifecycle's Sandbox reconciler and the
pool's pool and claim reconcilers all run on it; its timers run on the injected
:class:`~sandpod_service.clock.Clock`, so a test moves them with a fake one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from sandpod_service.clock import REAL, Clock, Timer

__all__ = ["WorkQueue"]

log = structlog.get_logger("sandpod.service.workqueue")

Handler = Callable[[str], Awaitable[float | None]]


class WorkQueue:
    def __init__(
        self,
        name: str,
        handler: Handler,
        *,
        workers: int = 4,
        clock: Clock = REAL,
        crash_delay: float = 1.0,
    ) -> None:
        self.name = name
        self._clock = clock
        self._crash_delay = crash_delay
        self._handler = handler
        self._workers = workers
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()
        self._timers: dict[str, Timer] = {}
        self.handled = 0

    def add(self, key: str) -> None:
        """Handle ``key`` soon (once, however often it is asked)."""
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        """Handle ``key`` after ``delay`` seconds (an earlier timer for it wins)."""
        delay = max(delay, 0.0)
        old = self._timers.get(key)
        if old is not None and old.when() <= self._clock.monotonic() + delay:
            return
        if old is not None:
            old.cancel()
        self._timers[key] = self._clock.call_later(delay, lambda: self._fire(key))

    def forget(self, key: str) -> None:
        """Drop ``key``'s timer (the object is gone)."""
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
                again = self._crash_delay
            finally:
                self._active.discard(key)
            self.handled += 1
            if again is not None:
                self.add_after(key, again)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
