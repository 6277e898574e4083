"""Attack: 60 WebSocket execs that produce output as fast as they can and are never read. The
memory they pin in the gateway and in execd is bounded by their flow-control windows, and it is
given back when the sockets close (measured: RSS of both processes, with psutil).

Before the fix every unread stream held execd's default 4 MiB window in both processes (the
gateway asked for no window of its own), so 60 of them grew the gateway by ~330 MB and execd by
~220 MB, and the RSS stayed there after they closed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import psutil
from gateway_harness import GatewayProcess, gateway_procs, unique_tenant  # noqa: F401
from websockets.asyncio.client import ClientConnection, connect

from conftest import Execd, NatsServer
from sandpod_bus import Bus, BusSettings
from sandpod_gateway.keys import KeyStore
from sandpod_gateway.settings import GatewaySettings

__all__: list[str] = []

STREAMS = 60
MiB = 1024 * 1024
WINDOW = 256 * 1024  # SANDPOD_GATEWAY_STREAM_WINDOW's default
# Generous: 4 windows per stream (the window in execd's retained frames, in the gateway's
# subscription queue, in its socket buffer and in transit) plus a fixed 64 MiB for allocator
# slack. Before the fix the gateway grew by ~330 MB here (60 x 4 MiB windows).
BOUND = STREAMS * 4 * WINDOW + 64 * MiB
RETURNED = 24 * MiB  # after close: back within this of the idle baseline


def _rss(proc: psutil.Process) -> int:
    return int(proc.memory_info().rss)


async def _settled(procs: list[psutil.Process], deadline: float) -> list[int]:
    """RSS of ``procs`` once neither grew by more than 2 MiB over 1 s (or at the deadline)."""
    last = [_rss(p) for p in procs]
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)  # the sampling interval of a measurement, not a sync
        now = [_rss(p) for p in procs]
        if all(n - prev < 2 * MiB for n, prev in zip(now, last, strict=True)):
            return now
        last = now
    return last


async def _wait_below(procs: list[psutil.Process], limits: list[int], timeout: float) -> list[int]:
    """Poll until every process's RSS is at or below its limit; the last sample."""
    deadline = time.monotonic() + timeout
    while True:
        now = [_rss(p) for p in procs]
        if all(n <= lim for n, lim in zip(now, limits, strict=True)) or (
            time.monotonic() > deadline
        ):
            return now
        await asyncio.sleep(0.25)


async def _open(url: str, key: str) -> ClientConnection:
    ws = await connect(
        url, additional_headers={"authorization": f"Bearer {key}"}, max_queue=1, max_size=8 * MiB
    )
    await ws.send(json.dumps({"shell": "exec yes 0123456789abcdef0123456789abcdef"}))
    while True:  # read only up to "started": the output is never read
        msg = await ws.recv()
        if isinstance(msg, str) and json.loads(msg)["type"] == "started":
            return ws
        if isinstance(msg, str) and json.loads(msg)["type"] == "error":
            raise AssertionError(f"the exec did not start: {msg}")


async def test_unread_ws_execs_are_bounded_and_returned(
    nats: NatsServer,
    start_execd: Callable[..., Execd],
    gateway_procs: Callable[..., GatewayProcess],
) -> None:
    tenant = unique_tenant()
    execd = start_execd(sandbox_id=f"{tenant}--box")
    gw = gateway_procs()
    bus = await Bus.connect(BusSettings(url=nats.url))
    try:
        key, _ = await (await KeyStore.open(bus, GatewaySettings().bucket_base)).create(tenant)
    finally:
        await bus.drain()
    procs = [psutil.Process(gw.proc.pid), psutil.Process(execd.proc.pid)]
    url = gw.url.replace("http://", "ws://") + "/v1/sandboxes/box/exec/ws"

    warm = await _open(url, key)  # one stream first: imports, pools and buffers exist
    await warm.close()
    before = await _settled(procs, time.monotonic() + 15)

    sockets = [await _open(url, key) for _ in range(STREAMS)]
    try:
        during = await _settled(procs, time.monotonic() + 60)
        growth = [d - b for d, b in zip(during, before, strict=True)]
        print(
            f"rss before {[b // MiB for b in before]} MiB, with {STREAMS} unread streams "
            f"{[d // MiB for d in during]} MiB"
        )
        assert growth[0] < BOUND, (
            f"gateway grew by {growth[0] / MiB:.0f} MiB (bound {BOUND / MiB:.0f})"
        )
        assert growth[1] < BOUND, (
            f"execd grew by {growth[1] / MiB:.0f} MiB (bound {BOUND / MiB:.0f})"
        )
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))

    limits = [b + RETURNED for b in before]
    after = await _wait_below(procs, limits, 60)
    print(f"rss after close {[a // MiB for a in after]} MiB")
    assert after[0] <= limits[0], (
        f"gateway kept {(after[0] - before[0]) / MiB:.0f} MiB after the streams closed "
        f"(peak +{growth[0] / MiB:.0f})"
    )
    assert after[1] <= limits[1], (
        f"execd kept {(after[1] - before[1]) / MiB:.0f} MiB after the streams closed "
        f"(peak +{growth[1] / MiB:.0f})"
    )

    # nothing else harmed: the same tenant's next stream works end to end
    async with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
        await ws.send(json.dumps({"shell": "echo still-fine"}))
        seen = b""
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                seen += msg[1:]
            elif json.loads(msg)["type"] == "exit":
                break
    assert seen == b"still-fine\n"
