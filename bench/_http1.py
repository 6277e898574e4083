"""A minimal HTTP/1.1 keep-alive client for benchmarks: one connection, one request at a time.

Why not httpx: measured in the same run, httpx's own per-request cost on this path (about 3 ms)
is several times the gateway's, so a ratio through it says more about the Python HTTP client
than about the gateway. This client writes each request in one ``write`` and reads a
``Content-Length`` body, which is all the gateway's JSON endpoints answer with, so what it
measures is the gateway (and the socket), as a client such as curl or Go's net/http would.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class Http1:
    """``async with Http1(base, key) as c: status, body = await c.post_json(path, data)``."""

    def __init__(self, base: str, key: str) -> None:
        parts = urlsplit(base)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._auth = f"authorization: Bearer {key}\r\n"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Http1:
        await self._connect()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._close()

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)

    async def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def post_json(self, path: str, data: Any) -> tuple[int, Any]:
        """One POST with a JSON body; (status, decoded JSON reply). A connection the server
        closed while idle (its keep-alive timeout) is replaced once, as any client does."""
        body = json.dumps(data).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self._host}\r\n{self._auth}"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            raw = await self._send(head + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            await self._close()
            await self._connect()
            raw = await self._send(head + body)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return status, json.loads(await self._reader.readexactly(length))  # type: ignore[union-attr]

    async def _send(self, request: bytes) -> bytes:
        if self._reader is None or self._writer is None:
            raise RuntimeError("use `async with Http1(...)`")
        self._writer.write(request)
        return await self._reader.readuntil(b"\r\n\r\n")
