"""HTTP/1.1 from the gateway to a port of a sandbox: streamed both ways, never buffered whole.

Why a small client of our own instead of an HTTP library: the proxy needs exactly HTTP/1.1 to one
address, the response head parsed and the body passed on piece by piece as it arrives (a 1 GiB
download, an SSE stream, a long poll) with the ASGI server's backpressure, keep-alive connections
reused for the next request, and no read timeout at all (a long poll is not an error). That is
~200 lines on asyncio streams; a general client would add a second event model and its own
timeouts and buffering to switch off. Only connecting has a deadline
(``SANDPOD_GATEWAY_PREVIEW_CONNECT_TIMEOUT``).

Data flow per request: the client's head (hop-by-hop headers and the gateway's own credentials
removed by the caller, ``X-Forwarded-*`` added) goes to a pooled connection; a feeder task streams
the request body (re-chunked when the client sent no length), then waits for the client to go
away; the main task reads the response head, sends it, and copies the body (de-chunked: uvicorn
frames it again for the client) until its end. If the client disconnects, both stop and the
upstream connection is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import structlog
from starlette.types import Message, Receive, Send

from sandpod_gateway.errors import no_http_response, port_unreachable
from sandpod_gateway.idle import IdleConnections

__all__ = ["HOP_BY_HOP", "ConnectionPool", "UpstreamRequest", "relay_http"]

log = structlog.get_logger("sandpod.gateway.proxy")

# The stream's buffer limit: the response head may not be larger, and the transport stops
# reading at twice it (so it also sets how much one read can return: small caps throughput).
HEAD_LIMIT = 1024 * 1024
# At most this much per body piece: more than the buffer ever holds, so a read takes all of it
# (reading a part would shift the rest of the buffer down: a copy per read, measured at half
# the proxy's CPU on a 1 GiB download).
CHUNK = 4 * HEAD_LIMIT
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",  # uvicorn answers 100-continue itself
        b"host",  # set to the upstream's
    }
)
_NO_BODY = frozenset({204, 304})


class _ClientGone(Exception):
    """The client disconnected: stop relaying."""


class _UpstreamBroken(Exception):
    """The upstream closed or spoke something that is not HTTP/1.x."""


@dataclasses.dataclass(slots=True)
class _Conn:
    key: tuple[str, int]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class _Out:
    """Where the response goes, and the headers the gateway adds to it."""

    send: Send
    extra: list[tuple[bytes, bytes]]


@dataclasses.dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """What to send: ``target`` is the path and query on the upstream; ``headers`` are final
    (the caller filtered and added what it wanted)."""

    address: str
    port: int
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    body: str  # "none", "length" (the client's Content-Length is in headers) or "chunked"


class ConnectionPool:
    """Idle keep-alive connections per (address, port), at most ``max_idle`` each and
    ``max_total`` in all (the least recently used target's go first: a deleted sandbox's
    connections do not linger)."""

    def __init__(self, connect_timeout: float, max_idle: int = 32, max_total: int = 512) -> None:
        self._timeout = connect_timeout
        self._idle: IdleConnections[_Conn] = IdleConnections(_close, max_idle, max_total)

    async def acquire(self, address: str, port: int, fresh: bool = False) -> _Conn:
        """A connection to ``address:port``: an idle one unless ``fresh``.

        Raises:
            PortUnreachable: nothing accepts connections there within the connect timeout.
        """
        conn = None if fresh else self._idle.take((address, port), _open)
        if conn is not None:
            conn.reused = True
            return conn
        return await self.connect(address, port, self._timeout)

    @staticmethod
    async def connect(address: str, port: int, timeout: float) -> _Conn:
        """A new connection. Raises PortUnreachable."""
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(address, port, limit=HEAD_LIMIT)
        except (OSError, TimeoutError) as exc:
            raise port_unreachable(port, exc) from exc
        return _Conn((address, port), reader, writer)

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and not conn.writer.is_closing():
            self._idle.keep(conn.key, conn)
        else:
            conn.writer.close()

    def close(self) -> None:
        self._idle.close_all()


def _open(conn: _Conn) -> bool:
    return not conn.reader.at_eof() and not conn.writer.is_closing()


def _close(conn: _Conn) -> None:
    conn.writer.close()


async def relay_http(
    pool: ConnectionPool,
    req: UpstreamRequest,
    receive: Receive,
    send: Send,
    extra_headers: list[tuple[bytes, bytes]],
) -> None:
    """Send ``req`` (its body read from ``receive``) and stream the response to ``send`` with
    ``extra_headers`` added.

    Raises:
        PortUnreachable: no connection, or the upstream broke before the response started
            (the caller answers 502; after the start the response is cut off instead).
    """
    started = [False]
    # A reused keep-alive connection may have been closed by the server meanwhile: a request
    # without a body is sent again once on a fresh connection (nothing of it reached the app).
    for attempt in range(2):
        conn = await pool.acquire(req.address, req.port, fresh=attempt > 0)
        retry = conn.reused and req.body == "none"
        try:
            reusable = await _exchange(conn, req, receive, _Out(send, extra_headers), started)
        except _UpstreamBroken as exc:
            conn.writer.close()
            if started[0]:
                log.info("preview_upstream_cut", port=req.port, error=str(exc))
                return
            if retry:
                continue
            raise no_http_response(req.port, exc) from None
        except BaseException:
            conn.writer.close()
            raise
        pool.release(conn, reusable)
        return


async def _exchange(
    conn: _Conn, req: UpstreamRequest, receive: Receive, out: _Out, started: list[bool]
) -> bool:
    """One request/response on ``conn``; True if the connection may be reused."""
    head = [f"{req.method} {req.target} HTTP/1.1\r\n".encode("latin-1")]
    head += [k + b": " + v + b"\r\n" for k, v in req.headers]
    if req.body == "chunked":
        head.append(b"transfer-encoding: chunked\r\n")
    head.append(b"\r\n")
    try:
        conn.writer.write(b"".join(head))
    except (OSError, RuntimeError) as exc:
        raise _UpstreamBroken(str(exc)) from exc
    fed = asyncio.Event()
    reusable, gone, broken = True, False, ""
    try:
        async with asyncio.TaskGroup() as group:
            feeder = group.create_task(_feed(conn, req, receive, fed))
            reusable = await _respond(conn, req, out, started)
            feeder.cancel()
    except* _ClientGone:
        gone = True
    except* (_UpstreamBroken, ConnectionError) as eg:
        broken = str(eg.exceptions[0]) or type(eg.exceptions[0]).__name__
    if broken and not gone:
        raise _UpstreamBroken(broken)
    return reusable and fed.is_set() and not gone


async def _feed(conn: _Conn, req: UpstreamRequest, receive: Receive, fed: asyncio.Event) -> None:
    """Stream the request body upstream, then wait for the client to leave (raise _ClientGone)."""
    more = req.body != "none"
    while more:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if req.body == "chunked":
            if body:
                conn.writer.write(b"%x\r\n%b\r\n" % (len(body), body))
            if not more:
                conn.writer.write(b"0\r\n\r\n")
        elif body:
            conn.writer.write(body)
        await conn.writer.drain()
    fed.set()
    while (await receive())["type"] != "http.disconnect":
        pass
    raise _ClientGone


async def _respond(conn: _Conn, req: UpstreamRequest, out: _Out, started: list[bool]) -> bool:
    """Read the response and pass it on; True if the connection may carry another request."""
    while True:
        status, headers = await _read_head(conn.reader)
        if status >= 200 or status == 101:
            break  # 1xx interim responses (103 Early Hints, a stray 100) are not relayed
    fields = dict(headers)
    close = b"close" in fields.get(b"connection", b"").lower()
    kept = [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in (b"date", b"server")]
    send = out.send
    await send({"type": "http.response.start", "status": status, "headers": kept + out.extra})
    started[0] = True
    if req.method == "HEAD" or status in _NO_BODY or status < 200:
        pieces: AsyncIterator[bytes] | None = None
    elif b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        pieces = _chunked(conn.reader)
    elif (length := fields.get(b"content-length")) is not None:
        pieces = _sized(conn.reader, int(length))
    else:
        pieces, close = _until_eof(conn.reader), True
    if pieces is not None:
        async for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return not close


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[bytes, bytes]]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        raise _UpstreamBroken("closed before a response") from exc
    except asyncio.LimitOverrunError as exc:
        raise _UpstreamBroken(f"response head over {HEAD_LIMIT} bytes") from exc
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise _UpstreamBroken("not an HTTP/1.x response")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise _UpstreamBroken("malformed response header")
        headers.append((name.strip().lower(), value.strip()))
    return int(parts[1]), headers


async def _sized(reader: asyncio.StreamReader, length: int) -> AsyncIterator[bytes]:
    left = length
    while left > 0:
        data = await reader.read(min(left, CHUNK))
        if not data:
            raise _UpstreamBroken(f"closed {left} bytes before the end of the body")
        left -= len(data)
        yield data


async def _chunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    try:
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers: dropped
                return
            async for piece in _sized(reader, size):
                yield piece
            await reader.readexactly(2)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        raise _UpstreamBroken(f"broken chunked body ({type(exc).__name__})") from exc


async def _until_eof(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while data := await reader.read(CHUNK):
        yield data


async def close_quietly(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` and wait for it, ignoring a peer that is already gone."""
    writer.close()
    with contextlib.suppress(OSError, asyncio.CancelledError):
        await writer.wait_closed()
