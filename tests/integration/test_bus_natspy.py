"""nats-py without aiohttp: the bus imports nats with its WebSocket-only aiohttp import skipped,
yet ``ws://`` URLs still work (aiohttp is given back to nats-py before such a connection), and
code imported afterwards (kubernetes, anyone) still imports aiohttp normally.

Each check runs in a fresh interpreter: this test process may have imported aiohttp already.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import NatsServer, free_port

ROUND_TRIP = """
import asyncio, sys
import sandpod_bus
from sandpod_bus import Bus, BusSettings

assert "aiohttp" not in sys.modules, "importing the bus imported aiohttp"

async def main() -> None:
    bus = await Bus.connect(BusSettings(url=sys.argv[1], connect_timeout=10))
    async def echo(msg):
        await bus.publish(msg.reply, b"echo:" + msg.data)
    sub = await bus.subscribe("natspy.echo", echo)
    await bus.flush()
    print((await bus.request("natspy.echo", b"hi", 10)).decode())
    await sub.stop()
    await bus.drain()

asyncio.run(main())
print("aiohttp" in sys.modules)
"""


def run(code: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_tcp_connection_never_imports_aiohttp(nats: NatsServer) -> None:
    """Import, connect over nats://, round trip: aiohttp is never imported."""
    assert run(ROUND_TRIP, nats.url) == ["echo:hi", "False"]


def test_a_websocket_url_still_works(tmp_path: Path) -> None:
    """Over ws:// (nats-server's websocket listener) the same round trip works: nats-py gets the
    aiohttp it skipped at import."""
    ws_port = free_port()
    config = tmp_path / "ws.conf"
    config.write_text(f'websocket {{\n  listen: "127.0.0.1:{ws_port}"\n  no_tls: true\n}}\n')
    server = NatsServer(tmp_path / "js", config)
    server.start()
    try:
        assert run(ROUND_TRIP, f"ws://127.0.0.1:{ws_port}") == ["echo:hi", "True"]
    finally:
        server.stop()


def test_aiohttp_imports_normally_after_the_bus() -> None:
    """The import block is lifted once nats is loaded: a later `import aiohttp` succeeds, and
    nats-py keeps the real module when aiohttp came first."""
    after = "import sandpod_bus, aiohttp; print(aiohttp.ClientSession.__name__)"
    assert run(after) == ["ClientSession"]
    first = "import aiohttp, sandpod_bus, nats.aio.transport as t; print(t.aiohttp is aiohttp)"
    assert run(first) == ["True"]
