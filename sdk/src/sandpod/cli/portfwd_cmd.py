"""``sandpod port-forward SBX [LOCAL:]REMOTE...`` and ``sandpod expose SBX PORT``.

port-forward works like kubectl's: it listens on ``--address`` (127.0.0.1) port LOCAL (``:REMOTE``
or LOCAL 0 picks a free one; the line ``Forwarding from 127.0.0.1:L -> R`` says which) and relays
each accepted TCP connection to port REMOTE of the sandbox. The bytes go through the gateway, one
WebSocket per connection (``/v1/sandboxes/{sbx}/port-forward/{port}``, authenticated by the API
key), not over NATS: the gateway already reaches sandbox addresses (Pod IPs in Kubernetes mode,
where a laptop does not), enforces the tenant's key, and the data path is the same as the preview
URLs' (measured in bench/preview.py). When the local client half-closes, the sandbox side is
half-closed too (the ``eof`` text frame), so request/response protocols that read to EOF work.

expose prints a preview URL: a signed link (``--ttl``), or ``--public`` (``--private`` undoes it).
Gateway and key: ``--gateway``/``$SANDPOD_GATEWAY_URL`` and ``$SANDPOD_API_KEY``, else the ones a
local ``sandpod up`` wrote in its state dir.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from sandpod.cli.sandbox_cmd import EXIT_ERROR
from sandpod.errors import BadRequest, SandpodError
from sandpod.preview import GatewayAccess, create_preview, remove_preview, resolve_gateway

__all__ = ["add_parsers", "parse_ports"]

MAX_CONNECTIONS = 256  # concurrent forwarded connections per command (more wait in accept)
CHUNK = 256 * 1024
EOF_FRAME = "eof"  # the gateway's half-close frame (sandpod_gateway.wsrelay.EOF_FRAME)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("port-forward", help="forward local ports to a sandbox's ports")
    p.add_argument("sandbox", help="the sandbox (your name for it, or its id)")
    p.add_argument("ports", nargs="+", metavar="[LOCAL:]REMOTE", help="e.g. 8000 or 9000:8000")
    p.add_argument("--address", default="127.0.0.1", help="local address (default 127.0.0.1)")
    p.add_argument("--gateway", help="gateway URL (default $SANDPOD_GATEWAY_URL, sandpod up's)")
    p.set_defaults(run=_forward_cmd)
    e = sub.add_parser("expose", help="a preview URL of a sandbox's port")
    e.add_argument("sandbox")
    e.add_argument("port", type=int)
    how = e.add_mutually_exclusive_group()
    how.add_argument("--public", action="store_true", help="anyone may open it (until --private)")
    how.add_argument("--private", action="store_true", help="make the port private again")
    e.add_argument("--ttl", type=float, help="seconds a signed link is valid (gateway default)")
    e.add_argument("--gateway", help="gateway URL (default $SANDPOD_GATEWAY_URL, sandpod up's)")
    e.set_defaults(run=_expose_cmd)


def parse_ports(specs: list[str]) -> list[tuple[int, int]]:
    """``["8000", "9000:8000", ":3000"]`` -> ``[(8000, 8000), (9000, 8000), (0, 3000)]``.

    Raises:
        BadRequest: a spec that is not ``[LOCAL:]REMOTE`` with ports in range.
    """
    out = []
    for spec in specs:
        local, sep, remote = spec.rpartition(":")
        if not sep:
            local = remote
        try:
            pair = (int(local or 0), int(remote))
        except ValueError:
            raise BadRequest(f"{spec!r}: give [LOCAL:]REMOTE, e.g. 8000 or 9000:8000") from None
        if not (0 <= pair[0] < 65536 and 0 < pair[1] < 65536):
            raise BadRequest(f"{spec!r}: ports are 1..65535 (LOCAL 0: any free port)")
        out.append(pair)
    return out


def _forward_cmd(a: argparse.Namespace) -> int:
    try:
        pairs = parse_ports(a.ports)
        gw = resolve_gateway(a.gateway)
        asyncio.run(_forward(gw, a.sandbox, pairs, a.address))
    except (SandpodError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _expose_cmd(a: argparse.Namespace) -> int:
    try:
        gw = resolve_gateway(a.gateway)
        if a.private:
            asyncio.run(remove_preview(gw, a.sandbox, a.port))
            print(f"port {a.port} of {a.sandbox} is private")
            return 0
        preview = asyncio.run(create_preview(gw, a.sandbox, a.port, public=a.public, ttl=a.ttl))
    except SandpodError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(preview.url)
    if preview.host_url:
        print(preview.host_url)
    return 0


async def _forward(
    gw: GatewayAccess, sandbox: str, pairs: list[tuple[int, int]], host: str
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    limit = asyncio.Semaphore(MAX_CONNECTIONS)
    active: set[asyncio.Task[Any]] = set()  # the relays, owned here: cancelled on stop

    def on_connect(remote: int) -> Any:
        async def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is None:  # never: the server runs each callback as a task
                return
            active.add(task)
            try:
                async with limit:
                    await _relay(gw, sandbox, remote, r, w)
            finally:
                active.discard(task)

        return accepted

    servers = []
    try:
        for local, remote in pairs:
            server = await asyncio.start_server(on_connect(remote), host, local)
            servers.append(server)
            bound = server.sockets[0].getsockname()[1]
            print(f"Forwarding from {host}:{bound} -> {remote}", flush=True)
        await stop.wait()
    finally:
        for server in servers:
            server.close()
        for task in list(active):
            task.cancel()
        await asyncio.gather(*active, return_exceptions=True)


async def _relay(
    gw: GatewayAccess, sandbox: str, port: int, r: asyncio.StreamReader, w: asyncio.StreamWriter
) -> None:
    """One local connection <-> one port-forward WebSocket; errors end only this connection."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    url = gw.url.replace("http", "ws", 1) + f"/v1/sandboxes/{sandbox}/port-forward/{port}"
    try:
        async with connect(
            url,
            additional_headers={"authorization": f"Bearer {gw.api_key}"},
            max_size=None,
            compression=None,
            proxy=None,
        ) as ws:

            async def up() -> None:
                while data := await r.read(CHUNK):
                    await ws.send(data)
                await ws.send(EOF_FRAME)  # the local client half-closed

            async def down() -> None:
                async for data in ws:
                    if isinstance(data, bytes):
                        w.write(data)
                        await w.drain()

            uploader = asyncio.ensure_future(up())
            try:
                await down()
            finally:
                uploader.cancel()
                await asyncio.gather(uploader, return_exceptions=True)
    except InvalidStatus as exc:
        print(f"port-forward {port}: the gateway refused ({exc})", file=sys.stderr, flush=True)
    except (OSError, ConnectionClosed) as exc:
        print(f"port-forward {port}: {exc}", file=sys.stderr, flush=True)
    finally:
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()
