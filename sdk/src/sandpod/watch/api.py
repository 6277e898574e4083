"""The async client of file watching (``sbx.watch``); the blocking twins are in ``sync``.

A watch lives in the sandbox's execd; the client pulls its events with long polls by cursor
(``watch.poll``), so a slow client is never overrun and one that went away asks "what changed since
cursor X" when it comes back. Usage::

    async with sbx.watch("/workspace", include=["**/*.py"]) as w:
        async for ev in w:          # WatchEvent(type="modify", path="/workspace/app.py", ...)
            ...

``overflow`` events mean some events were lost (too many while nobody read, or the kernel's
queue overflowed): rescan what you care about.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from sandpod._iteration import items_then
from sandpod.channel import CONTROL_TIMEOUT
from sandpod.watch.types import EventType, WatchBatch, WatchEvent, WatchInfo, _batch, _info
from sandpod_contract.errors import BadRequest, WatchNotFound
from sandpod_contract.messages import watch as wire
from sandpod_contract.messages.common import Empty

if TYPE_CHECKING:
    from sandpod.channel import Channel

__all__ = ["DEFAULT_WAIT", "AsyncWatch", "AsyncWatches"]

DEFAULT_WAIT = 20.0  # seconds one long poll may wait for news


@contextlib.contextmanager
def _bad_request() -> Iterator[None]:
    """Invalid arguments fail here exactly as execd would refuse them: BadRequest."""
    try:
        yield
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


class AsyncWatches:
    """``sbx.watch``: call it for a watch to ``async with``/iterate, or use the verbs directly."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def __call__(
        self,
        path: str,
        *,
        recursive: bool = True,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        events: Sequence[EventType] = (),
        coalesce: float | None = None,
        queue: int | None = None,
        idle_timeout: float | None = None,
        wait: float = DEFAULT_WAIT,
    ) -> AsyncWatch:
        """A watch of ``path``, started by ``async with``, iteration or :meth:`AsyncWatch.start`.

        Args:
            path: file or directory (``/workspace/...`` or relative to the workspace).
            recursive: also watch subdirectories, including ones created later.
            include: globs relative to ``path`` (``**`` spans directories, ``*.py`` matches at
                any depth): report only matching paths.
            exclude: globs never reported (and directories never watched), e.g. ``node_modules``.
            events: report only these types (default: all); overflow is always reported.
            coalesce: seconds a path's events may be merged (default 0.05; 0: off).
            queue: events execd keeps for you (default 4096); more are reported as overflow.
            idle_timeout: execd stops the watch after this long without a poll (default 600 s).
            wait: seconds one long poll waits for news while iterating.
        """
        with _bad_request():
            req = wire.WatchStart(
                path=path,
                recursive=recursive,
                include=tuple(include),
                exclude=tuple(exclude),
                events=tuple(events),
                coalesce=coalesce,
                queue=queue,
                idle_timeout=idle_timeout,
            )
        return AsyncWatch(self, request=req, wait=wait)

    async def start(self, path: str, **options: Any) -> AsyncWatch:
        """Start a watch now (same arguments as calling ``sbx.watch``); returns it started.

        Raises:
            FsNotFound: ``path`` does not exist.
            WatchLimit: too many watches (per sandbox, or the kernel's inotify limits).
        """
        return await self(path, **options).start()

    def attach(self, watch_id: str, cursor: int = 0, *, wait: float = DEFAULT_WAIT) -> AsyncWatch:
        """Follow an existing watch from ``cursor`` (closing it does not stop the watch)."""
        return AsyncWatch(self, watch_id=watch_id, cursor=cursor, wait=wait)

    async def poll(
        self, watch_id: str, cursor: int, *, max_events: int | None = None, wait: float = 0.0
    ) -> WatchBatch:
        """Events of ``watch_id`` since ``cursor``: what changed while you were away.

        Args:
            wait: seconds to wait for an event if there is none yet (0: answer at once).

        Raises:
            WatchNotFound: no such watch (stopped, expired, or execd restarted).
        """
        with _bad_request():
            req = wire.WatchPoll(watch_id=watch_id, cursor=cursor, max_events=max_events, wait=wait)
        reply = await self._channel.call(
            "watch", "poll", req, wire.WatchEvents, wait + CONTROL_TIMEOUT
        )
        return _batch(reply)

    async def stop(self, watch_id: str) -> WatchInfo:
        """Stop a watch; its remaining events are discarded.

        Raises:
            WatchNotFound: no such watch.
        """
        req = wire.WatchRef(watch_id=watch_id)
        return _info(
            await self._channel.call("watch", "stop", req, wire.WatchInfo, CONTROL_TIMEOUT)
        )

    async def list(self) -> list[WatchInfo]:
        """The sandbox's watches."""
        reply = await self._channel.call("watch", "list", Empty(), wire.WatchList, CONTROL_TIMEOUT)
        return [_info(w) for w in reply.watches]


class AsyncWatch:
    """One watch: ``async for`` its events; ``cursor`` is where the next poll starts.

    Who ends it: ``async with`` keeps the watch until the block ends (a ``break`` may be
    followed by more iteration). Without ``async with`` the iteration owns it: leaving an
    ``async for`` early (``break``, an exception, the iterator collected) closes the watch, so
    execd does not keep collecting events for nobody until its idle timeout.
    """

    def __init__(
        self,
        watches: AsyncWatches,
        *,
        request: wire.WatchStart | None = None,
        watch_id: str | None = None,
        cursor: int = 0,
        wait: float = DEFAULT_WAIT,
    ) -> None:
        self._watches = watches
        self._request = request
        self._owned = request is not None  # we started it, so closing stops it
        self.watch_id = watch_id
        self.info: WatchInfo | None = None
        self.cursor = cursor
        self.closed = False
        self._wait = wait
        self._buffer: collections.deque[WatchEvent] = collections.deque()
        self._managed = False  # inside ``async with``: the block, not an iteration, closes it

    async def start(self) -> Self:
        """Start the watch in execd (no-op when attached or already started)."""
        if self.watch_id is None and self._request is not None:
            reply = await self._watches._channel.call(
                "watch", "start", self._request, wire.WatchInfo, CONTROL_TIMEOUT + 30
            )
            self.info = _info(reply)
            self.watch_id, self.cursor = reply.watch_id, reply.next_cursor
        return self

    async def poll(self, *, wait: float = 0.0, max_events: int | None = None) -> WatchBatch:
        """The next events after ``cursor`` (advancing it); waits up to ``wait`` for one."""
        await self.start()
        if self.watch_id is None:  # built with neither a request nor an id to attach to
            raise BadRequest("this watch has neither a start request nor a watch id")
        batch = await self._watches.poll(
            self.watch_id, self.cursor, max_events=max_events, wait=wait
        )
        self.cursor = batch.next_cursor
        self.closed = batch.closed
        return batch

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        """The events until the watch ends; a generator, so leaving the loop early runs its
        cleanup (at once on ``aclose``, else when the loop collects the abandoned generator)."""
        return items_then(self.__anext__, self._iteration_ended)

    async def _iteration_ended(self) -> None:
        if not self._managed:  # no block to close it later: an iteration left is the end
            await self.close()

    async def __anext__(self) -> WatchEvent:
        while not self._buffer:
            if self.closed:
                raise StopAsyncIteration
            batch = await self.poll(wait=self._wait)
            self._buffer.extend(batch.events)
        return self._buffer.popleft()

    async def stop(self) -> WatchInfo | None:
        """Stop the watch in execd (``None`` if it was already gone)."""
        if self.watch_id is None:
            return None
        try:
            return await self._watches.stop(self.watch_id)
        except WatchNotFound:
            return None
        finally:
            self.closed = True

    async def close(self) -> None:
        """Stop the watch if this object started it; an attached one keeps running."""
        if self._owned:
            await self.stop()
        self.closed = True

    async def __aenter__(self) -> Self:
        self._managed = True
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
