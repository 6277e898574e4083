"""1 GiB up and down through the gateway: throughput, matching SHA-256, and the gateway's peak
RSS (it streams: memory stays flat whatever the size). Floor in the same run: the same bytes
through the SDK's streamed file API (direct NATS).

    .venv/bin/python bench/gateway_transfer.py [--mib 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from _gateway import gateway
from _platform import platform
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--mib", "1"]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def body(size: int, digest: hashlib._Hash) -> AsyncIterator[bytes]:
    block = os.urandom(1 << 20)
    sent = 0
    while sent < size:
        piece = block[: min(len(block), size - sent)]
        digest.update(piece)
        sent += len(piece)
        yield piece


async def main(mib: int) -> None:
    size = mib << 20
    with platform() as (url, _), gateway(url) as (base, key, proc):
        async with httpx.AsyncClient(
            base_url=base, timeout=600, headers={"authorization": f"Bearer {key}"}
        ) as c:
            up = hashlib.sha256()
            t0 = time.perf_counter()
            r = await c.put(
                "/v1/sandboxes/bench/files/content",
                params={"path": "big.bin"},
                content=body(size, up),
            )
            t_up = time.perf_counter() - t0
            assert r.status_code == 201, r.text
            down = hashlib.sha256()
            t0 = time.perf_counter()
            async with c.stream(
                "GET", "/v1/sandboxes/bench/files/content", params={"path": "big.bin"}
            ) as resp:
                async for chunk in resp.aiter_bytes():
                    down.update(chunk)
            t_down = time.perf_counter() - t0
        assert up.hexdigest() == down.hexdigest(), "hash mismatch"
        sbx = await AsyncSandbox.connect("bench", nats_url=url)
        try:
            t0 = time.perf_counter()
            async with sbx.fs.read_stream("big.bin") as reader:
                async for _ in reader:
                    pass
            t_floor = time.perf_counter() - t0
        finally:
            await sbx.close()
        print(f"upload   {mib} MiB via gateway: {mib / t_up:8.1f} MiB/s")
        print(
            f"download {mib} MiB via gateway: {mib / t_down:8.1f} MiB/s "
            f"(floor: SDK direct read {mib / t_floor:8.1f} MiB/s, "
            f"ratio {t_down / t_floor:.2f}x)"
        )
        peak = peak_rss_mib(proc.pid)
        print(f"sha256 match: {up.hexdigest()[:16]}…  gateway peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    asyncio.run(main(parser.parse_args().mib))
