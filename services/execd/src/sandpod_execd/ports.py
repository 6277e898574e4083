"""Is a port on the sandbox's loopback ready? (the ``proc.wait_port`` domain logic, no NATS).

The check runs inside execd, i.e. from inside the sandbox's network, so it sees servers bound to
127.0.0.1 that no client outside could reach. ``tcp``: a connection succeeds on 127.0.0.1 or
::1. ``http``: additionally ``GET <path>`` answers with a status in 200..399 (HTTP/1.0, so the
server closes the connection; only the status line is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable

__all__ = ["PortCheck", "check_port", "wait_port"]

HOSTS = ("127.0.0.1", "::1")
ATTEMPT_TIMEOUT = 2.0  # seconds for one connection (and, for http, its status line)
INTERVAL = 0.1  # seconds between attempts


@dataclasses.dataclass(frozen=True, slots=True)
class PortCheck:
    ready: bool
    status_code: int | None = None
    reason: str | None = None


async def _http_status(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, path: str
) -> int:
    writer.write(f"GET {path} HTTP/1.0\r\nHost: localhost:{port}\r\n\r\n".encode())
    await writer.drain()
    line = await reader.readline()
    parts = line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {line[:60]!r}")
    return int(parts[1])


async def _attempt(host: str, port: int, kind: str, path: str) -> PortCheck:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if kind == "tcp":
            return PortCheck(ready=True)
        status = await _http_status(reader, writer, port, path)
        if 200 <= status < 400:
            return PortCheck(ready=True, status_code=status)
        return PortCheck(ready=False, status_code=status, reason=f"HTTP status {status}")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def check_port(port: int, kind: str = "tcp", path: str = "/") -> PortCheck:
    """One check on each loopback address; ready if either is."""
    last = PortCheck(ready=False, reason="not checked")
    for host in HOSTS:
        try:
            result = await asyncio.wait_for(_attempt(host, port, kind, path), ATTEMPT_TIMEOUT)
        except TimeoutError:
            result = PortCheck(ready=False, reason="timed out")
        except ConnectionRefusedError:
            result = PortCheck(ready=False, reason="connection refused")
        except (OSError, ValueError) as exc:
            result = PortCheck(ready=False, reason=f"{type(exc).__name__}: {exc}"[:200])
        if result.ready:
            return result
        # Prefer the more informative failure (an HTTP status over a refused connection).
        if last.status_code is None:
            last = result
    return last


async def wait_port(
    port: int, kind: str, path: str, wait: float, stop: Callable[[], bool]
) -> PortCheck:
    """Check until ready, ``wait`` seconds passed, or ``stop()`` is true (the process exited)."""
    deadline = time.monotonic() + wait
    while True:
        result = await check_port(port, kind, path)
        if result.ready or stop() or time.monotonic() + INTERVAL > deadline:
            return result
        await asyncio.sleep(INTERVAL)
