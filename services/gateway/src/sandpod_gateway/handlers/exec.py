"""``/v1/sandboxes/{name}/exec``: one-shot (JSON result) and streaming (SSE) command execution.

Both are the protocol client's (:mod:`sandpod_client`, the SDK's too), so neither can hang on a
dead execd. One-shot is :func:`sandpod_client.run_oneshot`: ``exec.run`` watched by liveness
probes, the rest of the output by ``exec.fetch`` (bounded by ``max_output``), the command
cancelled if the HTTP client leaves. Streaming starts a :class:`sandpod_client.ExecStream`
before the response begins (a missing sandbox or command is a proper HTTP error), then relays
frames as SSE:
``event: stdout`` / ``event: stderr`` with ``{seq, data}`` and finally ``event: exit`` with the exit
code. Output text is UTF-8 (bad bytes replaced) unless ``encoding: "base64"``.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_client import ExecStream, run_oneshot
from sandpod_contract.errors import BadRequest
from sandpod_contract.messages.exec import ExecRequest
from sandpod_gateway.context import context, principal
from sandpod_gateway.handlers.common import Body, handler, read_json, target
from sandpod_gateway.sse import SseEvent, SseResponse
from sandpod_gateway.upstream import Target

__all__ = ["command_params", "open_stream", "run", "stream"]

MAX_ONESHOT_OUTPUT = 64 * 1024 * 1024  # per stream: what a JSON reply may carry


def command_params(body: Body) -> dict[str, Any]:
    """The command fields shared by exec, exec streams and processes."""
    params: dict[str, Any] = {
        "argv": body.texts("argv"),
        "shell": body.text("shell"),
        "cwd": body.text("cwd"),
        "env": body.text_map("env"),
        "timeout": body.number("timeout"),
    }
    if (params["argv"] is None) == (params["shell"] is None):
        raise BadRequest("exactly one of 'argv' or 'shell' is required", field="argv")
    return params


def encoding(body: Body) -> str:
    enc = body.text("encoding", "utf-8") or "utf-8"
    if enc not in ("utf-8", "base64"):
        raise BadRequest("encoding: 'utf-8' or 'base64'", field="encoding")
    return enc


def render(data: bytes, enc: str) -> str:
    return base64.b64encode(data).decode() if enc == "base64" else data.decode(errors="replace")


@handler
async def run(request: Request) -> Response:
    """Run a command to completion; its exit status and output as JSON."""
    body = await read_json(request)
    sbx = target(request)
    enc = encoding(body)
    max_output = body.integer("max_output")
    if max_output is not None and not 0 <= max_output <= MAX_ONESHOT_OUTPUT:
        raise BadRequest(f"max_output: 0..{MAX_ONESHOT_OUTPUT}", field="max_output")
    req = ExecRequest(
        **command_params(body),
        stdin=body.data_bytes("stdin"),
        max_output=MAX_ONESHOT_OUTPUT if max_output is None else max_output,
    )
    deadline = (req.timeout or 3600.0) + context(request).settings.request_timeout
    with context(request).quotas.exec(principal(request).scope.tenant):
        done = await run_oneshot(sbx.channel, req, deadline)
    result, stdout, stderr = done.result, done.stdout, done.stderr
    return JSONResponse(
        {
            "exec_id": result.exec_id,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "stdout": render(stdout, enc),
            "stderr": render(stderr, enc),
            "encoding": enc,
            "stdout_truncated": result.stdout_truncated,
            "stderr_truncated": result.stderr_truncated,
            "timed_out": result.timed_out,
            "duration": result.duration,
        }
    )


async def open_stream(sbx: Target, params: dict[str, Any], **more: Any) -> ExecStream:
    """A started stream (typed errors such as a missing command raised now), or nothing left
    behind: a stream whose start failed is closed here."""
    es = ExecStream(sbx.channel, **params, **more, exec_id=f"gw-{uuid.uuid4().hex[:16]}")
    try:
        await es.start()
    except BaseException:
        await es.close()
        raise
    return es


@handler
async def stream(request: Request) -> Response:
    """Run a command and stream its output as server-sent events, ending with ``exit``."""
    ctx = context(request)
    body = await read_json(request)
    sbx = target(request)
    enc = encoding(body)
    params = command_params(body)
    slot = ctx.quotas.streaming_exec(principal(request).scope.tenant)
    try:
        es = await open_stream(
            sbx, params, stdin=body.data_bytes("stdin"), window=ctx.settings.stream_window
        )
    except BaseException:
        slot.release()
        raise

    async def events() -> AsyncIterator[SseEvent]:
        async for frame in es.frames():
            if frame.kind == "chunk":
                yield frame.stream, {"seq": frame.seq, "data": render(frame.data, enc)}
            else:
                yield (
                    "exit",
                    {
                        "exec_id": frame.exec_id,
                        "exit_code": frame.exit_code,
                        "signal": frame.signal,
                        "timed_out": frame.timed_out,
                        "duration": frame.duration,
                    },
                )

    async def closed(_completed: bool) -> None:
        try:
            await es.close(drain=True)
        finally:
            slot.release()

    return SseResponse(
        events(),
        ctx.settings.keepalive,
        headers={"x-exec-id": es.exec_id},
        on_close=closed,
    )
