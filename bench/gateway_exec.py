"""HTTP exec round trip through the gateway next to the direct NATS exec round trip (the SDK),
measured in the same run on the same sandbox: p50/p99 and the gateway's overhead ratio.

The HTTP side is measured with a lean keep-alive HTTP/1.1 client (``_http1``), so the ratio is
the gateway's (target: p50 at most 1.5x the direct exec); the same calls through httpx are
printed too, as what a Python caller using httpx sees (httpx's own cost included).

    .venv/bin/python bench/gateway_exec.py [--calls 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from _gateway import gateway
from _http1 import Http1
from _platform import pct, platform, summary
from sandpod import AsyncSandbox

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--calls", "10"]
WARMUP = 50
Call = Callable[[], Awaitable[None]]


async def _interleaved(paths: list[Call], calls: int) -> list[list[float]]:
    """Each path's latencies, one call of every path per round (the order rotating each round),
    so load that comes and goes on a shared machine hits every path alike."""
    for call in paths:
        for _ in range(min(WARMUP, calls)):
            await call()
    samples: list[list[float]] = [[] for _ in paths]
    for i in range(calls):
        for k in range(len(paths)):
            j = (i + k) % len(paths)
            t0 = time.perf_counter()
            await paths[j]()
            samples[j].append(time.perf_counter() - t0)
    return samples


def _ratio(name: str, h: list[float], d: list[float]) -> str:
    return (
        f"{name:38} p50 +{(pct(h, 50) - pct(d, 50)) * 1000:.3f} ms  "
        f"ratio p50 {pct(h, 50) / pct(d, 50):.2f}x  p99 {pct(h, 99) / pct(d, 99):.2f}x"
    )


async def main(calls: int) -> None:
    with platform() as (url, _), gateway(url) as (base, key, _):
        sbx = await AsyncSandbox.connect("bench", nats_url=url)
        headers = {"authorization": f"Bearer {key}"}
        async with (
            Http1(base, key) as lean,
            httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as hx,
        ):
            for argv in (["true"], ["date"]):

                async def direct(argv: list[str] = argv) -> None:
                    assert (await sbx.exec(argv)).exit_code == 0

                async def http(argv: list[str] = argv) -> None:
                    status, body = await lean.post_json("/v1/sandboxes/bench/exec", {"argv": argv})
                    assert status == 200 and body["exit_code"] == 0, body

                async def via_httpx(argv: list[str] = argv) -> None:
                    r = await hx.post("/v1/sandboxes/bench/exec", json={"argv": argv})
                    assert r.json()["exit_code"] == 0, r.text

                d, h, x = await _interleaved([direct, http, via_httpx], calls)
                print(summary(f"direct NATS exec {argv} (floor)", d))
                print(summary(f"HTTP via gateway exec {argv}", h))
                print(summary(f"  the same through httpx {argv}", x))
                print(_ratio("gateway overhead", h, d))
                print(_ratio("  with httpx's own cost", x, d))
        await sbx.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    asyncio.run(main(parser.parse_args().calls))
