"""Task ownership with bounded concurrency.

Every background task in a service belongs to a :class:`Supervisor`: it is named, counted against
a limit, logged if it fails, and cancelled (and logged) if still running when the service stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

__all__ = ["Supervisor"]

log = structlog.get_logger("sandpod.tasks")


class Supervisor:
    """Owns tasks; at most ``limit`` run at once (``try_spawn`` refuses beyond it)."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def full(self) -> bool:
        return len(self._tasks) >= self.limit

    def try_spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> bool:
        """Start ``coro`` unless closed or at the limit; returns whether it started."""
        if self._closed or self.full:
            coro.close()
            return False
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return True

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Start ``coro`` ignoring the limit (internal work that must not be refused)."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"supervisor {self.name} is closed")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("task_failed", task=task.get_name(), error=repr(exc), exc_info=exc)

    async def close(self, grace: float) -> None:
        """Refuse new tasks, wait up to ``grace`` seconds, then cancel and log stragglers."""
        self._closed = True
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            log.warning("task_cancelled_at_shutdown", task=task.get_name())
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=grace or 1.0)
