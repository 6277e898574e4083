"""HTTP/1.1 requests from a sandbox, one by one: checked, rewritten, streamed to the server.

Used for plain HTTP (every request's ``Host`` must stay the name the connection was allowed
for: a keep-alive connection to a shared address could otherwise switch to a denied name on
its second request) and for intercepted TLS (the same, plus the secret's header). Only the
request direction is parsed: the proxy holds one upstream connection per sandbox connection,
so responses are streamed back as bytes without being understood (pipelining, ``100
Continue``, long polls, SSE all work), and bodies in both directions are streamed in bounded
pieces, never buffered whole.

The request grammar is strict where lenience lets a request be read two ways (request
smuggling): no obsolete line folding, ``Transfer-Encoding`` only ``chunked`` and never with
``Content-Length``, one ``Content-Length`` value, chunk sizes in hex with sane lengths, heads
at most :data:`MAX_HEAD` bytes. After an ``Upgrade`` or ``CONNECT`` request the connection is
no longer HTTP and the rest of it is copied as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import ssl
from collections.abc import Awaitable, Callable

from sandpod_lifecycle.network.sniff import host_name
from sandpod_lifecycle.network.streams import RECV_SIZE, Stream

__all__ = [
    "MAX_HEAD",
    "Head",
    "HttpRefusal",
    "HttpSession",
    "Reader",
    "forward_requests",
    "refusal_bytes",
]

MAX_HEAD = 64 * 1024
MAX_HEADERS = 200
MAX_CHUNK_LINE = 1024
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class HttpRefusal(Exception):
    """A request the proxy answers itself (``status``) and after which it closes."""

    def __init__(self, status: int, reason: str, detail: str, rule: str = "bad-request") -> None:
        super().__init__(f"{status} {reason}: {detail}")
        self.status = status
        self.reason = reason
        self.detail = detail
        self.rule = rule  # for the denial event: bad-request | host-mismatch


def refusal_bytes(status: int, reason: str, detail: str) -> bytes:
    body = f"sandpod egress: {detail}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class Reader:
    """Buffered reads from a :class:`Stream` (with bytes already read in front)."""

    def __init__(self, stream: Stream, prefix: bytes = b"") -> None:
        self.stream = stream
        self.buf = bytearray(prefix)

    async def _fill(self) -> bool:
        data = await self.stream.read(RECV_SIZE)
        self.buf += data
        return bool(data)

    async def until(self, marker: bytes, limit: int) -> bytes | None:
        """Bytes up to and including ``marker``; None at EOF before any byte."""
        while (end := self.buf.find(marker)) < 0:
            if len(self.buf) > limit:
                raise HttpRefusal(431, "Request Header Fields Too Large", "request head too large")
            if not await self._fill():
                if not self.buf:
                    return None
                raise HttpRefusal(400, "Bad Request", "connection ended inside a request head")
        out = bytes(self.buf[: end + len(marker)])
        del self.buf[: end + len(marker)]
        return out

    async def some(self, most: int) -> bytes:
        if not self.buf and not await self._fill():
            return b""
        out = bytes(self.buf[:most])
        del self.buf[:most]
        return out

    async def exactly(self, n: int, sink: Stream) -> None:
        while n:
            data = await self.some(min(n, RECV_SIZE))
            if not data:
                raise HttpRefusal(400, "Bad Request", "connection ended inside a request body")
            await sink.write(data)
            n -= len(data)


@dataclasses.dataclass(slots=True)
class Head:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    def replace(self, name: str, value: str) -> None:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != name.lower()]
        self.headers.append((name, value))

    def encode(self) -> bytes:
        lines = [f"{self.method} {self.target} {self.version}"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(raw: bytes) -> Head:
    """A request head (ending in CRLF CRLF). Raises HttpRefusal(400) for anything ambiguous."""
    lines = raw[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if (
        len(parts) != 3
        or parts[2] not in ("HTTP/1.1", "HTTP/1.0")
        or not _TOKEN.fullmatch(parts[0])
    ):
        raise HttpRefusal(400, "Bad Request", "bad request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpRefusal(431, "Request Header Fields Too Large", "too many headers")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):  # also refuses obs-fold (leading space)
            raise HttpRefusal(400, "Bad Request", "malformed header line")
        if any(c in value for c in "\0\r\n"):
            raise HttpRefusal(400, "Bad Request", "control character in a header")
        headers.append((name, value.strip(" \t")))
    return Head(parts[0], parts[1], parts[2], headers)


def body_length(head: Head) -> int | None:
    """Content-Length, or None for a chunked body. Raises HttpRefusal for ambiguous framing."""
    te = head.values("transfer-encoding")
    cl = head.values("content-length")
    if te:
        if cl:
            raise HttpRefusal(400, "Bad Request", "both Transfer-Encoding and Content-Length")
        if len(te) != 1 or te[0].lower() != "chunked":
            raise HttpRefusal(501, "Not Implemented", "only Transfer-Encoding: chunked")
        return None
    values = {v.strip() for item in cl for v in item.split(",")}
    if not values:
        return 0
    if len(values) != 1 or not next(iter(values)).isdigit() or len(next(iter(values))) > 18:
        raise HttpRefusal(400, "Bad Request", "bad Content-Length")
    return int(next(iter(values)))


async def _copy_chunked(reader: Reader, sink: Stream) -> None:
    while True:
        line = await reader.until(b"\r\n", MAX_CHUNK_LINE)
        if line is None:
            raise HttpRefusal(400, "Bad Request", "connection ended inside a chunked body")
        size_text = line[:-2].split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 15 or not re.fullmatch(rb"[0-9A-Fa-f]+", size_text):
            raise HttpRefusal(400, "Bad Request", "bad chunk size")
        size = int(size_text, 16)
        await sink.write(line)
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = await reader.until(b"\r\n", MAX_CHUNK_LINE)
                if trailer is None:
                    raise HttpRefusal(400, "Bad Request", "connection ended inside trailers")
                await sink.write(trailer)
                if trailer == b"\r\n":
                    return
        await reader.exactly(size, sink)
        crlf = await reader.until(b"\r\n", 2)
        if crlf != b"\r\n":
            raise HttpRefusal(400, "Bad Request", "chunk not followed by CRLF")
        await sink.write(crlf)


def check_host(head: Head, name: str) -> None:
    """Refuse a request whose Host, absolute target or ``CONNECT`` target is not ``name`` (a
    ``CONNECT`` through an allowed name's server to another host would tunnel there, with the
    injected header in its head)."""
    hosts = head.values("host")
    if len(hosts) != 1:
        raise HttpRefusal(400, "Bad Request", "a request needs exactly one Host header")
    host = _authority_host(hosts[0])
    if host_name(host) != name:
        raise HttpRefusal(
            403, "Forbidden", f"Host {host!r} is not {name}, the allowed name", "host-mismatch"
        )
    lowered = head.target.lower()
    target_host = None
    if lowered.startswith(("http://", "https://")):
        target_host = lowered.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    elif head.method.upper() == "CONNECT":  # authority-form: a tunnel to that host
        target_host = lowered
    if target_host is not None and host_name(_authority_host(target_host)) != name:
        raise HttpRefusal(403, "Forbidden", "request target names another host", "host-mismatch")


def _authority_host(authority: str) -> str:
    """The host of ``host[:port]`` or ``[v6][:port]``."""
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if authority.rsplit(":", 1)[-1].isdigit() else authority


async def forward_requests(
    reader: Reader,
    name: str,
    upstream: Stream,
    rewrite: Callable[[Head], None] | None = None,
) -> bool:
    """Forward requests from ``reader`` to ``upstream`` until the client's EOF or an upgrade.

    Each request's Host must be ``name``; ``rewrite`` edits each head (the secret's header).
    Returns True when the connection switched protocols (the caller copies the rest raw).
    Raises HttpRefusal for a request the proxy refuses (nothing of it was forwarded).
    """
    while True:
        raw = await reader.until(b"\r\n\r\n", MAX_HEAD)
        if raw is None:
            return False
        head = parse_head(raw)
        check_host(head, name)
        length = body_length(head)
        if rewrite is not None:
            rewrite(head)
        await upstream.write(head.encode())
        if length is None:
            await _copy_chunked(reader, upstream)
        else:
            await reader.exactly(length, upstream)
        connection = {t.strip().lower() for v in head.values("connection") for t in v.split(",")}
        if head.method == "CONNECT" or ("upgrade" in connection and head.values("upgrade")):
            return True


class HttpSession:
    """One sandbox connection's requests forwarded to one upstream connection, the responses
    copied back by ``responses`` (a splice or a TLS copy, which leaves the client's write side
    open: the session half-closes it, or first answers a refused request) running alongside."""

    def __init__(
        self,
        client: Stream,
        reader: Reader,
        name: str,
        upstream: Stream,
        rewrite: Callable[[Head], None] | None,
    ) -> None:
        self.client = client
        self.reader = reader
        self.name = name
        self.upstream = upstream
        self.rewrite = rewrite

    async def run(
        self, responses: Callable[[], Awaitable[None]], grace: float
    ) -> HttpRefusal | None:
        """Forward until the client is done; returns the refusal that ended it, if any (the
        client got the refusal as a response once the earlier responses were through)."""
        refusing = False

        async def copy_back() -> None:
            with contextlib.suppress(OSError, ssl.SSLError):
                await responses()
                if not refusing:
                    await self.client.close_write()

        async with asyncio.TaskGroup() as tg:
            back = tg.create_task(copy_back())
            try:
                if await forward_requests(self.reader, self.name, self.upstream, self.rewrite):
                    while data := await self.reader.some(RECV_SIZE):
                        await self.upstream.write(data)
                await self.upstream.close_write()
                return None
            except HttpRefusal as refusal:
                refusing = True
                await self.upstream.close_write()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        await asyncio.shield(back)
                back.cancel()
                with contextlib.suppress(OSError, ssl.SSLError):
                    await self.client.write(
                        refusal_bytes(refusal.status, refusal.reason, refusal.detail)
                    )
                    await self.client.close_write()
                return refusal
            except (OSError, ssl.SSLError):
                back.cancel()
                return None
