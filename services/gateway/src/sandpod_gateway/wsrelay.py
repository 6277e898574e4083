"""Byte relays for previews: a client's WebSocket to the sandbox app's WebSocket, and a
port-forward WebSocket to a plain TCP connection.

Preview WebSocket: the handshake is forwarded first (path, query, the client's subprotocols and
headers minus the gateway's own credentials), so the app chooses the subprotocol and may refuse;
only then does the gateway accept the client with the app's choice. Then two tasks copy messages
each way, text as text and binary as binary, until either side closes (its close code is passed
on). No message-size limit beyond uvicorn's: the app decides what it accepts.

Port-forward (``sandpod port-forward``): binary frames from the client are written to a TCP
connection to the port; what the port sends comes back as binary frames; a client close
closes the TCP connection, the text frame ``eof`` half-closes it (the local client shut its
write side), and the end of the TCP stream closes the WebSocket (1000).

Both sides apply backpressure (a send waits for the peer), so nothing is buffered without bound;
idle connections are kept open by protocol pings (uvicorn's, and the upstream client's).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from starlette.types import Message, Receive, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from sandpod_gateway.errors import PortUnreachable
from sandpod_gateway.proxy import ConnectionPool, close_quietly

__all__ = ["EOF_FRAME", "open_upstream_ws", "relay_tcp", "relay_ws"]

log = structlog.get_logger("sandpod.gateway.wsrelay")

TCP_CHUNK = 256 * 1024
EOF_FRAME = "eof"  # port-forward: the text frame that half-closes the TCP connection


async def open_upstream_ws(
    url: str,
    headers: list[tuple[str, str]],
    subprotocols: list[str],
    connect_timeout: float,
    keepalive: float,
) -> ClientConnection:
    """The app's WebSocket at ``url``.

    Raises:
        PortUnreachable: no connection, or the app refused the handshake.
    """
    try:
        return await connect(
            url,
            additional_headers=headers,
            subprotocols=[Subprotocol(p) for p in subprotocols] or None,
            open_timeout=connect_timeout,
            ping_interval=keepalive,
            ping_timeout=None,  # an app busy for a while is not dead
            max_size=None,
            compression=None,
            proxy=None,  # never a proxy from the gateway's environment
            user_agent_header=None,
        )
    except InvalidStatus as exc:
        raise PortUnreachable(
            f"the app refused the WebSocket handshake with HTTP {exc.response.status_code}",
            status=exc.response.status_code,
        ) from exc
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise PortUnreachable(
            f"no WebSocket on that port of the sandbox ({type(exc).__name__})"
        ) from exc


async def relay_ws(upstream: ClientConnection, receive: Receive, send: Send) -> None:
    """Accept the client (with the app's subprotocol) and copy messages both ways until one side
    closes."""
    accept: Message = {"type": "websocket.accept"}
    if upstream.subprotocol:
        accept["subprotocol"] = str(upstream.subprotocol)
    await send(accept)

    async def client_to_app() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(code=_close_code(message.get("code")))
                return
            if message["type"] != "websocket.receive":
                continue
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def app_to_client() -> None:
        try:
            async for data in upstream:
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(OSError, RuntimeError):
            await send({"type": "websocket.close", "code": _close_code(code)})

    try:
        await _first_done(client_to_app(), app_to_client())
    finally:
        await upstream.close()


async def relay_tcp(ws: WebSocket, address: str, port: int, connect_timeout: float) -> None:
    """Accept ``ws`` and relay it to ``address:port`` over TCP (refused before accepting with
    PortUnreachable if nothing listens there)."""
    conn = await ConnectionPool.connect(address, port, connect_timeout)
    reader, writer = conn.reader, conn.writer
    await ws.accept()

    async def client_to_port() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                writer.write(message["bytes"])
                await writer.drain()
            elif message.get("text") == EOF_FRAME and writer.can_write_eof():
                writer.write_eof()  # the local client half-closed: so does the port's peer

    async def port_to_client() -> None:
        while data := await reader.read(TCP_CHUNK):
            await ws.send_bytes(data)
        with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect):
            await ws.close(1000)

    try:
        await _first_done(client_to_port(), port_to_client())
    finally:
        await close_quietly(writer)


async def _first_done(*coros: object) -> None:
    """Run ``coros`` as owned tasks until the first ends; cancel and await the rest; re-raise
    the first failure that is not a closed connection."""
    tasks = [asyncio.ensure_future(c) for c in coros]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, (ConnectionError, ConnectionClosed, WebSocketDisconnect)):
            continue
        if isinstance(result, Exception):
            raise result


def _close_code(code: object) -> int:
    """A close code the other side may send (1005/1006 are not sendable: 1000 instead)."""
    if isinstance(code, int) and (code in (1000, 1001, 1002, 1003, 1007, 1008) or code >= 3000):
        return code
    return 1000
