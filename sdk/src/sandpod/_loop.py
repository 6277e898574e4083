"""A private event loop on a daemon thread, so the sync SDK can drive the async one.

One loop serves every sync object of the process; coroutines are submitted with
``run_coroutine_threadsafe`` and the caller blocks on the result. Ctrl-C in the caller cancels the
submitted coroutine instead of leaving it running.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop  # noqa: PLW0603 - one loop per process, created on first use
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="sandpod-sdk-loop", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the SDK loop and return its result (re-raising its exception)."""
    future = asyncio.run_coroutine_threadsafe(coro, _get_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
