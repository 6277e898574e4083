"""A web app to run inside a sandbox for the preview URL tests and bench/preview.py.

Standard library only (it must run on any sandbox image with a python3): an asyncio HTTP/1.1
keep-alive server on 0.0.0.0:<port> with

    GET  /echo...          JSON: method, path, query, headers (what the gateway forwarded)
    GET  /ping             "pong" (the round-trip benchmark)
    GET  /bytes?n=N        N bytes of a fixed 1 MiB pattern, with Content-Length
    GET  /sse?n=N          N server-sent events; event k+1 is sent once /release has been hit k
                           times, so a client proves it got event 1 before the server finished
    GET  /release          lets /sse send its next event
    GET  /poll?hold=S      answers after S seconds (a long poll)
    POST /upload           sha256 and length of the (Content-Length or chunked) body
    GET  /smuggle          "ok", then a second, forged response nobody asked for (an attack)
    GET  /unframed         a body with neither length nor chunks: it ends when the app closes
    GET  /hangup           closes the connection without answering
    GET  /cut              promises 100 bytes, sends 10, closes
    GET  /ws               WebSocket echo (text and binary; the subprotocol "echo" if offered)

    python3 _preview_app.py PORT
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
import sys
from urllib.parse import parse_qs, urlsplit

PATTERN = bytes(range(256)) * 4096  # 1 MiB
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
released = asyncio.Semaphore(0)


def pattern_bytes(n: int) -> bytes:
    """The first ``n`` bytes of what /bytes?n= sends (the tests hash it)."""
    whole, rest = divmod(n, len(PATTERN))
    return PATTERN * whole + PATTERN[:rest]


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if "chunked" in headers.get("transfer-encoding", ""):
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return bytes(body)
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    return b""


def head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def reply(w: asyncio.StreamWriter, status: int, body: bytes, ctype: str) -> None:
    w.write(head(status, {"content-type": ctype, "content-length": str(len(body))}) + body)
    await w.drain()


async def ws_echo(r: asyncio.StreamReader, w: asyncio.StreamWriter, hdrs: dict[str, str]) -> None:
    accept = base64.b64encode(hashlib.sha1(hdrs["sec-websocket-key"].encode() + WS_GUID).digest())
    extra = (
        {"sec-websocket-protocol": "echo"}
        if "echo" in hdrs.get("sec-websocket-protocol", "")
        else {}
    )
    w.write(
        head(
            101,
            {
                "upgrade": "websocket",
                "connection": "Upgrade",
                "sec-websocket-accept": accept.decode(),
                **extra,
            },
        )
    )
    while True:
        b0, b1 = await r.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await r.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await r.readexactly(8))
        mask = await r.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(n)))
        op = b0 & 0x0F
        if op == 8:
            w.write(b"\x88\x02" + (data[:2] or b"\x03\xe8"))
            await w.drain()
            return
        if op == 9:
            op = 10  # ping: pong
        elif op == 10:
            continue
        size = len(data)
        if size < 126:
            w.write(bytes([0x80 | op, size]) + data)
        elif size < 65536:
            w.write(bytes([0x80 | op, 126]) + struct.pack("!H", size) + data)
        else:
            w.write(bytes([0x80 | op, 127]) + struct.pack("!Q", size) + data)
        await w.drain()


class Request:
    def __init__(self, method: str, target: str, pairs: list[list[str]], body: bytes) -> None:
        self.method, self.pairs, self.body = method, pairs, body
        self.url = urlsplit(target)
        self.q = {k: v[0] for k, v in parse_qs(self.url.query, keep_blank_values=True).items()}


async def do_ping(w: asyncio.StreamWriter, req: Request) -> None:
    await reply(w, 200, b"pong", "text/plain")


async def do_echo(w: asyncio.StreamWriter, req: Request) -> None:
    data = {
        "method": req.method,
        "path": req.url.path,
        "query": req.url.query,
        "headers": req.pairs,
        "body_len": len(req.body),
    }
    await reply(w, 200, json.dumps(data).encode(), "application/json")


async def do_headers(w: asyncio.StreamWriter, req: Request) -> None:
    """Answers with the response headers the query names (``h=name:value``, repeated): what
    an app may put in its own responses."""
    extra = dict(v.split(":", 1) for v in parse_qs(req.url.query).get("h", []))
    w.write(head(200, {**extra, "content-type": "text/plain", "content-length": "3"}) + b"app")
    await w.drain()


async def do_bytes(w: asyncio.StreamWriter, req: Request) -> None:
    n = int(req.q.get("n", "0"))
    w.write(head(200, {"content-type": "application/octet-stream", "content-length": str(n)}))
    left = n
    while left:
        part = PATTERN[: min(left, len(PATTERN))]
        w.write(part)
        left -= len(part)
        await w.drain()


async def do_sse(w: asyncio.StreamWriter, req: Request) -> None:
    sse = {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
    w.write(head(200, {**sse, "cache-control": "no-cache"}))
    for k in range(int(req.q.get("n", "3"))):
        if k:
            await released.acquire()
        event = f"id: {k}\ndata: event {k}\n\n".encode()
        w.write(b"%x\r\n%b\r\n" % (len(event), event))
        await w.drain()
    w.write(b"0\r\n\r\n")


async def do_release(w: asyncio.StreamWriter, req: Request) -> None:
    released.release()
    await reply(w, 200, b"released", "text/plain")


async def do_poll(w: asyncio.StreamWriter, req: Request) -> None:
    await asyncio.sleep(float(req.q.get("hold", "1")))
    await reply(w, 200, b"polled", "text/plain")


async def do_upload(w: asyncio.StreamWriter, req: Request) -> None:
    digest = {"sha256": hashlib.sha256(req.body).hexdigest(), "length": len(req.body)}
    await reply(w, 200, json.dumps(digest).encode(), "application/json")


async def do_smuggle(w: asyncio.StreamWriter, req: Request) -> None:
    forged = head(200, {"content-type": "text/plain", "content-length": "6"}) + b"forged"
    w.write(head(200, {"content-type": "text/plain", "content-length": "2"}) + b"ok" + forged)
    await w.drain()


async def do_unframed(w: asyncio.StreamWriter, req: Request) -> None:
    w.write(b"HTTP/1.1 200 X\r\ncontent-type: text/plain\r\n\r\nuntil the end")
    await w.drain()
    w.close()


async def do_hangup(w: asyncio.StreamWriter, req: Request) -> None:
    w.close()


async def do_cut(w: asyncio.StreamWriter, req: Request) -> None:
    w.write(head(200, {"content-type": "text/plain", "content-length": "100"}) + b"0123456789")
    await w.drain()
    w.close()


ROUTES = {
    "/ping": do_ping,
    "/headers": do_headers,
    "/bytes": do_bytes,
    "/sse": do_sse,
    "/release": do_release,
    "/poll": do_poll,
    "/upload": do_upload,
    "/smuggle": do_smuggle,
    "/unframed": do_unframed,
    "/hangup": do_hangup,
    "/cut": do_cut,
}


async def serve_one(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
    """One request; False when the connection is done."""
    try:
        raw = await r.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    lines = raw.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    hdrs: dict[str, str] = {}
    pairs = []
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
            pairs.append([k.strip().lower(), v.strip()])
    req = Request(method, target, pairs, await read_body(r, hdrs))
    path = req.url.path
    if path == "/ws" and hdrs.get("upgrade", "").lower() == "websocket":
        await ws_echo(r, w, hdrs)
        return False
    route = ROUTES.get(path, do_echo if path.startswith("/echo") else None)
    if route is None:
        await reply(w, 404, b"no such page", "text/plain")
    else:
        await route(w, req)
    if w.is_closing():
        return False
    await w.drain()
    return hdrs.get("connection", "").lower() != "close"


async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while await serve_one(r, w):
            pass
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "0.0.0.0", port, limit=1 << 20)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
