"""HTTP exec round trip through the gateway next to the direct NATS exec round trip (the SDK),
measured in the same run on the same sandbox: p50/p99 and the gateway's overhead ratio.

    .venv/bin/python bench/gateway_exec.py [--calls 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from _gateway import gateway
from _platform import pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--calls", "10"]


async def direct(url: str, argv: list[str], calls: int) -> list[float]:
    sbx = await AsyncSandbox.connect("bench", nats_url=url)
    try:
        for _ in range(50):
            await sbx.exec(argv)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            r = await sbx.exec(argv)
            samples.append(time.perf_counter() - t0)
            assert r.exit_code == 0
        return samples
    finally:
        await sbx.close()


async def over_http(base: str, key: str, argv: list[str], calls: int) -> list[float]:
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as c:
        for _ in range(50):
            await c.post("/v1/sandboxes/bench/exec", json={"argv": argv})
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            r = await c.post("/v1/sandboxes/bench/exec", json={"argv": argv})
            samples.append(time.perf_counter() - t0)
            assert r.json()["exit_code"] == 0, r.text
        return samples


async def main(calls: int) -> None:
    with platform() as (url, _), gateway(url) as (base, key, _):
        for argv in (["true"], ["date"]):
            # Interleave halves so machine noise hits both paths alike.
            d1 = await direct(url, argv, calls // 2)
            h1 = await over_http(base, key, argv, calls // 2)
            d2 = await direct(url, argv, calls // 2)
            h2 = await over_http(base, key, argv, calls // 2)
            d, h = d1 + d2, h1 + h2
            print(summary(f"direct NATS exec {argv}", d))
            print(summary(f"HTTP via gateway exec {argv}", h))
            print(
                f"{'gateway overhead':38} p50 +{(pct(h, 50) - pct(d, 50)) * 1000:.3f} ms  "
                f"ratio p50 {pct(h, 50) / pct(d, 50):.2f}x  p99 {pct(h, 99) / pct(d, 99):.2f}x"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    asyncio.run(main(parser.parse_args().calls))
