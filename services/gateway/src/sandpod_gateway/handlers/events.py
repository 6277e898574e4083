"""Server-sent event streams: file watches of one sandbox, and the tenant's lifecycle events.

Watch: ``watch.start`` before the response (bad path: a proper 4xx), then long-polls
``watch.poll`` and relays each event as ``event: <type>``; the watch is stopped when the client
leaves. Lifecycle: a core NATS subscription on ``<prefix>.events.sandbox.*.*`` (what lifecycle
publishes into its JetStream stream), filtered to the tenant's sandboxes and renamed to the
tenant's names; the subscription is bounded and a slow client applies backpressure to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from sandpod_bus import Inbound
from sandpod_contract.codec import decode
from sandpod_contract.errors import BadRequest, SandpodError
from sandpod_contract.messages.sandboxes import SandboxEvent
from sandpod_contract.messages.watch import (
    WatchEvents,
    WatchInfo,
    WatchPoll,
    WatchRef,
    WatchStart,
)
from sandpod_gateway.context import context, principal
from sandpod_gateway.handlers.common import handler, message_json, query_bool, target
from sandpod_gateway.sse import SseEvent, SseResponse

__all__ = ["lifecycle_events", "watch"]

POLL_WAIT = 20.0
EVENT_QUEUE = 256


@handler
async def watch(request: Request) -> Response:
    """File changes below ``path`` as server-sent events (``include``/``exclude`` globs)."""
    ctx = context(request)
    sbx = target(request)
    path = request.query_params.get("path") or "/workspace"
    req = WatchStart(
        path=path,
        recursive=query_bool(request, "recursive", True),
        include=tuple(request.query_params.getlist("include")),
        exclude=tuple(request.query_params.getlist("exclude")),
    )
    slot = ctx.quotas.stream(principal(request).scope.tenant)
    try:
        info = await sbx.call("watch", "start", req, WatchInfo)
    except BaseException:
        slot.release()
        raise

    async def events() -> AsyncIterator[SseEvent]:
        yield "ready", message_json(info)
        cursor = info.next_cursor
        while True:
            poll = WatchPoll(watch_id=info.watch_id, cursor=cursor, wait=POLL_WAIT)
            got = await sbx.call("watch", "poll", poll, WatchEvents, POLL_WAIT + 10)
            for ev in got.events:
                yield ev.type, message_json(ev)
            cursor = got.next_cursor
            if got.closed:
                yield "closed", {"watch_id": info.watch_id}
                return

    async def stop(_completed: bool) -> None:
        slot.release()
        with contextlib.suppress(SandpodError):
            await sbx.call("watch", "stop", WatchRef(watch_id=info.watch_id), WatchInfo, 5.0)

    return SseResponse(events(), ctx.settings.keepalive, on_close=stop)


@handler
async def lifecycle_events(request: Request) -> Response:
    """The tenant's sandbox transitions (created, ready, paused, ... deleted), live."""
    ctx = context(request)
    scope = principal(request).scope
    only = request.query_params.get("sandbox")
    if only is not None and scope.sandbox_id(only) is None:
        raise BadRequest("sandbox: not a sandbox name", field="sandbox")
    queue: asyncio.Queue[bytes] = asyncio.Queue(EVENT_QUEUE)
    slot = ctx.quotas.stream(scope.tenant)

    async def on_event(msg: Inbound) -> None:
        await queue.put(msg.data)  # blocks the subscription: nats-py's pending limits bound it

    subject = ctx.upstream.subjects.events_all()
    try:
        sub = await ctx.upstream.bus.subscribe(subject, on_event, pending_msgs=EVENT_QUEUE)
    except BaseException:
        slot.release()
        raise

    async def events() -> AsyncIterator[SseEvent]:
        yield "ready", {"tenant": scope.tenant}
        while True:
            try:
                ev = decode(SandboxEvent, await queue.get())
            except SandpodError:
                continue  # another event kind (future): not ours to show
            name = scope.name_of(ev.name)
            if name is None or (only is not None and name != only):
                continue
            data = message_json(ev)
            data.update(name=name, namespace=scope.tenant)
            yield ev.type, data

    async def stop(_completed: bool) -> None:
        slot.release()
        await sub.stop()

    return SseResponse(events(), ctx.settings.keepalive, on_close=stop)
