"""A do-nothing TCP relay (uvloop protocols, no parsing, no checks): the least a userspace hop
between a client and an app adds on this machine. ``bench/preview.py`` measures it beside the
gateway, so the gateway's own cost shows apart from the extra hop's.

    python _relay.py LISTEN_PORT UPSTREAM_PORT
"""

from __future__ import annotations

import asyncio
import sys

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.port = upstream_port
        self.pending: list[bytes] = []
        self.upstream: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(
            lambda: _Upstream(self.transport),  # type: ignore[arg-type]
            "127.0.0.1",
            self.port,
        )
        self.upstream = upstream
        for data in self.pending:
            upstream.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def main(listen: int, upstream: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream), "127.0.0.1", listen)
    print(f"relaying {listen} -> {upstream}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
