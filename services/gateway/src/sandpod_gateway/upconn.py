"""Keep-alive HTTP/1.1 connections from the gateway to sandboxes' ports, as asyncio protocols:
the upstream side of the preview fast path (:mod:`sandpod_gateway.front`).

Why protocols and not streams (the slow path, :mod:`sandpod_gateway.proxy`): a response is parsed
by httptools as it arrives and each piece goes to the client's transport from the parser's
callback, with no task switch and no ASGI message per piece. On loopback that is most of what a
preview round trip costs (``bench/preview.py``).

Responses are re-framed, never passed on raw: the head is rebuilt from the parsed fields
(hop-by-hop headers, ``date`` and ``server`` dropped; the gateway's own added), the body is what
the parser delivers (a body without a length is re-chunked), and a connection that sends anything
after the end of its response is closed. So a sandbox's app cannot smuggle a second response onto
a client connection that the next request, for another sandbox, may use.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

import httptools

from sandpod_gateway.errors import port_unreachable
from sandpod_gateway.idle import IdleConnections
from sandpod_gateway.proxy import HOP_BY_HOP

__all__ = ["ClientSide", "UpstreamBroken", "UpstreamConnection", "UpstreamPool"]

_DROPPED = HOP_BY_HOP | {b"date", b"server"}
_NO_BODY = frozenset({204, 304})


class ClientSide(Protocol):
    """Where a response goes: the client connection of the request."""

    def writelines(self, data: list[bytes]) -> None: ...

    def hold_reading(self, hold: bool) -> None: ...

    def response_end(
        self, conn: UpstreamConnection, status: int, reusable: bool, error: UpstreamBroken | None
    ) -> None:
        """The exchange is over (called once per :meth:`UpstreamConnection.begin`, after the
        last of its bytes went to :meth:`writelines`): ``status``, whether the connection may
        carry another request, or the ``error`` that ended it."""


class UpstreamBroken(Exception):
    """The upstream closed, or spoke something that is not HTTP/1.x; ``started`` says whether
    the client already got the response's head (then the response can only be cut off, and
    ``status`` is the one it got)."""

    def __init__(self, message: str, started: bool, status: int = 0) -> None:
        super().__init__(message)
        self.started = started
        self.status = status


class _Junk(Exception):
    """Bytes after the end of the response: the connection is closed, the bytes dropped."""


class UpstreamConnection(asyncio.Protocol):
    """One TCP connection to ``address:port``, carrying one request at a time."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._client: ClientSide | None = None
        self._extra: list[bytes] = []
        self._end: tuple[ClientSide, bool, UpstreamBroken | None] | None = None  # to report
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._status = 0
        self._started = False
        self._chunked = False  # re-chunked to the client
        self._until_eof = False  # the upstream frames the body by closing
        self._interim = False
        self._complete = True
        self._out: list[bytes] = []  # for the client, written once per read (one syscall)

    # -- one exchange ----------------------------------------------------------------------------

    def begin(self, client: ClientSide, head: bytes, extra: list[bytes]) -> None:
        """Send a request's ``head`` (its body follows through :meth:`write`); the response goes
        to ``client`` with ``extra`` header lines added, and its end to
        ``client.response_end`` (no future, no task: the next pipelined request can start
        from that call)."""
        if self.transport is None:
            raise RuntimeError("begin() before the connection was made")
        self._client = client
        self._extra = extra
        self._end = None
        self._reason, self._headers, self._status = b"", [], 0
        self._started = self._chunked = self._until_eof = self._interim = False
        self._complete = False
        self.transport.write(head)

    def write(self, body: bytes) -> None:
        """A piece of the request's body."""
        if self.transport is not None and not self.closed:
            self.transport.write(body)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self._complete:  # nobody asked: an idle connection talks, it is not HTTP
            self.close()
            return
        client = self._client
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            self.close()  # _Junk: what the response itself held still goes out
        except httptools.HttpParserError as exc:
            self.close()
            self._fail(f"not an HTTP/1.x response ({exc})")
        finally:
            self._flush(client)
        self._report()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._complete:
            return
        if self._until_eof and self._started:
            client = self._client
            self._finish(reusable=False)  # the close is the end of this body
            self._flush(client)
        else:
            self._fail("the sandbox's port closed the connection" + (f" ({exc})" if exc else ""))
        self._report()

    def pause_writing(self) -> None:
        if self._client is not None:
            self._client.hold_reading(True)

    def resume_writing(self) -> None:
        if self._client is not None:
            self._client.hold_reading(False)

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            raise _Junk

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            if status == 101:  # the fast path never asks to switch protocols
                raise _Junk
            self._interim = True  # 1xx (103 Early Hints, a stray 100): not relayed
            self._reason, self._headers = b"", []
            return
        self._status = status
        kept = [(k, v) for k, v in self._headers if k not in _DROPPED]
        sized = any(k == b"content-length" for k, _ in kept)
        lines = [b"HTTP/1.1 %d %b\r\n" % (status, self._reason)]
        if status not in _NO_BODY and not sized:
            self._chunked = True
            self._until_eof = not any(k == b"transfer-encoding" for k, _ in self._headers)
            lines.append(b"transfer-encoding: chunked\r\n")
        lines += [k + b": " + v + b"\r\n" for k, v in kept]
        lines += self._extra
        lines.append(b"\r\n")
        self._started = True
        self._out.append(b"".join(lines))

    def on_body(self, body: bytes) -> None:
        if self._chunked:
            self._out += (b"%x\r\n" % len(body), body, b"\r\n")
        else:
            self._out.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._finish(reusable=self._parser.should_keep_alive() and not self._until_eof)

    # -- ends ------------------------------------------------------------------------------------

    def _finish(self, reusable: bool) -> None:
        if self._chunked:
            self._out.append(b"0\r\n\r\n")
        self._complete = True
        if self._client is not None:
            self._end = (self._client, reusable, None)
        self._client = None

    def _flush(self, client: ClientSide | None) -> None:
        if self._out:
            out, self._out = self._out, []
            if client is not None:
                client.writelines(out)

    def _fail(self, message: str) -> None:
        self._complete = True
        if self._client is not None:
            self._end = (self._client, False, UpstreamBroken(message, self._started, self._status))
        self._client = None

    def _report(self) -> None:
        """The exchange's end to its client, once its bytes are written (last: the client may
        start another exchange on this connection from the call)."""
        if self._end is not None:
            client, reusable, error = self._end
            self._end = None
            client.response_end(self, self._status, reusable, error)


class UpstreamPool:
    """Idle keep-alive connections per (address, port), at most ``max_idle`` each and
    ``max_total`` in all (the least recently used target's go first)."""

    def __init__(self, connect_timeout: float, max_idle: int = 32, max_total: int = 512) -> None:
        self._timeout = connect_timeout
        self._idle: IdleConnections[UpstreamConnection] = IdleConnections(
            UpstreamConnection.close, max_idle, max_total
        )

    def idle(self, address: str, port: int) -> UpstreamConnection | None:
        """An idle connection to ``address:port`` that is still open, or None."""
        conn = self._idle.take((address, port), _open)
        if conn is not None:
            conn.reused = True
        return conn

    async def connect(self, address: str, port: int) -> UpstreamConnection:
        """A new connection.

        Raises:
            PortUnreachable: nothing accepts connections there within the connect timeout.
        """
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection((address, port)), address, port
                )
        except (OSError, TimeoutError) as exc:
            raise port_unreachable(port, exc) from exc
        return conn

    def release(self, conn: UpstreamConnection, reusable: bool) -> None:
        if not reusable or conn.closed:
            conn.close()
        else:
            self._idle.keep(conn.key, conn)

    def close(self) -> None:
        self._idle.close_all()


def _open(conn: UpstreamConnection) -> bool:
    return not conn.closed
