"""Blocking twins of the ``watch`` family (:class:`~sandpod.watch.api.AsyncWatches`,
``AsyncWatch``): iterate a :class:`Watch` for events; ``with`` stops it at the end.

Each method runs its async twin on the SDK's private loop thread (:mod:`sandpod._loop`).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from sandpod._loop import run
from sandpod._twins import iterate
from sandpod.watch.api import DEFAULT_WAIT, AsyncWatch, AsyncWatches
from sandpod.watch.types import WatchBatch, WatchEvent, WatchInfo

__all__ = ["Watch", "Watches"]


class Watches:
    """Blocking twin of :class:`AsyncWatches` (each method runs it on the SDK loop)."""

    def __init__(self, inner: AsyncWatches) -> None:
        self._inner = inner

    def __call__(self, path: str, **options: Any) -> Watch:
        """A watch of ``path`` (see :meth:`AsyncWatches.__call__`); ``with`` or iterate it."""
        return Watch(self._inner(path, **options))

    def start(self, path: str, **options: Any) -> Watch:
        """Start a watch now (see :meth:`AsyncWatches.start`)."""
        return Watch(run(self._inner.start(path, **options)))

    def attach(self, watch_id: str, cursor: int = 0, *, wait: float = DEFAULT_WAIT) -> Watch:
        return Watch(self._inner.attach(watch_id, cursor, wait=wait))

    def poll(
        self, watch_id: str, cursor: int, *, max_events: int | None = None, wait: float = 0.0
    ) -> WatchBatch:
        """Events since ``cursor`` (see :meth:`AsyncWatches.poll`)."""
        return run(self._inner.poll(watch_id, cursor, max_events=max_events, wait=wait))

    def stop(self, watch_id: str) -> WatchInfo:
        return run(self._inner.stop(watch_id))

    def list(self) -> list[WatchInfo]:
        return run(self._inner.list())


class Watch:
    """Blocking twin of :class:`AsyncWatch`: iterate for events; ``with`` stops it at the end."""

    def __init__(self, inner: AsyncWatch) -> None:
        self._inner = inner

    @property
    def watch_id(self) -> str | None:
        return self._inner.watch_id

    @property
    def cursor(self) -> int:
        return self._inner.cursor

    @property
    def info(self) -> WatchInfo | None:
        return self._inner.info

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def start(self) -> Self:
        run(self._inner.start())
        return self

    def poll(self, *, wait: float = 0.0, max_events: int | None = None) -> WatchBatch:
        return run(self._inner.poll(wait=wait, max_events=max_events))

    def stop(self) -> WatchInfo | None:
        return run(self._inner.stop())

    def close(self) -> None:
        run(self._inner.close())

    def __enter__(self) -> Self:
        run(self._inner.__aenter__())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[WatchEvent]:
        """The events until the watch ends. Outside ``with``, leaving the loop early (``break``,
        an exception, the iterator collected) stops a watch this object started."""
        return iterate(aiter(self._inner))

    def __next__(self) -> WatchEvent:
        try:
            return run(self._inner.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None
