"""``/v1/sandboxes/{name}/files``: raw bytes down and up (streamed, ``Range``), and metadata ops.

The byte transfer is in :mod:`sandpod_gateway.transfer`; the rest maps one JSON request to one
``fs.*`` request and its reply (``FsEntry``, ``FsListing``...) back to JSON.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sandpod_client.archive import archive as archive_stream
from sandpod_client.archive import extract as extract_stream
from sandpod_contract.errors import BadRequest, FsIsADirectory
from sandpod_contract.messages.fs import (
    FsChmod,
    FsChunk,
    FsEntry,
    FsList,
    FsListing,
    FsMkdir,
    FsMove,
    FsPath,
    FsRead,
    FsRemove,
    FsRemoved,
    FsSearch,
    FsSearchResult,
)
from sandpod_gateway.context import context, principal
from sandpod_gateway.handlers.common import (
    handler,
    message_json,
    query_bool,
    query_int,
    read_json,
    target,
)
from sandpod_gateway.quotas import Slot
from sandpod_gateway.transfer import download as download_bytes
from sandpod_gateway.transfer import parse_range
from sandpod_gateway.transfer import upload as upload_bytes

__all__ = [
    "archive",
    "chmod",
    "download",
    "extract",
    "list_",
    "mkdir",
    "move",
    "remove",
    "search",
    "stat",
    "upload",
]

_SHA = re.compile(r"[0-9a-fA-F]{64}")


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise BadRequest("query parameter 'path' is required", field="path")
    return path


@handler
async def download(request: Request) -> Response:
    """A file's bytes (``Range: bytes=a-b`` gives 206 and that slice)."""
    ctx = context(request)
    sbx, path = target(request), _path(request)
    entry = await sbx.call("fs", "stat", FsPath(path=path, follow=True), FsEntry)
    if entry.type == "dir":
        raise FsIsADirectory(f"{path} is a directory", path=entry.path)
    # Opened once before the status line goes out: a file the sandbox's user may not read is a
    # 403 with its typed error, not a 200 whose body breaks off.
    await sbx.call("fs", "read", FsRead(path=path, offset=0, length=0), FsChunk)
    window = parse_range(request.headers.get("range"), entry.size)
    start, length = window or (0, entry.size)
    headers = {
        "accept-ranges": "bytes",
        "content-length": str(length),
        "last-modified-epoch": f"{entry.mtime:.6f}",
    }
    if window is not None:
        headers["content-range"] = f"bytes {start}-{start + length - 1}/{entry.size}"

    slot = ctx.quotas.stream(principal(request).scope.tenant)  # refused now, never waits

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in download_bytes(sbx, path, start, length):
                ctx.metrics.transfer_bytes.labels("download").inc(len(chunk))
                yield chunk
        finally:
            slot.release()

    return _Releasing(
        body(),
        slot,
        status_code=206 if window else 200,
        headers=headers,
        media_type="application/octet-stream",
    )


@handler
async def upload(request: Request) -> Response:
    """Replace or create a file with the raw request body (atomic; size and hash checked)."""
    ctx = context(request)
    sbx, path = target(request), _path(request)
    sha = request.headers.get("x-content-sha256")
    if sha is not None and not _SHA.fullmatch(sha):
        raise BadRequest("X-Content-SHA256: 64 hex digits", field="x-content-sha256")
    mode_raw = request.query_params.get("mode")
    try:
        mode = int(mode_raw, 8) if mode_raw else None
    except ValueError:
        raise BadRequest("mode: octal permission bits, e.g. 644", field="mode") from None
    with ctx.quotas.stream(principal(request).scope.tenant):
        entry, received = await upload_bytes(
            sbx,
            path,
            request.stream(),
            mode=mode,
            make_parents=query_bool(request, "make_parents", True),
            expected_sha256=sha,
        )
    ctx.metrics.transfer_bytes.labels("upload").inc(received)
    return JSONResponse(message_json(entry), status_code=201)


@handler
async def archive(request: Request) -> Response:
    """A directory as a tar stream (``gzip=true``: gzip'ed), made by the sandbox's ``tar``.

    The first piece (or the typed error: no such directory, no ``tar``...) is awaited before
    the status line goes out. A failure after that (a file vanishing midway) ends the chunked
    body without its last chunk: a client sees a broken transfer, never a short archive."""
    ctx = context(request)
    sbx, path = target(request), _path(request)
    gzip = query_bool(request, "gzip", False)
    slot = ctx.quotas.stream(principal(request).scope.tenant)  # refused now, never waits
    chunks = archive_stream(sbx.channel, path, gzip=gzip, exec_id=f"gw-{uuid.uuid4().hex[:16]}")
    try:
        first = await anext(chunks, b"")
    except BaseException:
        slot.release()
        await chunks.aclose()  # type: ignore[attr-defined]
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            if first:
                ctx.metrics.transfer_bytes.labels("download").inc(len(first))
                yield first
            async for chunk in chunks:
                ctx.metrics.transfer_bytes.labels("download").inc(len(chunk))
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
            slot.release()

    name = path.rstrip("/").rsplit("/", 1)[-1] or "workspace"
    suffix = ".tar.gz" if gzip else ".tar"
    return _Releasing(
        body(),
        slot,
        headers={"content-disposition": f'attachment; filename="{_safe(name)}{suffix}"'},
        media_type="application/gzip" if gzip else "application/x-tar",
    )


@handler
async def extract(request: Request) -> Response:
    """Unpack the raw request body (a tar; ``gzip=true``: gzip'ed) into a directory, made if
    missing, by the sandbox's ``tar`` as the sandbox's user."""
    ctx = context(request)
    sbx, path = target(request), _path(request)
    gzip = query_bool(request, "gzip", False)
    with ctx.quotas.stream(principal(request).scope.tenant):
        received = await extract_stream(
            sbx.channel,
            path,
            request.stream(),
            gzip=gzip,
            exec_id=f"gw-{uuid.uuid4().hex[:16]}",
        )
    ctx.metrics.transfer_bytes.labels("upload").inc(received)
    return JSONResponse({"path": path, "received": received}, status_code=201)


def _safe(name: str) -> str:
    """A file name fit for a quoted header value."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]


@handler
async def stat(request: Request) -> Response:
    """Describe one path."""
    follow = query_bool(request, "follow")
    entry = await target(request).call(
        "fs", "stat", FsPath(path=_path(request), follow=follow), FsEntry
    )
    return JSONResponse(message_json(entry))


@handler
async def list_(request: Request) -> Response:
    """A directory's entries, ``depth`` levels deep, in pages (``cursor``)."""
    req = FsList(
        path=_path(request),
        depth=query_int(request, "depth", 1, minimum=1),
        hidden=query_bool(request, "hidden", True),
        limit=query_int(request, "limit", None, minimum=1),
        cursor=request.query_params.get("cursor") or None,
    )
    listing = await target(request).call("fs", "list", req, FsListing)
    return JSONResponse(message_json(listing))


@handler
async def remove(request: Request) -> Response:
    """Delete a file, link or directory (``recursive`` for a non-empty one)."""
    req = FsRemove(
        path=_path(request),
        recursive=query_bool(request, "recursive"),
        missing_ok=query_bool(request, "missing_ok"),
    )
    return JSONResponse(message_json(await target(request).call("fs", "remove", req, FsRemoved)))


@handler
async def mkdir(request: Request) -> Response:
    """Create a directory (parents by default)."""
    body = await read_json(request)
    req = FsMkdir(
        path=body.req_text("path"), parents=body.flag("parents", True), mode=body.integer("mode")
    )
    return JSONResponse(
        message_json(await target(request).call("fs", "mkdir", req, FsEntry)), status_code=201
    )


@handler
async def move(request: Request) -> Response:
    """Rename or move ``src`` to ``dst``."""
    body = await read_json(request)
    req = FsMove(
        src=body.req_text("src"),
        dst=body.req_text("dst"),
        overwrite=body.flag("overwrite"),
        make_parents=body.flag("make_parents"),
    )
    return JSONResponse(message_json(await target(request).call("fs", "move", req, FsEntry)))


@handler
async def chmod(request: Request) -> Response:
    """Set permission bits (``mode`` as an integer, e.g. 493 for 0o755)."""
    body = await read_json(request)
    mode = body.integer("mode")
    if mode is None:
        raise BadRequest("missing required field 'mode'", field="mode")
    req = FsChmod(path=body.req_text("path"), mode=mode, recursive=body.flag("recursive"))
    return JSONResponse(message_json(await target(request).call("fs", "chmod", req, FsEntry)))


@handler
async def search(request: Request) -> Response:
    """Lines containing ``query`` (or matching it as a regex) below ``path``."""
    body = await read_json(request)
    req = FsSearch(
        query=body.req_text("query"),
        path=body.text("path"),
        glob=body.text("glob"),
        regex=body.flag("regex"),
        case_sensitive=body.flag("case_sensitive", True),
        hidden=body.flag("hidden"),
        limit=body.integer("limit"),
    )
    result = await target(request).call("fs", "search", req, FsSearchResult)
    return JSONResponse(message_json(result))


class _Releasing(StreamingResponse):
    """A streamed body whose stream slot is released however the response ends (also when the
    client leaves before the body's first byte, so the generator never started)."""

    def __init__(self, content: AsyncIterator[bytes], slot: Slot, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()
