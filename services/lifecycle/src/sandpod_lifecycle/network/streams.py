"""Byte streams over the proxy's non-blocking sockets: plain TCP and TLS through memory BIOs.

Why memory BIOs instead of ``loop.start_tls``: the proxy has already *read* the ClientHello to
check its SNI, and those bytes must be the first the TLS server side consumes;
``ssl.SSLObject`` lets them be fed in (``prefix``) before anything else. The same class is the
client side towards the real server (``server_side=False``), verifying its certificate.

One task reads a stream and another may write it at the same time (request and response
directions); writes, including the TLS records a read produces, go out under one lock so two
writers never interleave bytes on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

from sandpod_lifecycle.network.splice import send_all, wait_readable

__all__ = ["RECV_SIZE", "SocketStream", "Stream", "TlsStream"]

RECV_SIZE = 256 * 1024


class Stream:
    """A bidirectional byte stream: ``read`` returns b"" at EOF."""

    async def read(self, n: int = RECV_SIZE) -> bytes:
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        raise NotImplementedError

    async def close_write(self) -> None:
        raise NotImplementedError


class SocketStream(Stream):
    def __init__(self, sock: socket.socket, prefix: bytes = b"") -> None:
        sock.setblocking(False)
        self.sock = sock
        self._prefix = prefix
        self._lock = asyncio.Lock()

    async def read(self, n: int = RECV_SIZE) -> bytes:
        if self._prefix:
            out, self._prefix = self._prefix[:n], self._prefix[n:]
            return out
        while True:
            try:
                return self.sock.recv(n)
            except BlockingIOError:
                await wait_readable(self.sock)

    async def write(self, data: bytes) -> None:
        async with self._lock:
            await send_all(self.sock, data)

    async def close_write(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)


class TlsStream(Stream):
    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        prefix: bytes = b"",
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        if prefix:
            self._in.write(prefix)
        self._lock = asyncio.Lock()

    @property
    def peer_certificate(self) -> dict[str, object] | None:
        cert = self._ssl.getpeercert()
        return dict(cert) if cert else None

    async def _flush(self) -> None:
        async with self._lock:
            data = self._out.read()
            if data:
                await send_all(self.sock, data)

    async def _feed(self) -> None:
        while True:
            try:
                data = self.sock.recv(RECV_SIZE)
            except BlockingIOError:
                await wait_readable(self.sock)
                continue
            if data:
                self._in.write(data)
            else:
                self._in.write_eof()
            return

    async def handshake(self) -> None:
        """Complete the handshake. Raises ssl.SSLError (bad peer, failed verification) or
        ConnectionError (EOF before the end)."""
        while True:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                if self._in.eof:
                    raise ConnectionError("EOF during the TLS handshake") from None
                await self._feed()
                continue
            await self._flush()
            return

    async def read(self, n: int = RECV_SIZE) -> bytes:
        while True:
            try:
                return self._drain(self._ssl.read(n), n)
            except ssl.SSLWantReadError:
                await self._flush()
                if self._in.eof:
                    return b""
                await self._feed()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def _drain(self, first: bytes, n: int) -> bytes:
        """``first`` plus whatever else is already decryptable, up to ``n`` bytes: one TLS
        record is at most 16 KiB, one socket read brings many (one wake-up per read, not per
        record)."""
        if not first or len(first) >= n or not self._in.pending:
            return first
        parts = [first]
        size = len(first)
        while size < n and (self._in.pending or self._ssl.pending()):
            try:
                more = self._ssl.read(n - size)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            if not more:
                break
            parts.append(more)
            size += len(more)
        return b"".join(parts)

    async def write(self, data: bytes) -> None:
        self._ssl.write(data)
        await self._flush()

    async def close_write(self) -> None:
        with contextlib.suppress(ssl.SSLError, OSError):
            self._ssl.unwrap()
        with contextlib.suppress(OSError):
            await self._flush()
            self.sock.shutdown(socket.SHUT_WR)
