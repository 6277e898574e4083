"""``/v1/sandboxes/{name}/processes``: background processes (start, list, status, logs, kill).

Logs are read by cursor (an absolute byte position in the combined log), optionally long-polled
with ``wait``; the reply says where to continue (``next_cursor``) and whether the log ended.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandpod_contract.errors import BadRequest
from sandpod_contract.messages.proc import (
    ProcInfo,
    ProcKill,
    ProcList,
    ProcListing,
    ProcLogPart,
    ProcLogs,
    ProcRef,
    ProcStart,
)
from sandpod_gateway.handlers.common import (
    handler,
    message_json,
    query_float,
    query_int,
    read_json,
    target,
)
from sandpod_gateway.handlers.exec import command_params, render

__all__ = ["get", "kill", "list_", "logs", "start"]

MAX_WAIT = 60.0


@handler
async def start(request: Request) -> Response:
    """Start a background process; its record."""
    body = await read_json(request)
    req = ProcStart(
        proc_id=body.text("proc_id"),
        tags=body.text_map("tags"),
        stdin=body.data_bytes("stdin"),
        log_limit=body.integer("log_limit"),
        **command_params(body),
    )
    info = await target(request).call("proc", "start", req, ProcInfo)
    return JSONResponse(message_json(info), status_code=201)


@handler
async def list_(request: Request) -> Response:
    """The sandbox's kept processes (``state``: running or exited)."""
    state = request.query_params.get("state") or None
    if state not in (None, "running", "exited"):
        raise BadRequest("state: 'running' or 'exited'", field="state")
    listing = await target(request).call("proc", "list", ProcList(state=state), ProcListing)  # type: ignore[arg-type]
    return JSONResponse(message_json(listing))


@handler
async def get(request: Request) -> Response:
    """One process's record."""
    ref = ProcRef(proc_id=request.path_params["proc_id"])
    return JSONResponse(message_json(await target(request).call("proc", "status", ref, ProcInfo)))


@handler
async def logs(request: Request) -> Response:
    """Output after ``cursor`` (long-poll up to ``wait`` seconds for news)."""
    wait = min(query_float(request, "wait", 0.0), MAX_WAIT)
    enc = request.query_params.get("encoding", "utf-8")
    if enc not in ("utf-8", "base64"):
        raise BadRequest("encoding: 'utf-8' or 'base64'", field="encoding")
    req = ProcLogs(
        proc_id=request.path_params["proc_id"],
        cursor=query_int(request, "cursor", 0),
        max_bytes=query_int(request, "max_bytes", None, minimum=1),
        wait=wait or None,
    )
    part = await target(request).call("proc", "logs", req, ProcLogPart, wait + 10)
    return JSONResponse(
        {
            "proc_id": part.proc_id,
            "cursor": part.cursor,
            "next_cursor": part.next_cursor,
            "skipped": part.skipped,
            "eof": part.eof,
            "state": part.state,
            "encoding": enc,
            "chunks": [
                {"offset": c.offset, "stream": c.stream, "data": render(c.data, enc)}
                for c in part.chunks
            ],
        }
    )


@handler
async def kill(request: Request) -> Response:
    """End the process tree: ``signal`` (default SIGTERM), then SIGKILL after ``grace``."""
    req = ProcKill(
        proc_id=request.path_params["proc_id"],
        signal=query_int(request, "signal", None, minimum=1),
        grace=query_float(request, "grace", None),
    )
    grace = req.grace if req.grace is not None else 5.0
    info = await target(request).call("proc", "kill", req, ProcInfo, grace + 10)
    return JSONResponse(message_json(info))
