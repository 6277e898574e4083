"""``/v1/sandboxes/{name}/exec``: one-shot (JSON result) and streaming (SSE) command execution.

One-shot sends ``exec.run`` and, when the output did not fit one NATS message, reads the rest
with ``exec.fetch`` (bounded by ``max_output``). Streaming sends ``exec.start`` before the
response begins (a missing sandbox or command is a proper HTTP error), then relays frames as SSE:
``event: stdout`` / ``event: stderr`` with ``{seq, data}`` and finally ``event: exit`` with the exit
code. Output text is UTF-8 (bad bytes replaced) unless ``encoding: "base64"``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.errors import BadRequest
from sandpod_contract.messages.exec import ExecFetch, ExecRequest, ExecResult, OutputPart
from sandpod_gateway.context import context, principal
from sandpod_gateway.execstream import ExecStream
from sandpod_gateway.handlers.common import Body, handler, read_json, target
from sandpod_gateway.sse import SseEvent, SseResponse
from sandpod_gateway.upstream import Target

__all__ = ["command_params", "run", "stream"]

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
    timeout = (req.timeout or 3600.0) + context(request).settings.request_timeout
    with context(request).quotas.exec(principal(request).scope.tenant):
        result = await sbx.call("exec", "run", req, ExecResult, timeout)
        stdout = await _complete(sbx, result, "stdout", result.stdout, result.stdout_size)
        stderr = await _complete(sbx, result, "stderr", result.stderr, result.stderr_size)
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


async def _complete(sbx: Target, result: ExecResult, stream: str, head: bytes, size: int) -> bytes:
    """The whole captured stream: what the reply held plus ``exec.fetch`` parts."""
    data = bytearray(head)
    while len(data) < size:
        part = await sbx.call(
            "exec",
            "fetch",
            ExecFetch(
                exec_id=result.exec_id,
                stream=stream,  # type: ignore[arg-type]
                offset=len(data),
            ),
            OutputPart,
        )
        data += part.data
        if part.eof or not part.data:
            break
    return bytes(data)


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
        es = await ExecStream.open(
            sbx, **params, stdin=body.data_bytes("stdin"), window=ctx.settings.stream_window
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
            await es.close()
        finally:
            slot.release()

    return SseResponse(
        events(),
        ctx.settings.keepalive,
        companions=[es.keepalive],
        headers={"x-exec-id": es.exec_id},
        on_close=closed,
    )
