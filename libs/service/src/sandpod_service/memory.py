"""Give freed heap memory back to the kernel after bursts (glibc ``malloc_trim``).

Output frames are bytes objects of a few KiB to a few hundred KiB: CPython takes them from
glibc's heap, and once a burst of streams is over the freed chunks sit between live ones, so the
process keeps its peak RSS forever (60 closed streams: hundreds of MB). ``Trimmer.soon()``,
called whenever a stream ends, runs ``malloc_trim(0)`` (which returns every free page, not only
the heap's top) at most once per ``interval`` seconds, on the loop. Elsewhere than glibc it does
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable

__all__ = ["Trimmer", "malloc_trim"]


def _load() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _load()


def malloc_trim() -> bool:
    """Return free heap pages to the kernel now; False where unsupported."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class Trimmer:
    """Debounced :func:`malloc_trim`: ``soon()`` is cheap to call after every stream."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._handle: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        if self._handle is not None or _TRIM is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop (shutdown): nothing to do
            loop = asyncio.get_running_loop()
            self._handle = loop.call_later(self.interval, self._run)

    def _run(self) -> None:
        self._handle = None
        malloc_trim()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
