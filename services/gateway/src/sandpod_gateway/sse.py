"""Server-sent events with keepalives, as a plain ASGI response.

The response owns one TaskGroup: the source runs into a bounded queue (so a slow client
backpressures the source instead of growing memory), a listener turns ``http.disconnect`` into
the end of the stream, and the sender writes ``event:``/``data:`` frames, or a ``: keepalive``
comment whenever nothing was sent for ``keepalive`` seconds (so idle streams survive proxies).
A source that raises a :class:`SandpodError` mid-stream ends with an ``error`` event carrying
``{code, message, retryable}`` (the status line was already sent).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sandpod_contract.errors import SandpodError
from sandpod_gateway.errors import error_body

__all__ = ["SseEvent", "SseResponse", "encode_event"]

SseEvent = tuple[str, Any]  # (event name, JSON-serializable data)
QUEUE = 64


def encode_event(event: str, data: Any, event_id: str | None = None) -> bytes:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


class _Disconnected(Exception):
    pass


class SseResponse(Response):
    def __init__(
        self,
        source: AsyncIterator[SseEvent],
        keepalive: float,
        headers: dict[str, str] | None = None,
        companions: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
        on_close: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        """``companions`` run alongside the stream (e.g. liveness acks) and are cancelled with
        it; ``on_close(completed)`` runs last (completed: the source ended by itself)."""
        super().__init__(status_code=200, media_type="text/event-stream")
        self.source = source
        self.keepalive = keepalive
        self.extra_headers = headers or {}
        self.companions = companions
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-store",
            "x-accel-buffering": "no",
            **self.extra_headers,
        }
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE)
        completed = False

        async def produce() -> None:
            try:
                async for event, data in self.source:
                    await queue.put(encode_event(event, data))
            except SandpodError as exc:
                await queue.put(encode_event("error", error_body(exc)))
            await queue.put(None)

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            raise _Disconnected

        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(produce(), name="sse-source"),
                    tg.create_task(listen(), name="sse-listen"),
                ]
                tasks += [tg.create_task(c(), name="sse-companion") for c in self.companions]
                while True:
                    try:
                        frame = await asyncio.wait_for(queue.get(), self.keepalive)
                    except TimeoutError:
                        frame = b": keepalive\n\n"
                    if frame is None:
                        completed = True
                        break
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                for task in tasks:
                    task.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except* (_Disconnected, OSError):
            pass
        finally:
            aclose = getattr(self.source, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.on_close is not None:
                await asyncio.shield(self.on_close(completed))
