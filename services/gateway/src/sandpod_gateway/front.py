"""The gateway's HTTP/1.1 front: preview requests relayed on a fast path, everything else handed
to uvicorn.

Every connection starts here (uvicorn's ``http`` protocol is :class:`FrontProtocol`). Each request
head is cut from the raw bytes. A preview request (:mod:`sandpod_gateway.preview`) the fast path
can carry is admitted by the same :class:`~sandpod_gateway.preview.PreviewGate` code as on the
slow path, relayed through :mod:`sandpod_gateway.upconn` and logged with the middleware's line
and metrics. At the first request it cannot carry -- an API call, a WebSocket upgrade, anything
below -- the connection is handed, from that request's first byte, to uvicorn's own protocol for
good, so the rest of the gateway sees exactly what it saw before.

The fast path carries a request that is HTTP/1.1, neither HEAD nor CONNECT, has no body or a
Content-Length one, no ``Expect``, no ``Upgrade``, a head of strict CRLF lines within the header
limit, and is neither a link's first hit (``?token=``: it sets a cookie) nor the path form's bare
prefix (a redirect). Its refusals are the middleware's JSON errors.

A connection keeps its last admission (:class:`~sandpod_gateway.preview.Pass`): its next
request with the same credential headers for the same sandbox port is admitted from it while the
key's and the Sandbox's records it was decided on are still the gateway's cached ones (see
:meth:`~sandpod_gateway.preview.PreviewGate.recall`). Such a request on a kept upstream
connection -- every request but a connection's first -- is written upstream from
``data_received`` and its response's end comes back by a call, with no task and no future.

Why (``bench/preview.py``): through uvicorn, the ASGI app and asyncio streams the gateway added
~0.28 ms to a round trip that takes the app 0.1 ms; a relay on protocols adds a few hundredths.
"""

from __future__ import annotations

import asyncio
import functools
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import Any, cast

import httptools
import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sandpod_contract.errors import InternalError, SandpodError
from sandpod_gateway.context import Context
from sandpod_gateway.errors import no_http_response
from sandpod_gateway.middleware import (
    PREVIEW_HOST,
    PREVIEW_PATH,
    record,
    refusal,
    refusal_headers,
    request_id,
)
from sandpod_gateway.native import NativeFront, peer_of
from sandpod_gateway.preview import Admitted, Pass, PreviewGate, PreviewRoute
from sandpod_gateway.upconn import UpstreamBroken, UpstreamConnection, UpstreamPool

__all__ = ["FastPath", "FrontProtocol"]

log = structlog.get_logger("sandpod.gateway.front")

_HEAD_END = b"\r\n\r\n"
_SLOW_METHODS = frozenset({b"HEAD", b"CONNECT"})
_HOLD_AT = 1 << 20  # pipelined bytes buffered before reading pauses


class FastPath:
    """What every front connection shares: the gate, the upstream pool, the limits."""

    def __init__(self, ctx: Context, native: NativeFront | None = None) -> None:
        self.ctx = ctx
        self.gate = PreviewGate(ctx)
        self.pool = UpstreamPool(ctx.settings.preview_connect_timeout)
        self.max_head = ctx.settings.max_header_bytes
        # behind sandpod-front (native.py): connections come from it alone, naming the client;
        # admissions it may keep go back to it as passes
        self.native = native

    def close(self) -> None:
        self.pool.close()


class _Head:
    """httptools' callbacks for one request head."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.done = True


class _Request:
    """A request the fast path carries, from its head to its log line."""

    __slots__ = (
        "address",
        "body",
        "close",
        "epoch",
        "extra",
        "head",
        "retried",
        "rid",
        "route",
        "sandbox",
        "scope",
        "started",
        "tenant",
    )

    def __init__(self, scope: dict[str, Any], route: PreviewRoute, body: int, close: bool) -> None:
        self.started = time.perf_counter()
        self.scope = scope
        self.route = route
        self.body = body  # Content-Length
        self.close = close  # the client said Connection: close
        self.rid = request_id(scope["headers"])
        self.tenant = ""
        self.sandbox: str | None = None
        self.address = ""
        self.head = b""  # for the upstream
        self.extra: list[bytes] = []  # header lines the response gets
        self.retried = False  # on a new connection, after a kept one turned out stale
        self.epoch = 0  # the native front's epoch when the decision began


class FrontProtocol(asyncio.Protocol):
    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        fast: FastPath,
    ) -> None:
        self._uvicorn = functools.partial(
            HttpToolsProtocol,
            config=config,
            server_state=server_state,
            app_state=app_state,
            _loop=_loop,
        )
        self._fast = fast
        self._server_state = server_state
        self._keepalive = float(config.timeout_keep_alive)
        self.transport: asyncio.Transport | None = None
        # the loop, asked once: asyncio.get_running_loop() costs a getpid() syscall per call
        # (fork detection), a tenth of the gateway's CPU per preview request when asked per use
        self._loop = _loop or asyncio.get_event_loop()
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self._buf = bytearray()
        self._busy = False  # a request is being relayed
        self._body_left = 0  # of that request's body, still to come from the client
        self._pending: list[bytes] | None = None  # body bytes before the upstream is there
        self._upstream: UpstreamConnection | None = None
        self._req: _Request | None = None  # the request being relayed
        self._pass: Pass | None = None  # the last admission, for the next request to reuse
        self._holds: set[str] = set()  # why reading is paused
        self._write_paused = False
        self._closing = False
        self._handed = False
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._client = _addr(transport.get_extra_info("peername"))
        self._server = _addr(transport.get_extra_info("sockname"))
        self._server_state.connections.add(self)
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self._body_left:
            piece = data[: self._body_left]
            self._body_left -= len(piece)
            self._forward(piece)
            data = data[len(piece) :]
            if not data:
                return
        self._buf += data
        if self._busy:
            if len(self._buf) > _HOLD_AT:
                self.hold_reading(True, "pipelined")  # the next requests wait for this response
            return
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server_state.connections.discard(self)
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self._upstream is not None:
            self._upstream.close()  # the response has nowhere to go: never reused (its end,
            # reported by the upstream's connection_lost, logs the request)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.resume_reading()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after this response."""
        self._closing = True
        if not self._busy and self.transport is not None:
            self.transport.close()

    # -- ClientSide (upconn) ---------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def writelines(self, data: list[bytes]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(data)

    def hold_reading(self, hold: bool, why: str = "upstream") -> None:
        """Pause reading the client while anyone has a reason to (the upstream's write
        buffer is full, a body waits for its connection, pipelined requests wait)."""
        if self.transport is None or self._handed:
            return
        before = bool(self._holds)
        if hold:
            self._holds.add(why)
        else:
            self._holds.discard(why)
        if before != bool(self._holds):
            (self.transport.pause_reading if self._holds else self.transport.resume_reading)()

    # -- requests --------------------------------------------------------------------------------

    def _next(self) -> None:
        """Start the next request in the buffer, if its head is complete."""
        end = self._buf.find(_HEAD_END)
        if end < 0:
            if len(self._buf) > self._fast.max_head or b"\n\n" in self._buf:
                self._hand_off()
            return
        head = bytes(self._buf[: end + 4])
        req = self._parse(head)
        if req is None:
            self._hand_off()
            return
        del self._buf[: end + 4]
        self._busy = True
        body = bytes(self._buf[: req.body])
        del self._buf[: len(body)]
        self._body_left = req.body - len(body)
        self._pending = [body] if body else []
        self._req = req
        self._guarded(req, self._start, req)

    def _parse(self, head: bytes) -> _Request | None:
        """The request ``head`` opens, if the fast path can carry it (see the module)."""
        parsed = _parse_head(head, self._fast.max_head)
        if parsed is None:
            return None
        method, url, headers, length, close = parsed
        raw_path = url.path or b"/"
        path = raw_path.decode("ascii", "replace")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "root_path": "",
            "headers": headers,
            "client": peer_of(headers) if self._fast.native else self._client,
            "server": self._server,
            "state": {},
        }
        route = self._fast.gate.match(scope)
        if route is None or (not route.by_host and not route.path):
            return None  # an API request, or the path form's bare prefix (a redirect)
        query = scope["query_string"]
        if b"token=" in query and any(p.startswith(b"token=") for p in query.split(b"&")):
            return None  # a link's first hit sets its cookie: the slow path does that
        return _Request(scope, route, length, close)

    # A request goes: _next -> (recall, or the _admit task) -> _admitted -> (an idle upstream
    # connection, or the _connect task) -> _send -> response_end -> _end. With the admission
    # recalled and a kept connection, which is every request but a connection's first, no task
    # or future is made and the request is written upstream from data_received.

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._server_state.tasks.add(task)
        task.add_done_callback(self._server_state.tasks.discard)

    def _guarded(self, req: _Request, step: Callable[..., None], *args: Any) -> None:
        """Run ``step(*args)``; a bug in it ends ``req`` with a 500, not the connection's loop."""
        try:
            step(*args)
        except Exception as exc:
            self._crashed(req, exc)

    def _start(self, req: _Request) -> None:
        if self._fast.native is not None:
            req.epoch = self._fast.native.epoch.value
        ok = self._fast.gate.recall(self._pass, req.scope, req.route)
        if ok is None:
            self._spawn(self._admit(req))
        else:
            self._admitted(req, ok)

    async def _admit(self, req: _Request) -> None:
        try:
            ok, self._pass = await self._fast.gate.admit_for(req.scope, req.route)
        except SandpodError as exc:
            self._refused(req, exc)
            return
        except Exception as exc:
            self._crashed(req, exc)
            return
        self._guarded(req, self._admitted, req, ok)

    def _admitted(self, req: _Request, ok: Admitted) -> None:
        if self.transport is None or self.transport.is_closing():
            self._end(req, 0, True)  # the client left meanwhile
            return
        req.sandbox = ok.target.sandbox_id
        req.tenant = ok.tenant or ""
        req.address = ok.address
        req.head, req.extra = self._heads(req)
        native, kept = self._fast.native, self._pass
        if native is not None and kept is not None and kept.admitted is ok:
            line = native.pass_line(self._fast.gate, kept, req.scope, req.route, epoch=req.epoch)
            if line is not None:
                req.extra.append(line)
        conn = self._fast.pool.idle(req.address, req.route.port)
        if conn is None:
            self._spawn(self._connect(req))
        else:
            self._send(req, conn)

    async def _connect(self, req: _Request) -> None:
        try:
            conn = await self._fast.pool.connect(req.address, req.route.port)
        except SandpodError as exc:  # nothing accepts connections on the port
            self._refused(req, exc)
            return
        except Exception as exc:
            self._crashed(req, exc)
            return
        if self.transport is None or self.transport.is_closing():
            self._fast.pool.release(conn, True)  # the client left meanwhile
            self._end(req, 0, True)
            return
        self._guarded(req, self._send, req, conn)

    def _heads(self, req: _Request) -> tuple[bytes, list[bytes]]:
        """The request head for the upstream; the header lines the response gets."""
        gate = self._fast.gate
        headers = gate.upstream_headers(req.scope, req.route, req.address)
        if req.body:
            headers.append((b"content-length", str(req.body).encode()))
        lines = [
            b"%b %b HTTP/1.1\r\n"
            % (req.scope["method"].encode(), gate.target(req.scope, req.route))
        ]
        lines += [k + b": " + v + b"\r\n" for k, v in headers]
        lines.append(b"\r\n")
        extra = [b"x-request-id: " + req.rid.encode() + b"\r\n"]
        extra += [k + b": " + v + b"\r\n" for k, v in self._server_state.default_headers]
        if req.close or self._closing:
            extra.append(b"connection: close\r\n")
        return b"".join(lines), extra

    def _send(self, req: _Request, conn: UpstreamConnection) -> None:
        self._upstream = conn
        if conn.transport is not None:
            # a kept connection may come back paused: its last response ended in the read that
            # filled its client's buffer (pause_writing paused it; resume_writing found no
            # upstream to resume), and a paused connection never reads its next response
            if self._write_paused:
                conn.transport.pause_reading()
            else:
                conn.transport.resume_reading()
        conn.begin(self, req.head, req.extra)
        self._flush()

    def response_end(
        self, conn: UpstreamConnection, status: int, reusable: bool, error: UpstreamBroken | None
    ) -> None:
        """upconn: the response is over (its bytes are written)."""
        req = self._req
        if req is None or conn is not self._upstream:  # its request ended already (a crash)
            conn.close()
            return
        self._upstream = None
        if error is None:
            self._fast.pool.release(conn, reusable and not self._body_left)
            self._end(req, status, req.close)
            return
        conn.close()
        if not error.started and conn.reused and not req.body and not req.retried:
            req.retried = True  # a stale keep-alive connection: nothing reached the app
            self._spawn(self._connect(req))
        elif error.started:
            log.info("preview_upstream_cut", port=req.route.port, error=str(error))
            self._end(req, error.status, True)  # the status the client got before the cut
        else:
            self._end(req, self._refuse(no_http_response(req.route.port, error), req.rid), True)

    def _refused(self, req: _Request, exc: SandpodError) -> None:
        # a refused request's body is never read: the connection cannot go on
        close = req.close or self._body_left > 0
        self._fast.ctx.metrics.rejected.labels(exc.code.split(".", 1)[0]).inc()
        self._end(req, self._refuse(exc, req.rid, close), close)

    def _crashed(self, req: _Request, exc: Exception) -> None:
        log.error("preview_crashed", port=req.route.port, exc_info=exc)
        if self._req is not req:
            return  # it already ended
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        self._end(req, self._refuse(InternalError("preview relay failed"), req.rid, True), True)

    def _end(self, req: _Request, status: int, close: bool) -> None:
        """The request's log line and metrics; then the next request, or the close."""
        route = PREVIEW_HOST if req.route.by_host else PREVIEW_PATH
        record(
            self._fast.ctx,
            req.scope["method"],
            route,
            status,
            time.perf_counter() - req.started,
            tenant=req.tenant,
            request_id=req.rid,
            sandbox_id=req.sandbox,
        )
        self._req = None
        self._done(close)

    def _forward(self, piece: bytes) -> None:
        """A piece of the current request's body: to the upstream, or kept until it is there."""
        if self._pending is not None:
            self._pending.append(piece)
            if sum(map(len, self._pending)) > _HOLD_AT:
                self.hold_reading(True, "body")
        elif self._upstream is not None:
            self._upstream.write(piece)

    def _flush(self) -> None:
        pending, self._pending = self._pending or [], None
        if self._upstream is not None:
            for piece in pending:
                self._upstream.write(piece)
        self.hold_reading(False, "body")

    def _refuse(self, error: SandpodError, rid: str, close: bool = True) -> int:
        status, headers, body = refusal(error, refusal_headers(error))
        lines = [b"HTTP/1.1 %d \r\n" % status]
        lines += [k + b": " + v + b"\r\n" for k, v in headers]
        lines.append(b"x-request-id: " + rid.encode() + b"\r\n")
        if close:
            lines.append(b"connection: close\r\n")
        self.write(b"".join(lines) + b"\r\n" + body)
        return status

    def _done(self, close: bool) -> None:
        self._busy = False
        self._upstream = None
        self._pending = None
        if self.transport is None or self.transport.is_closing():
            return
        if close or self._closing or self._body_left:
            self.transport.close()
            return
        for why in list(self._holds):
            self.hold_reading(False, why)
        if self._buf:
            self._next()
        else:
            self._idle()

    def _idle(self) -> None:
        """Close the connection after the keep-alive timeout without a request: one timer per
        timeout, not per request (it checks when the last request ended)."""
        self._idle_since = self._loop.time()
        if self._timer is None and self.transport is not None:
            self._timer = self._loop.call_later(self._keepalive, self._idle_check)

    def _idle_check(self) -> None:
        self._timer = None
        if self._busy or self.transport is None:
            return  # the end of the request re-arms it
        left = self._idle_since + self._keepalive - self._loop.time()
        if left > 0:
            self._timer = self._loop.call_later(left, self._idle_check)
        else:
            self.transport.close()

    def _hand_off(self) -> None:
        """From the buffer's first byte on, this connection is uvicorn's."""
        if self.transport is None:
            return
        self._handed = True
        if self._timer is not None:
            self._timer.cancel()
        self._server_state.connections.discard(self)
        proto = self._uvicorn()
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        if self._holds:
            self._holds.clear()
            self.transport.resume_reading()
        data, self._buf = bytes(self._buf), bytearray()
        if data:
            proto.data_received(data)


def _parse_head(
    head: bytes, max_head: int
) -> tuple[str, Any, list[tuple[bytes, bytes]], int, bool] | None:
    """(method, parsed URL, headers, Content-Length, Connection: close) of a request head the
    fast path can carry, else None."""
    lines = head.count(b"\r\n")
    if len(head) > max_head or head.count(b"\r") != lines or head.count(b"\n") != lines:
        return None  # bare CR or LF: uvicorn's parser decides
    h = _Head()
    parser = httptools.HttpRequestParser(h)
    try:
        parser.feed_data(head)
        url = httptools.parse_url(h.url)
    except (
        httptools.HttpParserError,
        httptools.HttpParserUpgrade,
        httptools.HttpParserInvalidURLError,
    ):
        return None
    method = parser.get_method()
    if not h.done or parser.get_http_version() != "1.1" or method in _SLOW_METHODS:
        return None
    length = 0
    for name, value in h.headers:
        if name in (b"transfer-encoding", b"expect", b"upgrade"):
            return None
        if name == b"content-length":
            if not value.isdigit():
                return None
            length = int(value)
    return method.decode("ascii"), url, h.headers, length, not parser.should_keep_alive()


def _addr(value: object) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
