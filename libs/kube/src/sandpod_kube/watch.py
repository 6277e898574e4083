"""A Kubernetes watch stream read in a thread and handed to asyncio through a bounded queue.

The ``kubernetes`` client is synchronous, and a watch is one HTTP response that stays open for
minutes, so it gets a dedicated thread (never a slot of the store's request pool). Data flow:

    API server --(chunked JSON lines)--> reader thread --(bounded asyncio.Queue)--> consumer

- Backpressure, not loss: when the queue is full the reader thread blocks (and so stops reading
  the socket) until the consumer takes an event.
- Resumption: the reader remembers the ``resourceVersion`` of the last event or BOOKMARK; when the
  API server ends a watch (its timeout) or the connection drops, it re-opens the watch from there,
  so the consumer sees every change exactly once, in order.
- Expiry: a 410 Gone (the revision was compacted) is not retried -- the consumer gets
  ``ResourceExpired`` and must list again.
- Shutdown: :meth:`WatchStream.close` sets a flag, shuts the socket down to unblock a pending read,
  and joins the thread; it is idempotent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from sandpod_contract.errors import StoreError
from sandpod_kube.errors import from_api_error, from_status

__all__ = ["WatchStream"]

log = logging.getLogger(__name__)

QUEUE_SIZE = 256  # events buffered between the reader thread and the consumer
_RETRY_MIN, _RETRY_MAX = 0.2, 5.0  # seconds between re-connects after a dropped connection
_JOIN_TIMEOUT = 10.0


class _Response(Protocol):
    def stream(self, amt: int | None = ..., decode_content: bool | None = ...) -> Any: ...
    def shutdown(self) -> None: ...
    def release_conn(self) -> None: ...
    def close(self) -> None: ...


# Opens one watch request from a resourceVersion (None: the current state, as ADDED events).
Opener = Callable[[str | None], _Response]


def _lines(response: _Response) -> Iterator[bytes]:
    """The newline-delimited JSON events of a watch response, as they arrive (chunked)."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())


class WatchStream:
    """Raw watch events (``{"type": ..., "object": {...}}``) of one collection, async-iterated.

    Raises (from ``__anext__``): ResourceExpired on 410 Gone; the mapped StoreError when the API
    server refuses the watch (403, 404 ...).
    """

    def __init__(self, opener: Opener, from_version: str | None, kind: str) -> None:
        self._opener = opener
        self._version = from_version
        self._kind = kind
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Mapping[str, Any] | StoreError] = asyncio.Queue(QUEUE_SIZE)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._response: _Response | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"sandpod-kube-watch-{kind}", daemon=True
        )
        self._thread.start()

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> Mapping[str, Any]:
        item = await self._queue.get()
        if isinstance(item, StoreError):
            raise item
        return item

    async def close(self) -> None:
        """Stop reading and join the thread (idempotent)."""
        self._stop.set()
        with self._lock:
            if self._response is not None:
                with contextlib.suppress(Exception):  # the socket may already be gone
                    self._response.shutdown()
        await asyncio.to_thread(self._thread.join, _JOIN_TIMEOUT)
        if self._thread.is_alive():
            log.warning("kube_watch_thread_stuck", extra={"kind": self._kind})

    # -- the reader thread ---------------------------------------------------------------------

    def _run(self) -> None:
        delay = _RETRY_MIN
        while not self._stop.is_set():
            try:
                if self._read_once():
                    return  # delivered a terminal error
                delay = _RETRY_MIN  # the server closed a healthy watch: re-open at once
            except ApiException as exc:
                self._put(from_api_error(exc.status, exc.body, "watch", self._kind))
                return
            except (HTTPError, OSError) as exc:
                if self._stop.is_set():
                    return
                log.info("kube_watch_reconnect", extra={"kind": self._kind, "error": repr(exc)})
                self._stop.wait(delay)
                delay = min(delay * 2, _RETRY_MAX)
            except Exception as exc:  # a bug or a malformed line: surface it, never hang silently
                self._put(StoreError(f"watch of {self._kind} failed: {exc!r}", kind=self._kind))
                return

    def _read_once(self) -> bool:
        """Read one watch response to its end; True when a terminal error was delivered."""
        response = self._opener(self._version)
        with self._lock:
            self._response = response
        try:
            if self._stop.is_set():
                return False
            for line in _lines(response):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    self._put(from_status(obj, "watch", self._kind, None))
                    return True
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self._version = str(version)
                if event.get("type") != "BOOKMARK" and not self._put(event):
                    return False
            return False
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
            response.close()

    def _put(self, item: Mapping[str, Any] | StoreError) -> bool:
        """Hand ``item`` to the consumer, blocking while the queue is full; False once stopped."""
        future = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        while not self._stop.is_set():
            try:
                future.result(timeout=0.5)
                return True
            except concurrent.futures.TimeoutError:
                continue
            except (concurrent.futures.CancelledError, RuntimeError):
                return False  # the loop is closing
        future.cancel()
        return False
