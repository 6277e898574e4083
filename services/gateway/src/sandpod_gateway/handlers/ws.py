"""WebSockets: terminals (PTY) and exec with streaming stdin.

PTY ``/v1/sandboxes/{name}/pty``: attaches to ``pty_id`` if it exists, else opens one. The server
sends a JSON ``ready`` frame, then the terminal's output as binary frames starting from
``cursor`` (default: the oldest byte still in execd's replay buffer, so a reconnecting viewer
redraws the screen), then ``{"type": "exit", ...}``. The client sends keystrokes as binary frames
and ``{"type": "resize", "cols", "rows"}`` / ``{"type": "signal", "signal"}`` as JSON text. Any
number of viewers may attach to one PTY: each reads by its own cursor.

Exec ``/v1/sandboxes/{name}/exec/ws``: the first text frame is the command (the exec JSON body);
then binary frames from the client are stdin, ``{"type": "eof"}`` closes it; the server sends
binary frames whose first byte is 1 (stdout) or 2 (stderr), then ``{"type": "exit", ...}``.

Both send ``{"type": "keepalive"}`` after ``keepalive`` seconds without traffic (uvicorn also
pings at the protocol level), and errors as ``{"type": "error", code, message, retryable}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from sandpod_client import ExecStream
from sandpod_contract.errors import BadRequest, Busy, PtyNotFound, SandpodError
from sandpod_contract.messages.pty import (
    PtyInfo,
    PtyInput,
    PtyOpen,
    PtyOutput,
    PtyRead,
    PtyRef,
    PtyResize,
    PtySignal,
    PtyWritten,
)
from sandpod_gateway import jsonbody
from sandpod_gateway.context import context, principal
from sandpod_gateway.errors import error_body, error_response
from sandpod_gateway.handlers.common import Body
from sandpod_gateway.handlers.exec import command_params, open_stream
from sandpod_gateway.quotas import Slot
from sandpod_gateway.upstream import Target

__all__ = ["exec_ws", "pty_ws"]

READ_WAIT = 20.0
MAX_DIM = 10_000


class _Link:
    """One WebSocket with a send lock (several tasks send) and the keepalive's clock."""

    def __init__(self, ws: WebSocket, keepalive: float) -> None:
        self.ws = ws
        self.keepalive = keepalive
        self._lock = asyncio.Lock()
        self._last = asyncio.get_running_loop().time()

    async def send_bytes(self, data: bytes) -> None:
        async with self._lock:
            await self.ws.send_bytes(data)
            self._last = asyncio.get_running_loop().time()

    async def send_json(self, data: dict[str, Any]) -> None:
        async with self._lock:
            await self.ws.send_text(json.dumps(data))
            self._last = asyncio.get_running_loop().time()

    async def keepalives(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(self._last + self.keepalive - loop.time(), 0.0))
            if loop.time() - self._last >= self.keepalive:
                await self.send_json({"type": "keepalive"})


async def _run(link: _Link, *jobs: Callable[[], Awaitable[None]]) -> None:
    """Run ``jobs`` and the keepalive until the first job ends; then cancel the rest."""
    tasks = [asyncio.ensure_future(job()) for job in jobs]
    tasks.append(asyncio.ensure_future(link.keepalives()))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if task.cancelled():  # a job that ended by cancelling itself: nothing to report
            continue
        exc = task.exception()
        if exc is not None and not isinstance(exc, WebSocketDisconnect | OSError):
            raise exc


def _target(ws: WebSocket) -> Target:
    return context(ws).upstream.sandbox(principal(ws).scope, ws.path_params["name"])


def _dim(ws: WebSocket, name: str, default: int) -> int:
    raw = ws.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_DIM:
        raise BadRequest(f"{name}: 1..{MAX_DIM}", field=name)
    return int(raw)


async def _fail(ws: WebSocket, link: _Link | None, exc: SandpodError) -> None:
    with contextlib.suppress(Exception):  # the peer may be gone already
        if link is None and isinstance(exc, Busy) and _can_deny(ws):
            await ws.send_denial_response(error_response(exc))  # 429 / 503 before the handshake
            return
        if link is None:
            await ws.accept()
            link = _Link(ws, 1.0)
        await link.send_json({"type": "error", **error_body(exc)})
        await ws.close(code=1011 if exc.retryable else 1008)


def _can_deny(ws: WebSocket) -> bool:
    return "websocket.http.response" in ws.scope.get("extensions", {})


async def _attach(sbx: Target, ws: WebSocket) -> PtyInfo:
    pty_id = ws.query_params.get("pty_id") or None
    if pty_id is not None:
        with contextlib.suppress(PtyNotFound):
            return await sbx.call("pty", "get", PtyRef(pty_id=pty_id), PtyInfo)
    shell = ws.query_params.get("shell") or None
    req = PtyOpen(pty_id=pty_id, shell=shell, cols=_dim(ws, "cols", 80), rows=_dim(ws, "rows", 24))
    return await sbx.call("pty", "open", req, PtyInfo)


async def pty_ws(ws: WebSocket) -> None:
    """A terminal over a WebSocket (binary = bytes, JSON text = control)."""
    ctx = context(ws)
    link: _Link | None = None
    slot: Slot | None = None
    try:
        sbx = _target(ws)
        slot = ctx.quotas.stream(principal(ws).scope.tenant)  # refused before the handshake
        info = await _attach(sbx, ws)
        raw_cursor = ws.query_params.get("cursor")
        cursor = int(raw_cursor) if raw_cursor and raw_cursor.isdigit() else info.start_cursor
        await ws.accept()
        link = _Link(ws, ctx.settings.keepalive)
        await link.send_json(
            {
                "type": "ready",
                "pty_id": info.pty_id,
                "cols": info.cols,
                "rows": info.rows,
                "cursor": cursor,
            }
        )
        await _run(
            link,
            lambda: _pty_out(sbx, link, info.pty_id, cursor),
            lambda: _pty_in(sbx, link, info.pty_id),
        )
        with contextlib.suppress(Exception):
            await ws.close(code=1000)
    except SandpodError as exc:
        await _fail(ws, link, exc)
    finally:
        if slot is not None:
            slot.release()


async def _pty_out(sbx: Target, link: _Link, pty_id: str, cursor: int) -> None:
    while True:
        req = PtyRead(pty_id=pty_id, cursor=cursor, wait=READ_WAIT)
        out = await sbx.call("pty", "read", req, PtyOutput, READ_WAIT + 10)
        if out.data:
            await link.send_bytes(out.data)
        cursor = out.next_cursor
        if out.exited and not out.data:
            await link.send_json(
                {"type": "exit", "exit_code": out.exit_code, "signal": out.signal, "cursor": cursor}
            )
            return


async def _pty_in(sbx: Target, link: _Link, pty_id: str) -> None:
    while True:
        msg = await link.ws.receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("bytes") is not None:
            await sbx.call("pty", "input", PtyInput(pty_id=pty_id, data=msg["bytes"]), PtyWritten)
            continue
        try:
            ctl = jsonbody.loads(msg.get("text") or "")
            kind = ctl.get("type") if isinstance(ctl, dict) else None
            if kind == "resize":
                await sbx.call(
                    "pty",
                    "resize",
                    PtyResize(pty_id=pty_id, cols=int(ctl["cols"]), rows=int(ctl["rows"])),
                    PtyInfo,
                )
            elif kind == "signal":
                await sbx.call(
                    "pty", "signal", PtySignal(pty_id=pty_id, signal=int(ctl["signal"])), PtyInfo
                )
            elif kind == "input":  # text input for clients that cannot send binary frames
                data = str(ctl["data"]).encode()
                await sbx.call("pty", "input", PtyInput(pty_id=pty_id, data=data), PtyWritten)
            else:
                raise BadRequest(f"unknown control frame type {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            await link.send_json({"type": "error", **error_body(BadRequest(str(exc)))})
        except SandpodError as exc:
            await link.send_json({"type": "error", **error_body(exc)})


async def exec_ws(ws: WebSocket) -> None:
    """A command with streaming stdin over a WebSocket."""
    ctx = context(ws)
    link: _Link | None = None
    es: ExecStream | None = None
    slot: Slot | None = None
    try:
        sbx = _target(ws)
        slot = ctx.quotas.streaming_exec(principal(ws).scope.tenant)  # before the handshake
        await ws.accept()
        link = _Link(ws, ctx.settings.keepalive)
        first = await ws.receive_text()
        try:
            body = jsonbody.loads(first)
        except ValueError as exc:
            raise BadRequest("the first frame must be the command as JSON") from exc
        if not isinstance(body, dict):
            raise BadRequest("the first frame must be a JSON object")
        es = await open_stream(
            sbx, command_params(Body(body)), stdin_open=True, window=ctx.settings.stream_window
        )
        await link.send_json({"type": "started", "exec_id": es.exec_id})
        await _run(link, lambda: _exec_out(es, link), lambda: _exec_in(es, link))
        with contextlib.suppress(Exception):
            await ws.close(code=1000)
    except WebSocketDisconnect:
        pass
    except SandpodError as exc:
        await _fail(ws, link, exc)
    finally:
        if es is not None:
            await es.close(drain=True)
        if slot is not None:
            slot.release()


async def _exec_out(es: ExecStream, link: _Link) -> None:
    async for frame in es.frames():
        if frame.kind == "chunk":
            await link.send_bytes((b"\x01" if frame.stream == "stdout" else b"\x02") + frame.data)
        else:
            await link.send_json(
                {
                    "type": "exit",
                    "exit_code": frame.exit_code,
                    "signal": frame.signal,
                    "timed_out": frame.timed_out,
                }
            )


async def _exec_in(es: ExecStream, link: _Link) -> None:
    while True:
        msg = await link.ws.receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("bytes") is not None:
            await es.write(msg["bytes"])
            continue
        try:
            ctl = jsonbody.loads(msg.get("text") or "")
        except (ValueError, SandpodError):
            ctl = None
        if isinstance(ctl, dict) and ctl.get("type") == "eof":
            await es.stdin(b"", eof=True)
        else:
            await link.send_json({"type": "error", **error_body(BadRequest("unknown frame"))})
